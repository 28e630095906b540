"""Flower ClientApp entry point (thin): one local training round, or one evaluation, per message."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedvls_flwr.client import evaluate_round, train_round
from fedvls_flwr.supernode_guard import exit_with_supernode

app = ClientApp()
exit_with_supernode()  # deployment: stop training for a SuperNode that was killed


@app.train()
def train(msg: Message, context: Context) -> Message:
    return Message(content=train_round(msg.content, dict(context.node_config)), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return Message(content=evaluate_round(msg.content, dict(context.node_config)), reply_to=msg)
