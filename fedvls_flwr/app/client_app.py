"""The Flower ClientApp (thin): per message, one local training round, one evaluation, or a
query (the node's partition id).

Flower loads it as ``client_app:app`` from the top-level ``client_app.py`` of the app folder,
which only re-exports it (see :mod:`fedvls_flwr.app.server_app`)."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedvls_flwr.app.client import evaluate_round, naming_the_site, query_round, train_round
from fedvls_flwr.app.known_warnings import hide_rays_accelerator_tip, quiet_in_ray_actors
from fedvls_flwr.app.memory import keep_freed_memory
from fedvls_flwr.app.supernode_guard import guard_supernode

hide_rays_accelerator_tip()  # in simulation Flower loads this module before it starts Ray
quiet_in_ray_actors()  # a simulation's actor: no line after the run's last (module docstring there)
keep_freed_memory()  # a reply's large buffers reused, not faulted in again (app/memory.py)

app = ClientApp(mods=[guard_supernode])  # deployment: stop training for a SuperNode that was killed


@app.train()
def train(msg: Message, context: Context) -> Message:
    with naming_the_site(dict(context.node_config)):
        return Message(content=train_round(msg.content, dict(context.node_config), context.state,
                                           run_id=context.run_id), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    with naming_the_site(dict(context.node_config)):
        return Message(content=evaluate_round(msg.content, dict(context.node_config), run_id=context.run_id), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    return Message(content=query_round(msg.content, dict(context.node_config), run_id=context.run_id), reply_to=msg)
