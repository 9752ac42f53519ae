"""modelcast host agent: reliable chunked multicast transfer of model files.

In-process use: ``hostagent.send(path, SendOptions(...))`` and
``hostagent.receive(out, ReceiveOptions(...))`` (see ``hostagent.api``); the CLI
``modelcast send|recv`` is a thin shell over the same two calls. A model in parts
(selective distribution): ``send_parts`` / ``receive_parts`` (``hostagent.parts``).

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

__all__ = [
    "ControllerError", "GroupAssigned", "GroupJoined", "HookResult", "LeaveFailed", "MetricsServing",
    "ReceiveOptions", "ReceiveProgress", "ReceiveResult", "ReceiveStarted", "ReceiverReport", "SendOptions",
    "SendProgress", "SendResult", "SendStarted", "TransferError", "Unauthenticated", "receive", "send",
    "PartReport", "PartsResult", "describe_parts", "receive_parts", "send_parts",
]
