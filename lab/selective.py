"""Selective distribution on a ``Fabric`` (issue 13 part 3): a model directory published
in parts (``hostagent.parts``), receivers asking for different parts with the real
``modelcast recv --catalog --include`` and one ``modelcast send --part``, the tree of
every part's group, and the bytes on every host's link from OVS port counters. The
OVS lab test and ``make demo DEMO_ARGS=--moe`` both drive it.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from hostagent import catalog
from hostagent.control import ControllerError
from hostagent.parts import describe_parts
from lab.controller import Say
from lab.fabric import Fabric, PortCounters, natural
from lab.models import tree_of
from lab.sh import LabError
from lab.transfer import AgentRun, agent_argv


@dataclass
class SelectiveReport:
    """What went where: parts, their groups and trees, link bytes, verified copies."""

    model_id: str
    parts: list[catalog.Part]
    wanted: dict[str, list[catalog.Part]]  # receiver host -> the parts it asked for
    trees: dict[str, str]  # part name -> its group's tree (parts nobody asked for: absent)
    groups: dict[str, str]  # part name -> "ADDR:PORT"
    sender_link: PortCounters
    receiver_links: dict[str, PortCounters]
    verified: dict[str, bool]  # receiver host -> its merged directory is exactly its parts
    seconds: float
    sender_summary: Optional[dict] = None
    receiver_summaries: dict[str, Optional[dict]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.verified) and all(self.verified.values())

    def sent_parts(self) -> list[catalog.Part]:
        """The distinct parts some receiver asked for (each should cross the sender's link once)."""
        names = {p.name for parts in self.wanted.values() for p in parts}
        return [p for p in self.parts if p.name in names]

    def sender_ratio(self) -> float:
        return self.sender_link.rx_bytes / max(1, sum(p.size for p in self.sent_parts()))

    def receiver_ratio(self, host: str) -> float:
        return self.receiver_links[host].tx_bytes / max(1, sum(p.size for p in self.wanted[host]))

    def format(self) -> str:
        lines = [f"model {self.model_id}: {len(self.parts)} parts, "
                 f"{sum(p.size for p in self.parts) / 1e6:.1f} MB in all"]
        for part in self.parts:
            who = sorted((h for h, ps in self.wanted.items() if part in ps), key=natural)
            where = self.groups.get(part.name)
            lines.append(f"  part {part.name} ({part.size / 1e6:.2f} MB, {part.content_id[:23]}...) -> "
                         + (f"group {where}, receivers {' '.join(who)}" if where else "not sent: nobody asked"))
            for row in (self.trees.get(part.name) or "").splitlines():
                lines.append(f"      {row}")
        sent = sum(p.size for p in self.sent_parts())
        lines.append(f"sender link: {self.sender_link.rx_bytes / 1e6:.2f} MB for {sent / 1e6:.2f} MB of distinct "
                     f"parts = {self.sender_ratio():.3f} x (each part once; unicast would send "
                     f"{sum(p.size for ps in self.wanted.values() for p in ps) / 1e6:.2f} MB)")
        for host in sorted(self.wanted, key=natural):
            asked = sum(p.size for p in self.wanted[host])
            lines.append(f"  {host} link: {self.receiver_links[host].tx_bytes / 1e6:.2f} MB for "
                         f"{asked / 1e6:.2f} MB asked = {self.receiver_ratio(host):.3f} x, "
                         f"{'verified' if self.verified[host] else 'NOT VERIFIED'} "
                         f"({', '.join(p.name for p in self.wanted[host])})")
        return "\n".join(lines)


class Selective:
    """``model`` (a directory) split by ``part_globs``; ``wants``: receiver host -> its
    ``--include`` globs. ``run()`` -> ``SelectiveReport``; everything it started is killed
    (by PID) and its groups deleted on every path."""

    def __init__(self, fabric: Fabric, model: Path, sender: str, part_globs: list[str],
                 wants: dict[str, list[str]], rate: float, workdir: Path, chunk_size: int = 256 * 1024,
                 timeout: float = 120, say: Optional[Say] = None) -> None:
        self.fabric = fabric
        self.model = Path(model)
        self.sender = fabric.name(sender)
        self.part_globs = part_globs
        self.wants = {fabric.name(h): g for h, g in wants.items()}
        self.rate = rate
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self.timeout = timeout
        self.say = say or fabric.say
        self.runs: list[AgentRun] = []
        blob, self.parts = describe_parts(str(self.model), part_globs, chunk_size)
        self.model_id = catalog.catalog_id(blob)
        self.catalog_file = self.workdir / "catalog.bin"  # published next to the model id
        self.catalog_file.write_bytes(blob)

    def __enter__(self) -> "Selective":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, host: str, role: str, args: list[str]) -> AgentRun:
        run = AgentRun.start(self.fabric, host, role, agent_argv(self.fabric, host, args),
                             self.workdir / f"{role}-{host}")
        self.runs.append(run)
        return run

    def run(self) -> SelectiveReport:
        src = self.fabric.ip(self.sender)
        wanted = {h: catalog.select(self.parts, g) for h, g in self.wants.items()}
        receivers = {}
        for host, globs in self.wants.items():
            args = ["recv", "--source", src, "--out", str(self.workdir / f"{host}-model"),
                    "--catalog", str(self.catalog_file), "--expect", self.model_id, "--timeout", str(self.timeout)]
            for glob in globs:
                args += ["--include", glob]
            receivers[host] = self._start(host, "recv", args)
            self.say(f"receiver {host} asks for {', '.join(p.name for p in wanted[host])}")
        groups = self._wait_joined(wanted, src)
        trees = {name: self.fabric.describe_tree(g) for name, g in groups.items()}
        hosts = [self.sender, *self.wants]
        before = {h: self.fabric.port_counters(h) for h in hosts}
        started = time.monotonic()
        args = ["send", str(self.model), "--rate", str(self.rate), "--chunk-size", str(self.chunk_size),
                "--poll", "0.1", "--timeout", str(self.timeout)]
        for glob in self.part_globs:
            args += ["--part", glob]
        sender = self._start(self.sender, "send", args)
        sender_summary = sender.wait(self.timeout * len(self.parts))
        summaries = {h: r.wait(self.timeout) for h, r in receivers.items()}
        seconds = time.monotonic() - started
        after = {h: self.fabric.port_counters(h) for h in hosts}
        verified = {}
        source_tree = tree_of(self.model)
        for host, parts in wanted.items():
            want = {p: source_tree[p] for part in parts for p in part.paths}
            out = self.workdir / f"{host}-model"
            verified[host] = bool(summaries[host] and summaries[host].get("ok")) and out.is_dir() and tree_of(out) == want
        if not sender_summary or not sender_summary.get("ok"):
            raise LabError(f"send --part failed: {sender_summary}; stderr: {sender.stderr_tail()}")
        return SelectiveReport(
            self.model_id, self.parts, wanted, trees, {n: f"{g['address']}:{g['port']}" for n, g in groups.items()},
            after[self.sender] - before[self.sender], {h: after[h] - before[h] for h in self.wants}, verified,
            seconds, sender_summary, summaries)

    def _wait_joined(self, wanted: dict[str, list[catalog.Part]], src: str, timeout: float = 60) -> dict[str, dict]:
        """Until every part someone asked for has a group with those receivers installed."""
        need = {p.name: (p.content_id, {self.fabric.ip(h) for h, ps in wanted.items() if p in ps})
                for ps in wanted.values() for p in ps}
        deadline = time.monotonic() + timeout
        while True:
            groups = {}
            for name, (cid, ips) in need.items():
                g = self.fabric.find_group(cid, src)
                if g is not None and g.get("state") == "installed" and all(
                        (g.get("receivers") or {}).get(ip) == "installed" for ip in ips):
                    groups[name] = g
            if len(groups) == len(need):
                return groups
            dead = [r for r in self.runs if not r.alive()]
            if dead or time.monotonic() > deadline:
                raise LabError(f"receivers did not join every part's group ({len(groups)}/{len(need)}): "
                               + "; ".join(f"{r.host}: {r.stderr_tail(500)}" for r in self.runs))
            time.sleep(0.2)

    def close(self) -> None:
        """Kill what still runs (by PID) and delete the parts' groups."""
        for run in self.runs:
            if run.alive():
                run.kill(signal.SIGKILL)
        try:
            if self.fabric.controller.proc is not None:
                src = self.fabric.ip(self.sender)
                for part in self.parts:
                    g = self.fabric.find_group(part.content_id, src)
                    if g is not None:
                        self.fabric.controller.client.delete_group(g["id"])
        except ControllerError:
            pass
