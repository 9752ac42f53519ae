"""``--trace FILE`` (``settings.trace_file``): one line per OpenFlow message of a plan,
barrier reply, PortStatus and audit, with the wall-clock time, to lay against a
receiver's capture of a stream. Off by default; a debugging aid for the order of a move.

It owns the trace file and the one-line decoding of a plan's messages. It must not
decide anything: tracing never changes what is sent, and a message it cannot decode is
named, not raised.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import IO, Any

from ryu.ofproto import ofproto_v1_3 as ofp
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller.reconnect import normalise_actions

log = logging.getLogger("modelcast.tracing")
_FILE: IO[str] | None = None


def start(path: Path | None) -> None:
    """Append to ``path`` from now on (once per process; None: no tracing)."""
    global _FILE
    if path is not None and _FILE is None:
        _FILE = open(path, "a", buffering=1)
        log.info("tracing plans, barriers and port changes to %s", path)


def enabled() -> bool:
    """Whether lines are written (callers skip decoding a message when not)."""
    return _FILE is not None


def trace(what: str, *args: Any) -> None:
    if _FILE is not None:
        _FILE.write(f"{time.time():.4f} {what % args if args else what}\n")


def describe(msg: Any) -> str:
    """One line for a plan's message (tracing only: decodes it)."""
    try:
        if isinstance(msg, parser.OFPGroupMod):
            cmd = {ofp.OFPGC_ADD: "add", ofp.OFPGC_MODIFY: "mod", ofp.OFPGC_DELETE: "del"}.get(msg.command)
            kind = {ofp.OFPGT_ALL: "all", ofp.OFPGT_FF: "ff"}.get(msg.type, msg.type)
            bks = ["w%s:%s" % (b.watch_port if b.watch_port != ofp.OFPP_ANY else "-",
                               ",".join(map(str, normalise_actions(b.actions)))) for b in msg.buckets or ()]
            return f"group-{cmd} {kind} {msg.group_id:#x} [{' | '.join(bks)}]"
        if isinstance(msg, parser.OFPFlowMod):
            cmd = {ofp.OFPFC_ADD: "add", ofp.OFPFC_DELETE: "del", ofp.OFPFC_DELETE_STRICT: "del-strict",
                   ofp.OFPFC_MODIFY: "mod"}.get(msg.command, msg.command)
            acts = [a for i in (msg.instructions or ()) for a in getattr(i, "actions", ())]
            return (f"flow-{cmd} t{msg.table_id} p{msg.priority} ck={msg.cookie:#x} "
                    f"{dict(msg.match.items())} -> {normalise_actions(acts)}")
    except Exception as exc:  # tracing must never break a plan
        return f"{type(msg).__name__} ({exc})"
    return type(msg).__name__
