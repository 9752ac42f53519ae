"""modelcast host agent: reliable chunked multicast transfer of model files.

In-process use: ``hostagent.send(path, SendOptions(...))`` and
``hostagent.receive(out, ReceiveOptions(...))`` (see ``hostagent.api``); the CLI
``modelcast send|recv`` is a thin shell over the same two calls. A model in parts
(selective distribution): ``send_parts`` / ``receive_parts`` (``hostagent.parts``). An
always-on server and a fetch by model id: ``hostagent.serve.serve`` / ``fetch``.

The names above load with their modules on first use (``__getattr__`` below), so
importing one module of the package -- ``modelcast recv`` imports the CLI -- does not
load the others.
"""

from __future__ import annotations

from typing import Any

# What this package exports, by module: loaded on first use (PEP 562), so that
# ``modelcast recv`` does not pay for the server's and the parts' modules at start-up
# (every agent process's CPU counts against its transfer).
_EXPORTS = {
    "hostagent.api": (
        "ControllerError", "GroupAssigned", "GroupJoined", "HookResult", "LeaveFailed", "MetricsServing",
        "ReceiveOptions", "ReceiveProgress", "ReceiveResult", "ReceiveStarted", "ReceiverReport", "SendOptions",
        "SendProgress", "SendResult", "SendStarted", "TransferError", "Unauthenticated", "receive", "send",
    ),
    "hostagent.parts": ("PartReport", "PartsResult", "describe_parts", "receive_parts", "send_parts"),
    # (not serve: the name is the module hostagent.serve)
    "hostagent.serve": ("RoundSettings", "ServeOptions", "fetch"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    """An exported name, from its module (imported now if it was not yet)."""
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'hostagent' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
