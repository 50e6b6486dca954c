"""An in-process Flower Grid: each message runs a ClientApp synchronously (no Ray, no SuperLink), so that the
ServerApp's strategy loop can be tested in a second."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message, Metadata, RecordDict
from flwr.app.message.message import make_message
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from onnxtrain.federated._flower import from_record


class LocalGrid(Grid):
    """Nodes 100, 101, ... with the given node configs; ``apps`` maps a node id to another ClientApp.
    An exception of a ClientApp becomes an error reply, as Flower's runtimes do."""

    def __init__(self, client_app: Callable, node_configs: list[dict], run_config: dict | None = None,
                 apps: dict | None = None):
        self.client_app, self.apps, self.run_config = client_app, apps or {}, run_config or {}
        self.nodes = {100 + i: config for i, config in enumerate(node_configs)}
        self.sent: list[dict] = []   # every successful training reply, decoded before any strategy touches it

    def __enter__(self) -> LocalGrid:
        # Message() takes its source from the task identity that Flower's runtimes set for the ServerApp.
        self._saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        return self

    def __exit__(self, *exc) -> None:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = self._saved

    def set_run(self, run_id: int) -> None:
        pass

    @property
    def run(self):
        return None

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.nodes)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for sent in messages:
            node = sent.metadata.dst_node_id
            metadata = Metadata(run_id=1, message_id=f"m{time.monotonic_ns()}", src_node_id=0, dst_node_id=node,
                                reply_to_message_id="", group_id="1", created_at=time.time(), ttl=60.0,
                                message_type=sent.metadata.message_type)
            msg = make_message(metadata, sent.content)
            context = Context(run_id=1, node_id=node, node_config=self.nodes[node], state=RecordDict(),
                              run_config=self.run_config)
            try:
                reply = self.apps.get(node, self.client_app)(msg, context)
            except Exception as exc:
                reply = Message(Error(code=2, reason=f"{type(exc)}:<'{exc}'>"), reply_to=msg)
            if sent.metadata.message_type == "train" and not reply.has_error():
                self.sent.append({"node": node, "arrays": from_record(reply.content["arrays"]),
                                  "metrics": dict(reply.content["metrics"])})
            replies.append(reply)
        return replies
