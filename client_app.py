"""Flower ClientApp entry point (thin): one local training round per message."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedvls_flwr.client import train_round

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(content=train_round(msg.content, dict(context.node_config)), reply_to=msg)
