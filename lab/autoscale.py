"""An autoscaling fleet on a ``Fabric`` (issue 16): one ``modelcast serve`` and receivers
that each start ``modelcast fetch MODEL_ID`` at a random moment, knowing nothing but the
model id. First one fetch alone times *one transfer* (the reference, same run); then the
fleet's start times are spread uniformly over ``spread`` x that time. The report has the
rounds the server ran (from its ``--json`` lines), every receiver's time from its start
to verified (and which round served it), and the bytes on the server's link (OVS port
counters) next to N x the model's size, what unicast would send. The OVS lab test and
``make demo DEMO_ARGS=--autoscale`` both drive it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from lab.controller import Say
from lab.fabric import Fabric
from lab.models import tree_of
from lab.sh import LabError
from lab.transfer import AgentRun, agent_argv


@dataclass
class Arrival:
    """One fetching receiver: when it started (seconds after the fleet's first), how long
    until it had the verified model, and how it was served."""

    host: str
    ip: str
    start_s: float
    seconds: Optional[float]  # start -> verified (process exit 0); None: failed
    verified: bool
    attempts: int
    how: str = ""  # "round N", "round N, joined late (missed X%)", "rounds N-M (tail, then the start)"
    # Where its time went, seconds after its start (the server's clock is the same
    # system-wide monotonic one): the server first saw it asking (process start, offer
    # look-up, join, the server's poll); the round that verified it started, and its
    # stream began; it had the manifest (its first datagram: verified minus the receive
    # time its goodput covers); the server heard it verified. None: not known.
    seen: Optional[float] = None
    round_start: Optional[float] = None
    stream_start: Optional[float] = None
    first_data: Optional[float] = None
    verified_at: Optional[float] = None
    repairs: int = 0  # repair datagrams it received (its last attempt)
    cpu_s: float = 0.0  # its process's CPU time (its last attempt's process: the whole fetch)
    cpu: dict[str, float] = field(default_factory=dict)  # cores in use from its start to its exit (CpuSampler.share)
    cpu_at_seen: Optional[float] = None  # CPU-seconds its process had used when the server saw it asking

    def timeline(self) -> str:
        marks = [("seen", self.seen), ("round", self.round_start), ("stream", self.stream_start),
                 ("first data", self.first_data), ("verified", self.verified_at)]
        start = "" if self.cpu_at_seen is None else f" (having used {self.cpu_at_seen:.2f} CPU-s)"
        return ", ".join(f"{name} +{t:.2f}" + (start if name == "seen" else "") for name, t in marks
                         if t is not None) + f"; {self.repairs} repairs, {self.cpu_s:.2f} CPU-s; " + cpu_line(self.cpu)


def cpu_line(cpu: dict[str, float]) -> str:
    """Cores in use over a window, split by whose (``Autoscale``'s labels)."""
    if not cpu:
        return "CPU not sampled"
    fleet = sum(v for k, v in cpu.items() if k.startswith("fetch:"))
    known = fleet + sum(cpu.get(k, 0.0) for k in ("ovs", "server", "controller"))
    return (f"cores busy {cpu['machine']:.2f} (receivers {fleet:.2f}, OVS {cpu.get('ovs', 0.0):.2f}, "
            f"server {cpu.get('server', 0.0):.2f}, controller {cpu.get('controller', 0.0):.2f}, "
            f"rest {max(0.0, cpu['machine'] - known):.2f})")


class CpuSampler:
    """Where the machine's CPU goes while the fleet runs: every ``period`` the busy
    CPU-seconds of the whole machine (/proc/stat) and of named processes (utime + stime
    from /proc/PID/stat; ``pids`` says which, asked at each sample). ``share(a, b)`` is
    each one's cores in use between two ``time.monotonic()`` moments -- whether a slow
    receiver's window was CPU-bound, and whose CPU it was."""

    TICK = os.sysconf("SC_CLK_TCK")

    def __init__(self, pids: Callable[[], dict[str, int]], period: float = 0.1) -> None:
        self.pids = pids
        self.period = period
        self.cores = os.cpu_count() or 1
        self.samples: list[tuple[float, float, dict[str, float]]] = []  # (monotonic, machine busy s, label -> s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def __enter__(self) -> "CpuSampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _sample(self) -> None:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(ticks[:8]) - ticks[3] - ticks[4]) / self.TICK  # all but idle and iowait (guest is in user)
        procs = {}
        for label, pid in self.pids().items():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                procs[label] = (int(fields[11]) + int(fields[12])) / self.TICK
            except (OSError, IndexError, ValueError):
                pass  # (gone: its last sample stands)
        self.samples.append((time.monotonic(), busy, procs))

    def used(self, label: str, at: float) -> Optional[float]:
        """``label``'s CPU-seconds by ``at`` (None: not sampled by then)."""
        seen = [s[2][label] for s in self.samples if s[0] <= at and label in s[2]]
        return seen[-1] if seen else None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"cores": self.cores, "samples": self.samples}))

    def share(self, a: float, b: float) -> dict[str, float]:
        """Cores in use between ``a`` and ``b``: "machine" and each label (a process
        seen only in part of it counts what it used there)."""
        inside = [s for s in self.samples if a <= s[0] <= b] or [min(self.samples, key=lambda s: abs(s[0] - a))]
        first, last = inside[0], inside[-1]
        span = max(last[0] - first[0], self.period)
        out = {"machine": (last[1] - first[1]) / span}
        for label in {k for s in inside for k in s[2]}:
            seen = [s[2][label] for s in inside if label in s[2]]
            out[label] = (seen[-1] - seen[0]) / span
        return out


