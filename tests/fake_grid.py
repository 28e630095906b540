"""Flower's Grid push/pull interface for fake grids in unit tests: a subclass says how the
nodes answer a batch of messages (``answer``); replies are tied to the messages they answer
(message ids given at push, ``reply_to_message_id`` set when a fake reply lacks it)."""

from __future__ import annotations

import itertools

from fedvls_flwr.ops.flower_internals import set_message_id


class FakeGridBase:
    _ids = itertools.count()

    def __init__(self, nodes):
        self.nodes = list(nodes)
        self._pending: list = []

    def get_node_ids(self):
        return list(self.nodes)

    def answer(self, messages: list) -> list:
        raise NotImplementedError

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            set_message_id(m, f"m{next(self._ids)}")
        self._pending += messages
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids):
        pending, self._pending = [m for m in self._pending if m.metadata.message_id in message_ids], []
        replies = self.answer(pending) if pending else []
        by_node = {m.metadata.dst_node_id: m.metadata.message_id for m in pending}
        ids = {m.metadata.message_id for m in pending}
        for r in replies:
            if r.metadata.reply_to_message_id not in ids and r.metadata.src_node_id in by_node:
                r.metadata.__dict__["_reply_to_message_id"] = by_node[r.metadata.src_node_id]
        return replies
