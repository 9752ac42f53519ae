"""``modelcast trace MODEL_OR_GROUP``: a group's tree as the controller traces it
(``GET /v1/groups/{id}/trace``), printed as an indented tree, each hop with its live
packet counters and, with ``--watch``, how fast they rise; each receiver with its state
and why it waits. An operator sees the hop where a count stops rising.

It owns the rendering and the command; it must not change anything at the controller
(it only reads).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Optional

Hops = dict[tuple, dict[str, Any]]  # a hop's path (switches from the root, out port) -> the hop


def _packets(hop: dict[str, Any], what: str) -> Optional[int]:
    counts = (hop.get("counters") or {}).get(what)
    return counts.get("packets") if counts else None


def _rate(now: Optional[int], before: Optional[int], seconds: float) -> str:
    if now is None or before is None or seconds <= 0:
        return ""
    return f" (+{max(0, now - before) / seconds:,.0f}/s)"


def _key(path: list[dict[str, Any]], i: int) -> tuple:
    return tuple((h["dpid"], h["out_port"]) for h in path[:i + 1])


def render(trace: dict[str, Any], before: Optional[dict[str, Any]] = None, seconds: float = 0.0) -> str:
    """The trace as text; given the previous trace and the seconds between the two, each
    counter with its rate."""
    old: Hops = {}
    for r in (before or {}).get("receivers", []):
        for i, hop in enumerate(r["hops"]):
            old[_key(r["hops"], i)] = hop
    lines = [f"group {trace['group']}  {trace['model']}  {trace['source']} -> "
             f"{trace['address']}:{trace['port']}  {trace['state']}"]
    # the receivers' paths merged into one tree: a switch once, its ports below it
    children: dict[tuple, list[tuple]] = {}
    hops: Hops = {}
    leaves: dict[tuple, dict[str, Any]] = {}
    for r in trace["receivers"]:
        path = r["hops"]
        for i, hop in enumerate(path):
            key = _key(path, i)
            parent = _key(path, i - 1) if i else ()
            if key not in hops:
                hops[key] = hop
                children.setdefault(parent, []).append(key)
        if path:
            leaves[_key(path, len(path) - 1)] = r
    shown_switches: set[tuple] = set()

    def walk(parent: tuple, depth: int) -> None:
        for key in children.get(parent, []):
            hop = hops[key]
            indent = "  " * depth
            switch_key = key[:-1] + ((hop["dpid"], None),)
            if switch_key not in shown_switches:  # (a switch's line once, then each port it copies to)
                shown_switches.add(switch_key)
                was = old.get(key, {})
                flow = _packets(hop, "flow")
                state = "" if hop.get("held", True) else "  NOT HELD"
                err = (hop.get("counters") or {}).get("error")
                lines.append(f"{indent}s{hop['dpid']}  in port {hop['in_port']}  flow "
                             f"{_fmt(flow)}{_rate(flow, _packets(was, 'flow'), seconds)}  group "
                             f"{_fmt(_packets(hop, 'group'))}{state}{f'  ({err})' if err else ''}")
            bucket = _packets(hop, "bucket")
            down = "" if hop.get("port_up", True) else "  PORT DOWN"
            nxt = hop["next"]
            target = f"s{nxt}" if isinstance(nxt, int) else nxt
            line = (f"{indent}  port {hop['out_port']} -> {target}  bucket {_fmt(bucket)}"
                    f"{_rate(bucket, _packets(old.get(key, {}), 'bucket'), seconds)}{down}")
            if key in leaves:
                r = leaves[key]
                line += f"  [{r['state']}]" + (f"  {r['why']}" if r.get("why") else "")
            lines.append(line)
            walk(key, depth + 2)

    walk((), 1)
    for r in trace["receivers"]:
        if not r["hops"]:
            lines.append(f"  {r['ip']}  [{r['state']}]  {r.get('why') or ''}".rstrip())
    if not trace.get("counters"):
        lines.append("  (no live counters: the controller cannot read the switches)")
    return "\n".join(lines)


def _fmt(n: Optional[int]) -> str:
    return "-" if n is None else f"{n:,}"


def find_group(client: Any, what: str) -> int:
    """A group id, or the one group of a model (an error naming them when several)."""
    if what.isdigit():
        return int(what)
    groups = client.list_groups(what)
    if not groups:
        raise ValueError(f"no group of model {what!r} at the controller (modelcast ls lists them)")
    if len(groups) > 1:
        ids = ", ".join(f"{g['id']} (from {g['source']})" for g in groups)
        raise ValueError(f"model {what!r} has {len(groups)} groups: {ids}; name one by its id")
    return int(groups[0]["id"])


def cmd_trace(args: argparse.Namespace, token: Optional[str]) -> int:
    """Print the trace once, or every ``--interval`` s with ``--watch`` until interrupted."""
    from .control import ControllerClient

    client = ControllerClient(args.controller, token=token, request_timeout=args.request_timeout)
    gid = find_group(client, args.group)
    before: Optional[dict[str, Any]] = None
    at = 0.0
    while True:
        trace = client.trace(gid, args.receiver)
        now = time.monotonic()
        if args.json:
            print(json.dumps(trace), flush=True)
        else:
            text = render(trace, before, now - at if before is not None else 0.0)
            if args.watch and sys.stdout.isatty():
                print("\x1b[H\x1b[2J", end="")
            print(text + ("\n" if args.watch else ""), flush=True)
        if not args.watch:
            return 0
        before, at = trace, now
        time.sleep(args.interval)


def add_parser(sub: Any, formatter: Any, controller_options: Any, examples: Any) -> None:
    """The ``trace`` subcommand's options (``controller_options``: cli's --controller and token)."""
    p = sub.add_parser(
        "trace", formatter_class=formatter, help="show a group's tree hop by hop with live packet counters",
        description="The group's tree from the source to each receiver: every switch with the port the group "
                    "enters on and its (S,G) flow's packets, every port it copies to with its bucket's packets "
                    "(and, with --watch, how fast each rises), each receiver's state and why it waits. The hop "
                    "where a count stops rising is where packets stop.",
        epilog=examples("modelcast trace llama-70b --controller http://10.0.0.254:8080 "
                        "--token-file /etc/modelcast/token --watch"))
    p.add_argument("group", metavar="MODEL_OR_GROUP", help="a group id, or a model with one group")
    controller_options(p, True)
    p.add_argument("--receiver", metavar="IP", help="only this receiver's path")
    p.add_argument("--watch", action="store_true", help="trace again every --interval s, with rates")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="between traces with --watch")
    p.add_argument("--json", action="store_true", help="print each trace as one JSON line (the REST answer)")