def ovs_vswitchd_pid() -> Optional[int]:
    """The switch's PID (its pidfile; the lab's OVS is the one ``ovs-vsctl`` reaches)."""
    rundir = os.environ.get("OVS_RUNDIR", "/var/run/openvswitch")
    try:
        return int(Path(rundir, "ovs-vswitchd.pid").read_text().strip())
    except (OSError, ValueError):
        return None


@dataclass
class AutoscaleReport:
    model_id: str
    size: int
    reference_s: float  # one fetch alone, start -> verified
    arrivals: list[Arrival]
    rounds: list[dict]  # the server's round lines (hostagent.serve.RoundDone)
    sender_link_bytes: int  # the server's uplink during the fleet (OVS port rx)
    seconds: float  # first start -> last verified
    server_exit: Optional[int] = None
    offers_after_stop: list[dict] = field(default_factory=list)
    reference_cpu: dict[str, float] = field(default_factory=dict)  # cores in use during the reference fetch
    cores: int = 0

    @property
    def ok(self) -> bool:
        return bool(self.arrivals) and all(a.verified for a in self.arrivals)

    @property
    def unicast_bytes(self) -> int:
        return len(self.arrivals) * self.size

    @property
    def sender_ratio(self) -> float:
        """Server-link bytes / (N x size): unicast would be 1.0 (plus headers)."""
        return self.sender_link_bytes / max(1, self.unicast_bytes)

    def worst_time_ratio(self) -> float:
        """The slowest receiver's start -> verified, in one-transfer times."""
        return max((a.seconds or float("inf")) for a in self.arrivals) / self.reference_s

    def mid_round_check(self) -> list[tuple[str, float, float]]:
        """Per receiver that joined while a round ran (admitted late, or keeping the tail
        for the next round): (host, when it verified, when one arriving at the start of
        the next round would have), seconds after the first start. The latter is the
        first of that round's own starters to verify (they did arrive at its start), or
        without any, its start plus one transfer. Target: the first <= the second."""
        out = []
        seen: set[str] = set()
        for i, r in enumerate(self.rounds):
            nxt = self.rounds[i + 1] if i + 1 < len(self.rounds) else None
            starters = [a.start_s + a.seconds for a in self.arrivals
                        if nxt is not None and a.seconds is not None and a.how == f"round {nxt['round']} from its start"]
            would = min(starters) if starters else (nxt["started_s"] if nxt else self.seconds) + self.reference_s
            for a in self.arrivals:
                if a.seconds is not None and (a.ip in r["late"] or a.ip in r["deferred"]) and a.host not in seen:
                    seen.add(a.host)  # (the first round it joined mid-way)
                    out.append((a.host, round(a.start_s + a.seconds, 2), round(would, 2)))
        return out

    def format(self) -> str:
        lines = [f"model {self.model_id[:23]}... ({self.size / 1e6:.1f} MB); one transfer alone "
                 f"(same run): {self.reference_s:.2f} s; {len(self.arrivals)} receivers started over "
                 f"{max(a.start_s for a in self.arrivals):.1f} s (the server's earlier rounds: the reference)",
                 f"  (times: + seconds after that receiver started; CPU of {self.cores} cores; the reference "
                 f"fetch's window: {cpu_line(self.reference_cpu)})"]
        for r in self.rounds:
            late = ", ".join(f"{h} (missed {p:.0%})" for h, p in sorted(r["late"].items())) or "none"
            lines.append(f"  round {r['round']} at {r['started_s']:.1f} s: started with "
                         f"{len(r['receivers'])}, joined late {late}, left for the next "
                         f"{len(r['deferred'])}; {len(r['verified'])} verified; {r['bytes_sent'] / 1e6:.1f} MB "
                         f"sent in {r['seconds']:.1f} s" + (f" ({r['error']})" if r["error"] else ""))
        for a in sorted(self.arrivals, key=lambda a: a.start_s):
            took = f"{a.seconds:.2f} s = {a.seconds / self.reference_s:.2f} x one transfer" if a.seconds else "FAILED"
            lines.append(f"  {a.host} started at {a.start_s:5.1f} s: verified after {took}, "
                         f"{a.attempts} attempt(s), {a.how}")
            lines.append(f"      {a.timeline()}")
        lines.append(f"server link: {self.sender_link_bytes / 1e6:.1f} MB = {self.sender_ratio:.2f} x N x size "
                     f"(unicast: {self.unicast_bytes / 1e6:.1f} MB = 1 x) in {len(self.rounds)} rounds")
        for host, done, would in self.mid_round_check():
            lines.append(f"  {host} arrived mid-round: verified at {done:.2f} s; arriving at the next round's "
                         f"start it would have at ~{would:.2f} s")
        return "\n".join(lines)


