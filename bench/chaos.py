"""Chaos run (issue 46): ``modelcast serve`` and a fleet fetching the model again and again
on the Open vSwitch lab, three controller instances on etcd, while faults rotate (root):

    python -m bench.chaos [--minutes 10] [--every 30] [--size-mb 8] [--out docs/bench] [--smoke]

A leaf-spine lab (2 spines, 3 leaves, 6 hosts); h1 serves the model, every other host
runs ``modelcast fetch MODEL_ID`` in a loop, each verified copy checked here byte for
byte and removed, each next fetch started at once. Every ``--every`` seconds the next
fault of ``FAULTS`` is injected, in turn:

- ``link_flap``: a link between the server's leaf and a spine down for 5 s;
- ``loss_burst``: 20% random loss towards one fetcher for 5 s;
- ``kill_fetcher``: one running fetch SIGKILLed (its loop starts it again: it resumes);
- ``kill_server``: ``modelcast serve`` SIGKILLed, started again 1 s later;
- ``kill_leader``: the controllers' leader SIGKILLed, started again 3 s later (a follower);
- ``restart_etcd``: etcd stopped for 3 s and started over its data.

Figures (``chaos.json`` in ``--out``, and one JSON line on stdout): fetches started,
verified, failed, wrong bytes accepted (a fetch that exited 0 with other bytes: must be 0),
the median time of a fetch no fault overlapped, for each fault kind the time from the fault
to the first fetch started after it that verified, and the RSS slope (MB per hour, least
squares after its first 30 s) of each controller instance and server process that lived
at least 2 minutes (or half the run); every RSS sample is in the JSON. ``--smoke`` (what CI runs, ~2 minutes): 105 s, a
fault every 15 s, each kind once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional

import blake3

import topologies as T
from bench.machine import machine
from hostagent import tree
from hostagent.net import FileSource
from hostagent.sender import file_digests
from lab import etcd as lab_etcd
from lab import loss
from lab.controller import Controller, stamp_printer
from lab.fabric import Fabric
from lab.models import make_model
from lab.sh import LabError
from lab.transfer import AgentRun, agent_argv

FAULTS = ("link_flap", "loss_burst", "kill_fetcher", "kill_server", "kill_leader", "restart_etcd")
SERVER = "h1"
CHUNK = 1024 * 1024  # modelcast serve's chunk size: the model id depends on it
PATIENCE_S = 120.0
RSS_PERIOD_S = 2.0
WARM_S = 30.0  # a process's RSS slope leaves out its first seconds (start-up)
LIVED_S = 120.0  # a process's slope is reported when it lived this long (or half the run)


@dataclass
class Fetch:
    """One ``modelcast fetch`` process."""

    host: str
    started: float  # seconds into the run
    ended: Optional[float] = None
    outcome: str = "running"  # verified, failed, killed (a fault), cut (the run ended), wrong
    attempts: int = 0
    wrong_bytes: int = 0
    error: Optional[str] = None


@dataclass
class Fault:
    kind: str
    at: float  # seconds into the run
    detail: str
    recover_s: Optional[float] = None  # to the first fetch started after it that verified


@dataclass
class Rss:
    """RSS samples of one process (a controller instance or a server), MB."""

    label: str
    pid: int
    samples: list[tuple[float, float]] = field(default_factory=list)

    def life_s(self) -> float:
        return self.samples[-1][0] - self.samples[0][0] if self.samples else 0.0

    def slope_mb_per_hour(self) -> Optional[float]:
        """Least-squares slope of the samples after the process's first ``WARM_S``
        (start-up: imports, first trees, caches filling)."""
        points = [(t, m) for t, m in self.samples if t >= self.samples[0][0] + WARM_S]
        if len(points) < 3:
            return None
        mean_t, mean_m = statistics.fmean(t for t, _ in points), statistics.fmean(m for _, m in points)
        var = sum((t - mean_t) ** 2 for t, _ in points)
        return 3600 * sum((t - mean_t) * (m - mean_m) for t, m in points) / var if var else None


def model_id(path: Path) -> str:
    """The content id ``modelcast serve`` offers a single file under."""
    with FileSource(str(path)) as source:
        digests, whole = file_digests(source, CHUNK)
        return tree.content_id(b"", source.size, CHUNK, whole, digests)


def rss_mb(pid: int) -> Optional[float]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Chaos:
    """The run: a fabric with its etcd, the server, the fetch loops, the faults, the
    samplers. ``run`` returns the report (module docstring)."""

    def __init__(self, fabric: Fabric, etcd: lab_etcd.Etcd, model: Path, digest: str, work: Path,
                 rate: float, say: Callable[[str], None], rng: random.Random) -> None:
        self.fabric, self.etcd, self.model, self.digest, self.work = fabric, etcd, model, digest, work
        self.rate, self.say, self.rng = rate, say, rng
        self.model_id = model_id(model)
        self.fetchers = [h.name for h in fabric.topology.hosts if h.name != SERVER]
        self.fetches: list[Fetch] = []
        self.faults: list[Fault] = []
        self.running: dict[str, AgentRun] = {}
        self.rss: dict[int, Rss] = {}
        self.server: Optional[AgentRun] = None
        self.servers = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ---------------------------------------------------------------- processes

    def start_server(self) -> None:
        self.servers += 1
        argv = agent_argv(self.fabric, SERVER, ["serve", str(self.model), "--rate", str(self.rate),
                                                "--interface", self.fabric.ip(SERVER)])
        self.server = AgentRun.start(self.fabric, SERVER, "serve", argv, self.work / f"serve-{self.servers}")

    def fetch_loop(self, host: str) -> None:
        """Fetch, check, remove, again, until the run ends; a fetch SIGKILLed by a fault is
        started again on the same output (it resumes from its record)."""
        n = 0
        while not self.stop.is_set():
            out = self.work / f"{host}-{n}.bin"
            argv = agent_argv(self.fabric, host, ["fetch", self.model_id, "--out", str(out), "--timeout", "5",
                                                  "--patience", str(PATIENCE_S), "--interface", self.fabric.ip(host)])
            fetch = Fetch(host, round(self.now(), 2))
            run = AgentRun.start(self.fabric, host, "fetch", argv, self.work / f"{host}-{n}-{len(self.fetches)}")
            with self.lock:
                self.fetches.append(fetch)
                self.running[host] = run
            while run.alive() and not self.stop.is_set():
                time.sleep(0.05)
            if run.alive():  # the run is over
                run.kill()
                fetch.outcome = "cut"
            summary = run.wait(10)
            with self.lock:
                self.running.pop(host, None)
            fetch.ended = round(self.now(), 2)
            fetch.attempts = int((summary or {}).get("attempts") or 0)
            if fetch.outcome == "cut":
                break
            if run.returncode == 0:
                data = out.read_bytes()
                if blake3.blake3(data).hexdigest() == self.digest:
                    fetch.outcome = "verified"
                else:
                    fetch.outcome, fetch.wrong_bytes = "wrong", len(data)
                out.unlink()
                n += 1
            elif run.killed or run.returncode == -signal.SIGKILL:
                fetch.outcome = "killed"
            else:
                fetch.outcome = "failed"
                fetch.error = (summary or {}).get("error") or (run.stderr_tail(300).splitlines() or [""])[-1]
                n += 1

    def sample_rss(self) -> None:
        while not self.stop.wait(RSS_PERIOD_S):
            procs = [(c.name, c.proc.pid) for c in self.fabric.controllers if c.proc is not None]
            if self.server is not None and self.server.alive():
                procs.append(("server", self.server.proc.pid))
            for label, pid in procs:
                mb = rss_mb(pid)
                if mb is not None:
                    self.rss.setdefault(pid, Rss(label, pid)).samples.append((round(self.now(), 1), round(mb, 2)))

    # ---------------------------------------------------------------- faults

    def inject(self, kind: str) -> Fault:
        """Inject one fault (and undo it, where it has an end); returns what was done."""
        fab = self.fabric
        if kind == "link_flap":
            leaf = fab.topology.host(SERVER).dpid
            link = next(link for link in fab.topology.links if leaf in (link.a, link.b))
            fault = Fault(kind, self.now(), f"{fab.topology.switches[link.a]}-{fab.topology.switches[link.b]} 5 s")
            fab.set_link(link.a, link.b, False)
            time.sleep(5)
            fab.set_link(link.a, link.b, True)
        elif kind == "loss_burst":
            host = self.rng.choice(self.fetchers)
            fault = Fault(kind, self.now(), f"20% towards {host} 5 s")
            ns, iface = fab.live_lab().ns(host), fab.host_port_iface(host)
            loss.add(ns, iface, "random", pct=20.0)
            time.sleep(5)
            loss.clear(ns, iface)
        elif kind == "kill_fetcher":
            with self.lock:
                victims = list(self.running.items())
            host, run = self.rng.choice(victims) if victims else ("nobody", None)
            fault = Fault(kind, self.now(), f"fetch on {host}")
            if run is not None:
                run.kill()
        elif kind == "kill_server":
            fault = Fault(kind, self.now(), "serve SIGKILLed, again after 1 s")
            assert self.server is not None
            self.server.kill()
            time.sleep(1)
            self.start_server()
        elif kind == "kill_leader":
            leader = self.leader()
            fault = Fault(kind, self.now(), f"{leader.name} SIGKILLed, again after 3 s")
            leader.stop(signal.SIGKILL)
            time.sleep(3)
            leader.start()
        elif kind == "restart_etcd":
            fault = Fault(kind, self.now(), "etcd down 3 s")
            self.etcd.restart(down_s=3.0)
        else:
            raise ValueError(f"unknown fault {kind!r}")
        fault.at = round(fault.at, 2)
        self.say(f"fault {kind}: {fault.detail}")
        return fault

    def leader(self) -> Controller:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for c in self.fabric.controllers:
                if c.proc is not None:
                    try:
                        if c.api("GET", "/v1/health", timeout=2).json().get("role") == "leader":
                            return c
                    except Exception:
                        pass
            time.sleep(0.2)
        raise LabError("no controller leader within 20 s")

    # ---------------------------------------------------------------- the run

    def run(self, seconds: float, every: float) -> dict:
        self.start_server()
        deadline = time.monotonic() + 60
        while self.fabric.find_group(self.model_id, self.fabric.ip(SERVER)) is None:
            if time.monotonic() > deadline or not self.server.alive():  # type: ignore[union-attr]
                raise LabError(f"the server did not start: {self.server.stderr_tail()}")  # type: ignore[union-attr]
            time.sleep(0.2)
        threads = [threading.Thread(target=self.fetch_loop, args=(h,), daemon=True) for h in self.fetchers]
        threads.append(threading.Thread(target=self.sample_rss, daemon=True))
        for t in threads:
            t.start()
        start = time.monotonic()
        try:  # a fault every ``every`` s, the last one interval before the end (to recover)
            for k in range(1, int(seconds // every)):
                time.sleep(max(0.0, start + k * every - time.monotonic()))
                self.faults.append(self.inject(FAULTS[(k - 1) % len(FAULTS)]))
            time.sleep(max(0.0, start + seconds - time.monotonic()))
        finally:
            self.stop.set()
            for t in threads:
                t.join(30)
            if self.server is not None:
                self.server.kill(signal.SIGTERM)
        return self.report(seconds, every)

    def report(self, seconds: float, every: float) -> dict:
        done = [f for f in self.fetches if f.outcome in ("verified", "wrong")]
        for fault in self.faults:
            after = [f.ended for f in done if f.outcome == "verified" and f.started >= fault.at]
            fault.recover_s = round(min(after) - fault.at, 2) if after else None
        calm = [f.ended - f.started for f in done if f.ended is not None and f.outcome == "verified"
                and not any(f.started - 1 <= fault.at <= f.ended for fault in self.faults)]
        recover = {}
        for kind in FAULTS:
            times = [f.recover_s for f in self.faults if f.kind == kind]
            got = [t for t in times if t is not None]
            recover[kind] = {"faults": len(times), "recovered": len(got),
                             "median_s": round(statistics.median(got), 2) if got else None,
                             "max_s": max(got) if got else None}
        lived = [r for r in self.rss.values() if r.life_s() >= min(seconds / 2, LIVED_S)]
        counts = {k: sum(f.outcome == k for f in self.fetches) for k in ("verified", "failed", "killed", "cut", "wrong")}
        return {
            "ok": counts["wrong"] == 0 and counts["verified"] > 0 and all(
                r["recovered"] == r["faults"] for r in recover.values()),
            "seconds": seconds, "every_s": every, "fetchers": len(self.fetchers), "model_bytes": self.model.stat().st_size,
            "fetches": len(self.fetches), **counts,
            "attempts": sum(f.attempts for f in self.fetches),
            "wrong_bytes_accepted": sum(f.wrong_bytes for f in self.fetches),
            "calm_fetch_median_s": round(statistics.median(calm), 2) if calm else None,
            "recover": recover,
            "rss_mb_per_hour": {f"{r.label} (pid {r.pid})": {
                "slope": _rounded(r.slope_mb_per_hour()), "first_mb": r.samples[0][1],
                "last_mb": r.samples[-1][1], "from_s": r.samples[0][0], "to_s": r.samples[-1][0]} for r in lived},
            "rss_samples": {f"{r.label} (pid {r.pid})": r.samples for r in self.rss.values()},
            "faults": [asdict(f) for f in self.faults],
            "failures": [asdict(f) for f in self.fetches if f.outcome in ("failed", "wrong")],
            "machine": machine(),
        }


def _rounded(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long faults rotate")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between faults")
    ap.add_argument("--size-mb", type=float, default=8.0, help="the model's size")
    ap.add_argument("--rate", type=float, default=200.0, help="the server's rate cap, Mbit/s")
    ap.add_argument("--out", default="docs/bench", help="where chaos.json goes")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--smoke", action="store_true", help="105 s, a fault every 15 s: each kind once (CI)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.minutes, args.every = 1.75, 15.0
    if os.geteuid() != 0:
        print("bench.chaos: must run as root (it builds an OVS lab)", file=sys.stderr)
        return 2
    why = lab_etcd.available()
    if why:
        print(f"bench.chaos: {why}", file=sys.stderr)
        return 2
    say = stamp_printer(stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="modelcast-chaos-") as tmp:
        work = Path(tmp)
        model = make_model(work / "model.bin", int(args.size_mb * 1e6), seed=args.seed)
        secret = work / "cluster-secret"
        secret.write_text(secrets.token_urlsafe(32))
        os.environ["MODELCAST_CLUSTER_SECRET_FILE"] = str(secret)  # (the controller processes inherit it)
        etcd = lab_etcd.Etcd(work)
        etcd.start()
        try:
            with Fabric(T.leaf_spine(2, 3, 2), work / "lab", instances=3, store=etcd.store_url, say=say) as fabric:
                chaos = Chaos(fabric, etcd, model.path, model.digest, work, args.rate, say, random.Random(args.seed))
                report = chaos.run(args.minutes * 60, args.every)
        finally:
            etcd.stop()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("faults", "machine", "rss_samples")}))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
