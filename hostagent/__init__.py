"""modelcast host agent: reliable chunked multicast transfer of model files.

In-process use: ``hostagent.send(path, SendOptions(...))`` and
``hostagent.receive(out, ReceiveOptions(...))`` (see ``hostagent.api``); the CLI
``modelcast send|recv`` is a thin shell over the same two calls. A model in parts
(selective distribution): ``send_parts`` / ``receive_parts`` (``hostagent.parts``). An
always-on server and a fetch by model id: ``hostagent.serve.serve`` / ``fetch``.

Because this package imports the API, its modules never ``from . import x`` (that
imports the package, round a cycle): they import ``from .x import name`` or
``import hostagent.x as x``.
"""

from .api import (
    ControllerError, GroupAssigned, GroupJoined, HookResult, LeaveFailed, MetricsServing, ReceiveOptions,
    ReceiveProgress, ReceiveResult, ReceiveStarted, ReceiverReport, SendOptions, SendProgress, SendResult,
    SendStarted, TransferError, Unauthenticated, receive, send,
)
from .parts import PartReport, PartsResult, describe_parts, receive_parts, send_parts
from .serve import RoundSettings, ServeOptions, fetch  # (not serve: the name is the module hostagent.serve)

__all__ = [
    "ControllerError", "GroupAssigned", "GroupJoined", "HookResult", "LeaveFailed", "MetricsServing",
    "ReceiveOptions", "ReceiveProgress", "ReceiveResult", "ReceiveStarted", "ReceiverReport", "SendOptions",
    "SendProgress", "SendResult", "SendStarted", "TransferError", "Unauthenticated", "receive", "send",
    "PartReport", "PartsResult", "describe_parts", "receive_parts", "send_parts",
    "RoundSettings", "ServeOptions", "fetch",
]