def served_line(server: AgentRun, timeout: float = 120) -> dict:
    """A ``modelcast serve --json``'s first "served" line: the model is hashed and offered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in server.stdout.read_text().splitlines():
            event = json.loads(line)
            if event.get("event") == "served":
                return event
        if not server.alive():
            break
        time.sleep(0.1)
    raise LabError(f"modelcast serve did not offer the model: {server.stderr_tail()}")


class Autoscale:
    """``model`` (file or directory) served from ``server``; ``receivers`` fetch it.
    ``run()`` -> ``AutoscaleReport``. Every process is killed by PID on every path."""

    def __init__(self, fabric: Fabric, model: Path, server: str, receivers: list[str], rate: float,
                 workdir: Path, spread: float = 2.0, seed: int = 16, chunk_size: int = 256 * 1024,
                 reference_host: Optional[str] = None, say: Optional[Say] = None,
                 serve_args: tuple[str, ...] = ()) -> None:
        self.fabric = fabric
        self.model = Path(model)
        self.server = fabric.name(server)
        self.receivers = [fabric.name(h) for h in receivers]
        self.reference_host = fabric.name(reference_host or receivers[0])
        self.rate = rate
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spread = spread
        self.rng = random.Random(seed)
        self.chunk_size = chunk_size
        self.serve_args = serve_args  # more ``modelcast serve`` options (e.g. the round policy's)
        self.say = say or fabric.say
        self.runs: list[AgentRun] = []
        self._started: dict[str, tuple[float, dict]] = {}  # fleet ip -> (its process start, its summary)
        self._reference_window = (0.0, 0.0)  # the reference fetch's start and end (monotonic)

    def __enter__(self) -> "Autoscale":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, host: str, name: str, args: list[str]) -> AgentRun:
        run = AgentRun.start(self.fabric, host, name, agent_argv(self.fabric, host, args), self.workdir / name)
        self.runs.append(run)
        return run

    def _fetch(self, host: str, model_id: str, name: str) -> AgentRun:
        return self._start(host, name, ["fetch", model_id, "--out", str(self.workdir / f"{name}-model"),
                                        "--timeout", "30", "--patience", "180"])

    def run(self) -> AutoscaleReport:
        want = tree_of(self.model) if self.model.is_dir() else None
        server = self._start(self.server, "serve", [
            "serve", str(self.model), "--rate", str(self.rate), "--chunk-size", str(self.chunk_size),
            *self.serve_args])
        served = served_line(server)
        model_id, size = served["model"], served["size"]
        self.say(f"{self.server} serves {served['name']} as {model_id[:23]}... ({size / 1e6:.1f} MB)")
        fleet: dict[str, AgentRun] = {}
        ovs = ovs_vswitchd_pid()

        def pids() -> dict[str, int]:
            out = {f"fetch:{h}": r.proc.pid for h, r in list(fleet.items())}
            out.update(server=server.proc.pid, **({"ovs": ovs} if ovs else {}))
            ctl = self.fabric.controller.proc
            if ctl is not None:
                out["controller"] = ctl.pid
            return out

        with CpuSampler(pids) as cpu:
            report = self._fleet(server, model_id, size, want, fleet)
        cpu.save(self.workdir / "cpu-samples.json")
        for a in report.arrivals:
            run = fleet[a.host]
            a.cpu = cpu.share(run.started, run.started + (a.seconds or 0.0))
            if a.seen is not None:
                a.cpu_at_seen = cpu.used(f"fetch:{a.host}", run.started + a.seen)
        report.reference_cpu, report.cores = cpu.share(*self._reference_window), cpu.cores
        return report

    def _fleet(self, server: AgentRun, model_id: str, size: int, want: Optional[dict],
               fleet: dict[str, AgentRun]) -> AutoscaleReport:
        """The reference fetch, then the fleet (``fleet`` fills as receivers start)."""
        ref = self._fetch(self.reference_host, model_id, "reference")
        fleet["reference"] = ref  # (sampled as the fleet's receivers are)
        if ref.wait(180) is None or ref.returncode != 0:
            raise LabError(f"the reference fetch failed: {ref.stderr_tail()}")
        reference_s = time.monotonic() - ref.started
        self._reference_window = (ref.started, ref.started + reference_s)
        del fleet["reference"]
        self._check(self.workdir / "reference-model", want)
        self.say(f"one fetch alone took {reference_s:.2f} s; now {len(self.receivers)} receivers start at random "
                 f"moments over {self.spread:g} x that")
        starts = sorted(self.rng.uniform(0, self.spread * reference_s) for _ in self.receivers)
        starts[0] = 0.0
        hosts = list(self.receivers)
        self.rng.shuffle(hosts)
        before = self.fabric.port_counters(self.server)
        t0 = time.monotonic()
        ended: dict[str, float] = {}
        pending = list(zip(starts, hosts))
        deadline = t0 + self.spread * reference_s + 240
        while pending or len(ended) < len(fleet):
            now = time.monotonic()
            while pending and now - t0 >= pending[0][0]:
                at, host = pending.pop(0)
                fleet[host] = self._fetch(host, model_id, f"fetch-{host}")
                self.say(f"  {host} starts fetching at {now - t0:.1f} s")
            for host, run in fleet.items():
                if host not in ended and not run.alive():
                    ended[host] = time.monotonic()
                    self.say(f"  {host} done after {ended[host] - run.started:.2f} s (exit {run.proc.returncode})")
            if now > deadline:
                raise LabError("the fleet did not finish: " + "; ".join(
                    f"{h}: {r.stderr_tail(300)}" for h, r in fleet.items() if h not in ended))
            time.sleep(0.02)
        link = (self.fabric.port_counters(self.server) - before).rx_bytes
        seconds = max(ended.values()) - t0
        server.proc.send_signal(signal.SIGTERM)
        server.wait(60)
        offers = self.fabric.controller.client.offers()
        lines = [json.loads(line) for line in server.stdout.read_text().splitlines()]
        # the fleet's rounds (the reference's ended before the fleet began)
        rounds = [r for r in lines if r.get("event") == "round" and r["started_at"] >= t0]
        arrivals = []
        for host, run in fleet.items():
            summary = run.wait(1)
            ok = run.returncode == 0 and bool(summary and summary.get("ok"))
            if ok:
                self._check(self.workdir / f"fetch-{host}-model", want)
            arrivals.append(Arrival(host, self.fabric.ip(host), round(run.started - t0, 3), round(ended[host] - run.started, 3) if ok else None,
                                    ok, int((summary or {}).get("attempts", 0)),
                                    repairs=int((summary or {}).get("repairs_received", 0)),
                                    cpu_s=float((summary or {}).get("cpu_s", 0.0))))
            self._started[self.fabric.ip(host)] = (run.started, summary or {})
        self._rounds_of(arrivals, rounds, t0)
        return AutoscaleReport(model_id, size, reference_s, arrivals, rounds, link, seconds,
                               server.returncode, offers)

    def _rounds_of(self, arrivals: list[Arrival], rounds: list[dict], t0: float) -> None:
        """Which round(s) served each receiver, from the server's lines (by address; the
        server stamps rounds with the system-wide monotonic clock, as ours)."""
        for r in rounds:
            r["started_s"] = round(r["started_at"] - t0, 2)
        by_ip = {a.ip: a for a in arrivals}
        for r in rounds:
            for ip, at in r["asked_at"].items():
                if ip in by_ip and ip in self._started:
                    seen = round(at - self._started[ip][0], 3)
                    a = by_ip[ip]
                    a.seen = seen if a.seen is None else min(a.seen, seen)
            for ip in r["verified"]:
                a = by_ip.get(ip)
                if a is None:
                    continue
                began, summary = self._started[ip]
                a.round_start = round(r["started_at"] - began, 3)
                a.stream_start = None if r["stream_at"] is None else round(r["stream_at"] - began, 3)
                if ip in r["verified_at"]:
                    a.verified_at = round(r["verified_at"][ip] - began, 3)
                    if summary.get("goodput_mbit"):
                        a.first_data = round(a.verified_at - summary["bytes"] * 8 / (summary["goodput_mbit"] * 1e6), 3)
                if ip in r["late"]:
                    a.how = f"round {r['round']}, joined late (missed {r['late'][ip]:.0%})"
                elif a.attempts > 1:
                    a.how = f"the tail of round {r['round'] - 1}, then round {r['round']}'s start"
                else:
                    a.how = f"round {r['round']} from its start"

    def _check(self, out: Path, want: Optional[dict]) -> None:
        """The copy is the model, hashed here (not trusting the agents)."""
        if want is not None and (not out.is_dir() or tree_of(out) != want):
            raise LabError(f"{out} is not the model")

    def close(self) -> None:
        for run in self.runs:
            if run.alive():
                run.kill(signal.SIGKILL)
