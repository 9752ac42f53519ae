"""The host agent at line rate, beside TCP fan-out and UFTP in the same run (root):

    python -m bench.agent [--size-mb 256] [--rate-cap 1000] [--mtu 9000] [--receivers 1,4]
                          [--runs 3] [--methods modelcast,tcp,uftp,uftp-gcm] [--out docs/bench]
                          [--no-asymmetry] [--no-stall] [--no-lanes] [--lanes-cap 0] [--smoke]
                          [--work DIR] [--no-goals | --goals-only] [--cases abcdef]
                          [--baseline CHECKOUT]

A kernel-bridge lab (Linux bridge, one netns per host: the agent, not the switch, is
what is measured), the sender's NIC capped with ``tc tbf`` at ``--rate-cap``:

- **speed**: N receivers, every method, ``--runs`` runs; time from starting the sender
  to the last verified copy, next to the line-rate time (size / cap) measured as a
  ratio, and CPU seconds per GB on each side;
- **asymmetry**: 1500 MTU, 150 Mbit/s, 4 receivers, one of them dropping 5% of UDP at
  random: does one lossy receiver slow the group? modelcast clean, modelcast with the
  lossy receiver, UFTP with the lossy receiver; the clean receivers' times are compared
  with their times in the clean run;
- **stall**: issue 14's 1%-loss runs on the kernel bridge: every host's NIC at 100 Mbit/s,
  MTU 9000, 32 MB, 4 receivers each dropping 1% of their IPv4 at random, with and without
  a shared stall (the bridge drops 4 packets in a row of every 200 from the sender: a
  switch off the CPU for a moment, loss every receiver shares): one cut, or many?
- **lanes**: one transfer to one receiver over 1 and over 2 lanes (``--lanes``), MTU
  9000, the NIC uncapped: where one Python process per side is the limit, how much
  sooner do two lanes finish? Once with the C receive path and once with a receiver
  without it (a slower receiver).

- **goals**: issue 47's table, six cases on labs of their own (``Case``, ``CASES``), each
  against a reference timed in the same run: (a) 16 MB, 100 Mbit/s, 4 receivers, UFTP;
  (b) 96 MB, 1 Gbit/s jumbo, 4 receivers, the line; (c) 16 receivers each losing 1%,
  the sender's wire bytes and UFTP; (d) 8 receivers, every host at 100 Mbit/s, the
  pipelined TCP chain; (e) one of 4 receivers at 5% loss, 150 Mbit/s, the line; (f) no
  cap, 256 MB to 1 and 2 receivers, one kernel TCP stream. Writes ``agent-goals.md`` and
  ``agent-goals.json``; ``--baseline CHECKOUT`` runs that checkout's agent in turn with
  this one (before/after in one run).

Method ``modelcast-norecord`` is modelcast with the receivers' resume records off during
the transfer (``--resume-interval`` beyond its length): next to ``modelcast`` in the same
run it prices the records (fdatasync, then the record). Method ``modelcast-purepy`` is
modelcast with the receivers' clean-stream path in Python (``hostagent.fastrun``'s
fallback) instead of C: it prices the C path. The files go to ``--work``
(default ``/dev/shm``, where a sync costs nothing: give a disk directory to see its cost).

Every method writes into memory equally warm (``bench.memory``: on a VM whose freed
pages go back to the host, a first write costs several times a rewrite, and the method that
ran first at a new N paid it); the methods take turns at going first, run by run.

Writes ``agent.json`` (every run) and ``agent.md`` (medians) to ``--out``.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import hostagent
from bench import baselines as B
from bench.chain import chain
from bench.memory import in_turn, steady_memory
from bench.machine import describe, machine
from lab import loss as impair
from lab.bridge import BridgeLab
from lab.controller import stamp_printer
from lab.models import ModelFile, file_digest, make_key_file, make_model
from lab.sh import LabError

METHODS = ("modelcast", "tcp", "uftp", "uftp-gcm", "modelcast-norecord", "modelcast-purepy")
NO_RECORD = ("--resume-interval", "1e9")
PURE_PYTHON = {"MODELCAST_PURE_PYTHON": "1"}  # the receivers' clean-stream path in Python, not C
GB = 1e9
FRAME_HEADERS = 14 + 20 + 8  # Ethernet, IPv4 and UDP headers of every datagram on the wire
SENDER_COUNTS = ("datagrams_sent", "bytes_sent", "repair_bytes", "repair_bytes_unicast", "repair_bytes_multicast",
                 "repairs_parity", "repairs_unicast", "repairs_multicast", "nacks", "rate_decreases",
                 "lowest_rate_mbit", "stream_s", "completed_s", "loss_verdicts")
RX_COUNTS = ("nacks", "nack_seqs", "repairs_received", "parity_received", "fec_recovered", "duplicates",
             "datagrams_received")
LANES_RATE = 10_000.0  # Mbit/s: the sender's --rate in the lanes scenario when the NIC is uncapped
# the lanes scenario's receivers: (method suffix, environment)
LANES_RECEIVERS: list[tuple[str, Optional[dict[str, str]]]] = [
    ("", None), (" (pure-Python receiver)", PURE_PYTHON)]


@dataclass
class Run:
    scenario: str
    method: str
    receivers: int
    seconds: float  # sender start .. last verified copy
    ok: bool
    line_rate_s: float
    file_bytes: int
    cpu_sender_s: Optional[float] = None
    cpu_receivers_s: Optional[float] = None  # summed over receivers
    receiver_seconds: dict[str, float] = field(default_factory=dict)  # per receiver, from sender start
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_sender_per_gb(self) -> Optional[float]:
        return None if self.cpu_sender_s is None else self.cpu_sender_s / (self.file_bytes / GB)

    @property
    def cpu_receiver_per_gb(self) -> Optional[float]:
        """Mean CPU seconds per GB received, per receiver."""
        if self.cpu_receivers_s is None:
            return None
        return self.cpu_receivers_s / self.receivers / (self.file_bytes / GB)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cpu_sender_per_gb": self.cpu_sender_per_gb,
                "cpu_receiver_per_gb": self.cpu_receiver_per_gb,
                "vs_line_rate": self.seconds / self.line_rate_s if self.line_rate_s else None}


def _agent(lab: BridgeLab, host: int, out: Path, *args: str, env: Optional[dict[str, str]] = None,
           cwd: Optional[Path] = None) -> subprocess.Popen:
    """``modelcast ARGS`` in a host, the agent found at ``cwd`` (default: this checkout's);
    its --json line goes to OUT.json, its log to OUT.log."""
    with open(out.with_suffix(".json"), "w") as stdout, open(out.with_suffix(".log"), "w") as stderr:
        return lab.popen(host, sys.executable, "-m", "hostagent.cli", *args, stdout=stdout, stderr=stderr,
                         env=None if env is None else {**os.environ, **env}, cwd=cwd)


def _summary(out: Path) -> dict[str, Any]:
    try:
        lines = out.with_suffix(".json").read_text().strip().splitlines()
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}


def _tail(out: Path) -> str:
    """The last line an agent printed on stderr (where it says why it failed)."""
    try:
        lines = out.with_suffix(".log").read_text().strip().splitlines()
    except OSError:
        return ""
    return lines[-1][-300:] if lines else ""


def run_modelcast(lab: BridgeLab, model: ModelFile, receivers: list[int], rate: float,
                  work: Path, timeout: float, extra: tuple[str, ...] = (), rx_extra: tuple[str, ...] = (),
                  rx_env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None) -> Run:
    """The real CLI: receivers first (they wait for the stream), then the sender
    (``extra``: more sender options, ``rx_extra``: more receiver options, ``rx_env``:
    more of the receivers' environment)."""
    work.mkdir(parents=True, exist_ok=True)
    group = f"232.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"
    port = random.randint(20000, 60000)
    addr, src = f"{group}:{port}", lab.ip(0)
    key = str(make_key_file(work / "session.key"))  # authenticated, as a controller run is
    procs = {}
    for h in receivers:
        out = work / f"rx{h}.bin"
        procs[h] = (out, _agent(lab, h, work / f"recv-{h}", "recv", "--group", addr, "--source", src,
                                "--out", str(out), "--json", "--timeout", str(timeout), "--key-file", key,
                                *rx_extra, env=rx_env, cwd=cwd))
    joined_s = wait_joined(lab, receivers, group, started=time.monotonic(), timeout=timeout)
    link0 = B.tx_bytes(lab, 0)
    t0 = time.monotonic()
    sender = _agent(lab, 0, work / "send", "send", str(model.path), "--group", addr, "--interface",
                    src, "--receivers", str(len(receivers)), "--rate", f"{rate:g}", "--json",
                    "--timeout", str(timeout), "--key-file", key, *extra, cwd=cwd)
    done: dict[int, float] = {}
    deadline = t0 + timeout * 3
    marks: dict[str, Any] = {"joined_s": round(joined_s, 3)}
    while len(done) < len(procs) and time.monotonic() < deadline:
        for h, (_, p) in procs.items():
            if h not in done and p.poll() is not None:
                done[h] = time.monotonic() - t0
        time.sleep(0.002)
    try:
        sender.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        sender.kill()
    ok = sender.returncode == 0 and len(done) == len(procs)
    link = B.tx_bytes(lab, 0) - link0
    cpu_rx = sync_s = 0.0
    records = gro_batches = coalesced = 0
    rx_counts = dict.fromkeys(RX_COUNTS, 0)
    native: set[Optional[bool]] = set()
    errors = []
    for h, (out, p) in procs.items():
        if p.poll() is None:
            p.kill()
        s = _summary(work / f"recv-{h}")
        got = p.returncode == 0 and file_digest(out) == model.digest
        if not got:
            errors.append(f"h{h}: {s.get('error') or _tail(work / f'recv-{h}') or f'exit {p.returncode}'}")
        ok = ok and got
        cpu_rx += s.get("cpu_s") or 0.0
        records += s.get("resume_records") or 0
        gro_batches += s.get("gro_batches") or 0
        coalesced += s.get("coalesced") or 0
        native.add(s.get("native_rx"))
        sync_s += s.get("record_sync_s") or 0.0
        for k in RX_COUNTS:
            rx_counts[k] += s.get(k) or 0
        marks[f"h{h}"] = {k: round(v - t0, 3) for k, v in (s.get("clock") or {}).items()}
        out.unlink(missing_ok=True)
    s = _summary(work / "send")
    marks["sender"] = {k: round(v - t0, 3) for k, v in (s.get("clock") or {}).items()}
    return Run("", "modelcast", len(receivers), max(done.values(), default=float("nan")), ok,
               0.0, model.size, s.get("cpu_s"), cpu_rx, {f"h{h}": t for h, t in sorted(done.items())},
               {"repair_pct": 100 * (s.get("repair_bytes") or 0) / max(1, model.size),
                "rate_decreases": s.get("rate_decreases"), "goodput_mbit": s.get("goodput_mbit"),
                "error": "; ".join(([f"sender: {s['error']}"] if s.get("error") else []) + errors) or None,
                "resume_records": records, "record_sync_s": round(sync_s, 3),
                "gro_batches": gro_batches, "coalesced_runs": coalesced,
                "native_rx": native == {True},  # every receiver's clean-stream path ran in C
                # the sender's NIC counter (a GSO batch counts its headers once) and what
                # its datagrams take on a wire that carries them one by one
                "sender_link_bytes": link,
                "sender_wire_bytes": (s.get("bytes_sent") or 0) + FRAME_HEADERS * (s.get("datagrams_sent") or 0),
                "sender": {k: s.get(k) for k in SENDER_COUNTS}, "receivers_total": rx_counts,
                # the agents' own marks (SendResult.clock, ReceiveResult.clock), seconds from the sender's spawn
                "marks": marks})


def wait_joined(lab: BridgeLab, hosts: list[int], group: str, started: float, timeout: float,
                settle: float = 0.5) -> float:
    """Wait until every receiver host is a member of ``group`` (its kernel lists the
    group on the host's interface: the receiver started and joined), and at least
    ``settle`` seconds after ``started``; the seconds it took. The references are timed
    likewise from ready receivers (UFTP's daemons, the chain's nodes), and a deployment
    starts its receivers before the sender: the sender must not share the CPU with
    receivers still starting."""
    waiting = set(hosts)
    while waiting and time.monotonic() - started < timeout:
        waiting = {h for h in waiting if group not in lab.run(h, "ip", "maddr", "show", "dev", lab.host_iface(h),
                                                                 check=False).stdout.split()}
        if waiting:
            time.sleep(0.02)
    if waiting:
        raise LabError(f"receivers {sorted(waiting)} did not join {group} within {timeout:g} s")
    time.sleep(max(0.0, started + settle - time.monotonic()))
    return time.monotonic() - started


def _from_baseline(res: B.RunResult) -> Run:
    return Run("", res.method, res.receivers, res.seconds, res.ok, 0.0, res.file_bytes,
               res.cpu_sender_s, res.cpu_receivers_s, {},
               {"sender_link_bytes": res.sender_link_bytes, **res.detail})  # (which copies verified)


def one(method: str, lab: BridgeLab, model: ModelFile, receivers: list[int], rate: float,
        work: Path, index: int, mtu: int, timeout: float) -> Run:
    if method.startswith("modelcast"):
        res = run_modelcast(lab, model, receivers, rate, work, timeout,
                            rx_extra=NO_RECORD if method == "modelcast-norecord" else (),
                            rx_env=PURE_PYTHON if method == "modelcast-purepy" else None)
        res.method = method
        return res
    if method == "tcp":
        return _from_baseline(B.tcp_fanout(lab, 0, receivers, model.path, work, timeout=timeout))
    group = f"232.201.{index // 250}.{index % 250 + 1}"
    res = _from_baseline(B.uftp(lab, 0, receivers, model.path, work, group, rate, timeout=timeout,
                                mtu=mtu, cipher=B.UFTP_GCM if method == "uftp-gcm" else ("-Y", "none")))
    res.method = method
    return res


def speed(args: argparse.Namespace, work: Path, say: Any) -> list[Run]:
    ns = [int(x) for x in args.receivers.split(",")]
    runs: list[Run] = []
    with BridgeLab(1 + max(ns), mtu=args.mtu) as lab:
        impair.cap_rate(lab, 0, args.rate_cap, burst="2mb")
        model = make_model(work / "model.bin", int(args.size_mb * 1024 * 1024), seed=3)
        line = model.size * 8 / (args.rate_cap * 1e6)
        index = 0
        for n in ns:
            for r in range(args.runs):
                for method in in_turn(args.methods.split(","), r):
                    index += 1
                    res = one(method, lab, model, list(range(1, n + 1)), args.rate_cap,
                              work / f"speed-{method}-{n}-{r}", index, args.mtu, args.timeout)
                    res.scenario, res.line_rate_s = "speed", line
                    runs.append(res)
                    say(f"speed {method} N={n} run {r}: {'ok' if res.ok else 'FAILED'} "
                        f"{res.seconds:.2f} s = {res.seconds / line:.2f} x line rate")
    return runs


def asymmetry(args: argparse.Namespace, work: Path, say: Any) -> list[Run]:
    """One receiver of four drops 5% of its UDP at random; 1500 MTU, 150 Mbit/s."""
    size, rate, n = (8 if args.smoke else 32) * 1024 * 1024, 150.0, 4
    runs: list[Run] = []
    with BridgeLab(1 + n) as lab:
        impair.cap_rate(lab, 0, rate)
        model = make_model(work / "asym.bin", size, seed=4)
        line = size * 8 / (rate * 1e6)
        receivers = list(range(1, n + 1))
        for r in range(args.runs):
            for label, lossy in (("clean", False), ("one-lossy", True)):
                if lossy:
                    lab.add_loss(n, "random", pct=5.0)
                methods = ["modelcast", "uftp"] if lossy else ["modelcast"]
                for method in methods:
                    res = one(method, lab, model, receivers, rate, work / f"asym-{label}-{method}-{r}",
                              100 + len(runs), 1500, args.timeout)
                    res.scenario, res.line_rate_s = f"asymmetry-{label}", line
                    if lossy:
                        res.detail["dropped_at_lossy_receiver"] = lab.loss_dropped(n)
                    runs.append(res)
                    say(f"asymmetry {label} {method} run {r}: {'ok' if res.ok else 'FAILED'} "
                        f"{res.seconds:.2f} s = {res.seconds / line:.2f} x line rate")
                if lossy:
                    impair.clear(lab.ns(n), lab.veth(n))
    return runs


# Packets from the sender: 4 in a row of every 200 dropped. A packet is what enters the
# bridge, and a GSO send of 7 datagrams enters it as one: 32 MB is ~540 of them, the
# smoke's 8 MB ~135, so the smoke stalls every 50.
STALL_EVERY, STALL_COUNT = 200, 4


def stall(args: argparse.Namespace, work: Path, say: Any) -> list[Run]:
    """1% own loss at each of 4 receivers, alone and with a shared stall on the sender's
    bridge port; every NIC at 100 Mbit/s, MTU 9000, the agents at 95 Mbit/s."""
    size, cap, n = (8 if args.smoke else 32) * 1024 * 1024, 100.0, 4
    runs: list[Run] = []
    with BridgeLab(1 + n, mtu=9000) as lab:
        for h in range(1 + n):
            impair.cap_rate(lab, h, cap)
        for h in range(1, n + 1):
            impair.add(lab.ns(h), lab.veth(h), "random", all_ip=True)
        model = make_model(work / "stall.bin", size, seed=6)
        receivers = list(range(1, n + 1))
        for r in range(args.runs):
            for label in ("1pct", "1pct-stalled"):
                every = STALL_EVERY // 4 if args.smoke else STALL_EVERY
                table = impair.add_stall(lab.veth(0), every, STALL_COUNT) if label.endswith("stalled") else None
                try:
                    res = one("modelcast", lab, model, receivers, cap * 0.95, work / f"stall-{label}-{r}",
                              200 + len(runs), 9000, args.timeout)
                    res.detail["stall_dropped"] = impair.stall_dropped(table) if table else 0
                finally:
                    if table:
                        impair.clear_stall(table)
                res.scenario, res.line_rate_s = f"stall-{label}", size * 8 / (cap * 0.95e6)
                runs.append(res)
                say(f"stall {label} run {r}: {'ok' if res.ok else 'FAILED'} {res.seconds:.2f} s, "
                    f"{res.detail['rate_decreases']} rate decreases, {res.detail['repair_pct']:.1f}% repaired")
    return runs


def lanes(args: argparse.Namespace, work: Path, say: Any) -> list[Run]:
    """One transfer over 1 and over 2 lanes (``--lanes``), N=1, MTU 9000, the sender's
    NIC uncapped (``--lanes-cap 0``, the default) or capped above what one lane reaches:
    where one Python process per side is the limit, do two lanes finish sooner? Run twice:
    with the C receive path, and with a receiver without it (``MODELCAST_PURE_PYTHON=1``,
    a host where the extension was not built: a slower receiver). On a 2-core machine
    neither shows a gain -- one lane's sender, receiver and the kernel's receive work
    already fill both cores -- so the scenario answers how much lanes cost there, and
    shows the gain on hosts with cores to spare."""
    runs: list[Run] = []
    with BridgeLab(2, mtu=9000) as lab:
        if args.lanes_cap:
            impair.cap_rate(lab, 0, args.lanes_cap, burst="4mb")
        model = make_model(work / "lanes.bin", int(args.size_mb * 1024 * 1024), seed=5)
        rate = args.lanes_cap or LANES_RATE
        line = model.size * 8 / (rate * 1e6)
        for r in range(args.runs):
            for label, env in LANES_RECEIVERS:
                for k in (1, 2):
                    res = run_modelcast(lab, model, [1], rate, work / f"lanes-{k}-{r}", args.timeout,
                                        extra=("--lanes", str(k)), rx_extra=("--lanes", str(k)), rx_env=env)
                    res.scenario, res.method, res.line_rate_s = "lanes", f"modelcast --lanes {k}{label}", line
                    runs.append(res)
                    say(f"lanes {k}{label} run {r}: {'ok' if res.ok else 'FAILED'} {res.seconds:.2f} s = "
                        f"{model.size * 8 / res.seconds / 1e6:.0f} Mbit/s")
    return runs


# ------------------------------------------------------------------ the goal table (issue 47)


@dataclass(frozen=True)
class Case:
    """One row of the goal table: a kernel-bridge lab, a file and the methods timed on it
    in turn, run by run. Methods: ``modelcast`` (every receiver), ``modelcast@K`` (the
    first K), ``uftp`` (UFTP 4.10 at its best: closed group, ``-Y none``, blocks filling
    the MTU), ``chain`` (``bench.chain``), ``tcp-stream`` (one ``iperf3`` TCP stream to
    the first receiver: the kernel's own limit)."""

    key: str
    title: str
    size_mb: float
    receivers: int
    mtu: int
    cap: float  # Mbit/s: the sender NIC's tbf cap and every paced method's rate; 0: no cap
    methods: tuple[str, ...]
    cap_all: bool = False  # every host's NIC capped, not only the sender's
    loss: tuple[tuple[int, float], ...] = ()  # (receiver, % of datagrams dropped at random); 0: every receiver


CASES: dict[str, Case] = {c.key: c for c in (
    Case("a", "16 MB, 100 Mbit/s, 4 receivers", 16, 4, 1500, 100, ("modelcast", "modelcast@1", "uftp")),
    Case("b", "96 MB, 1 Gbit/s, MTU 9000, 4 receivers", 96, 4, 9000, 1000, ("modelcast", "modelcast@1", "uftp")),
    Case("c", "16 receivers each losing 1%, 100 Mbit/s, 32 MB", 32, 16, 9000, 100, ("modelcast", "uftp"),
         loss=((0, 1.0),)),
    Case("d", "8 receivers, 100 Mbit/s per host, 32 MB", 32, 8, 9000, 100, ("modelcast", "chain"), cap_all=True),
    Case("e", "one of 4 receivers at 5% loss, 150 Mbit/s, 32 MB", 32, 4, 1500, 150, ("modelcast", "uftp"),
         loss=((4, 5.0),)),
    Case("f", "no cap, MTU 9000, 256 MB, 1 and 2 receivers", 256, 2, 9000, 0,
         ("modelcast@1", "modelcast", "tcp-stream")),
)}


def tcp_stream(lab: BridgeLab, size: int, work: Path, port: int = 5201) -> Run:
    """One kernel TCP stream of ``size`` bytes from host 0 to host 1 (``iperf3 -n``): what
    the kernel moves between two namespaces with no file, hash or pacing in the way."""
    work.mkdir(parents=True, exist_ok=True)
    server = lab.popen(1, "iperf3", "-s", "-1", "-p", str(port), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    res = lab.run(0, "iperf3", "-c", lab.ip(1), "-p", str(port), "-n", str(size), "-J", check=False, timeout=120)
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
    try:
        end = json.loads(res.stdout)["end"]
        got = end["sum_received"]  # (the receiver's own count: its timer stops before the last bytes)
        return Run("", "tcp-stream", 1, float(got["seconds"]), int(end["sum_sent"]["bytes"]) >= size, 0.0, size,
                   detail={"gbit": got["bits_per_second"] / 1e9, "bytes": got["bytes"]})
    except (ValueError, KeyError) as exc:
        return Run("", "tcp-stream", 1, float("nan"), False, 0.0, size, detail={"error": f"iperf3: {exc}"})


BASELINE = " (baseline)"  # a method's suffix when the agent is another checkout's (--baseline)


def _case_run(case: Case, method: str, lab: BridgeLab, model: ModelFile, work: Path, index: int,
              timeout: float, baseline: Optional[Path] = None) -> Run:
    """One run of ``method`` in ``case``'s lab (``... (baseline)``: the agent at ``baseline``)."""
    receivers = list(range(1, case.receivers + 1))
    rate = case.cap or LANES_RATE
    if method.startswith("modelcast"):
        name = method.removesuffix(BASELINE)
        k = int(name.split("@")[1]) if "@" in name else case.receivers
        res = run_modelcast(lab, model, receivers[:k], rate, work, timeout,
                            cwd=baseline if method.endswith(BASELINE) else None)
        res.method = method
        return res
    if method == "uftp":
        group = f"232.{202 + ord(case.key) - ord('a')}.{index // 250}.{index % 250 + 1}"
        res = _from_baseline(B.uftp(lab, 0, receivers, model.path, work, group,
                                    rate, timeout=timeout, mtu=case.mtu))
        res.detail["sender_wire_bytes"] = res.detail["sender_link_bytes"]  # one frame per datagram
        return res
    if method == "chain":
        return _from_baseline(chain(lab, None, 0, receivers, model.path, work, timeout=timeout))
    if method == "tcp-stream":
        return tcp_stream(lab, model.size, work)
    raise ValueError(f"unknown method {method!r}")


def run_case(case: Case, runs: int, work: Path, timeout: float, say: Any, baseline: Optional[Path] = None) -> list[Run]:
    """Every method of ``case``, ``runs`` times in turn, on one lab (with ``baseline``,
    each modelcast method also by the agent there); each run records the datagrams the
    loss rules dropped during it."""
    out: list[Run] = []
    with BridgeLab(1 + case.receivers, mtu=case.mtu) as lab:
        for h in (range(1 + case.receivers) if case.cap_all else [0]):
            if case.cap:
                impair.cap_rate(lab, h, case.cap, burst="2mb" if case.cap >= 500 else "512kb")
        lossy: dict[int, float] = {}
        for h, pct in case.loss:
            lossy.update({r: pct for r in (range(1, case.receivers + 1) if h == 0 else [h])})
        for h, pct in lossy.items():
            lab.segment_towards(h)
            lab.add_loss(h, "random", pct=pct)
        model = make_model(work / f"goal-{case.key}.bin", int(case.size_mb * 1024 * 1024), seed=47)
        line = model.size * 8 / (case.cap * 1e6) if case.cap else 0.0
        methods = list(case.methods) + ([m + BASELINE for m in case.methods if m.startswith("modelcast")]
                                        if baseline else [])
        for r in range(runs):
            for method in in_turn(methods, r):
                before = {h: lab.loss_dropped(h) for h in lossy}
                res = _case_run(case, method, lab, model, work / f"goal-{case.key}-{method.replace(' ', '_')}-{r}",
                                len(out), timeout, baseline)
                res.scenario, res.line_rate_s = f"goal-{case.key}", line
                res.detail["run"] = r
                res.detail["dropped"] = {f"h{h}": lab.loss_dropped(h) - n for h, n in before.items()}
                out.append(res)
                say(f"case {case.key} {method} run {r}: {'ok' if res.ok else 'FAILED'} {res.seconds:.2f} s"
                    + (f" = {res.seconds / line:.2f} x line rate" if line else "")
                    + (f", sender wire {res.detail['sender_wire_bytes'] / model.size:.3f} x file"
                       if res.detail.get("sender_wire_bytes") else ""))
    return out


def _per_run(runs: list[Run], case: str, num: str, den: Optional[str], value: Any) -> Optional[float]:
    """Median over the runs of ``value(num run, den run)``, the two taken in the same run
    number (a ratio to a reference timed beside it); ``den`` None: ``value(num run, None)``."""
    got = []
    for r in (x for x in runs if x.scenario == f"goal-{case}" and x.method == num and x.ok):
        ref = None
        if den is not None:
            ref = next((x for x in runs if x.scenario == r.scenario and x.method == den and x.ok
                        and x.detail.get("run") == r.detail.get("run")), None)
            if ref is None:
                continue
        v = value(r, ref)
        if v is not None:
            got.append(v)
    return statistics.median(got) if got else None


def _clean_over_line(r: Run, _: Any) -> Optional[float]:
    """The slowest clean receiver's time over the line time (case e: does one lossy receiver hold the others?)."""
    lossy = set(r.detail.get("dropped") or {})
    clean = [t for h, t in r.receiver_seconds.items() if h not in lossy]
    return max(clean) / r.line_rate_s if clean else None


def _repairs_per_loss(r: Run, _: Any) -> Optional[float]:
    """Repair datagrams the sender sent (parity, unicast, multicast) per datagram the
    receivers lost, summed over receivers."""
    s, lost = r.detail.get("sender") or {}, sum((r.detail.get("dropped") or {}).values())
    n = sum(s.get(k) or 0 for k in ("repairs_parity", "repairs_unicast", "repairs_multicast"))
    return n / lost if lost else None


def _wire(r: Run, _: Any) -> Optional[float]:
    w = r.detail.get("sender_wire_bytes")
    return w / r.file_bytes if w else None


def goal_rows(runs: list[Run], baseline: bool = False) -> list[dict[str, Any]]:
    """The goal table: per case its figures (medians over runs of per-run ratios), the
    goal and whether it is met; ``baseline``: the baseline agent's runs against the same
    references."""
    if baseline:
        runs = [replace(r, method=r.method.removesuffix(BASELINE)) for r in runs
                if r.method.endswith(BASELINE) or not r.method.startswith("modelcast")]
    else:
        runs = [r for r in runs if not r.method.endswith(BASELINE)]
    t = lambda a, b: a.seconds / b.seconds  # noqa: E731
    over_line = lambda a, _: a.seconds / a.line_rate_s  # noqa: E731
    gbit = lambda a, _: a.detail.get("gbit") or a.file_bytes * 8 / a.seconds / 1e9  # noqa: E731
    rows: list[dict[str, Any]] = []

    def row(case: str, figure: str, value: Optional[float], goal: Optional[tuple[str, float]] = None,
            fmt: str = ".2f") -> None:
        met = None if goal is None or value is None else (value <= goal[1] if goal[0] == "<=" else value >= goal[1])
        rows.append({"case": case, "title": CASES[case].title, "figure": figure,
                     "value": None if value is None else round(value, 4), "fmt": ".3f" if goal else fmt,
                     "goal": None if goal is None else f"{goal[0]} {goal[1]:g}", "met": met})

    row("a", "modelcast T(4) / UFTP T(4)", _per_run(runs, "a", "modelcast", "uftp", t), ("<=", 1.0))
    row("a", "modelcast T(4) / line", _per_run(runs, "a", "modelcast", None, over_line))
    row("a", "UFTP T(4) / line", _per_run(runs, "a", "uftp", None, over_line))
    row("a", "modelcast T(4) / T(1)", _per_run(runs, "a", "modelcast", "modelcast@1", t))
    # MTU 1500: every 1,500-byte frame carries its headers (Ethernet, IP, UDP, the agent's own): UFTP's beside it
    row("a", "modelcast sender wire / file", _per_run(runs, "a", "modelcast", None, _wire), fmt=".3f")
    row("a", "UFTP sender wire / file", _per_run(runs, "a", "uftp", None, _wire), fmt=".3f")
    row("b", "modelcast T(4) / line", _per_run(runs, "b", "modelcast", None, over_line), ("<=", 1.15))
    row("b", "modelcast T(4) / UFTP T(4)", _per_run(runs, "b", "modelcast", "uftp", t))
    row("b", "modelcast T(4) / T(1)", _per_run(runs, "b", "modelcast", "modelcast@1", t))
    row("b", "modelcast sender wire / file", _per_run(runs, "b", "modelcast", None, _wire), ("<=", 1.02), ".3f")
    row("c", "modelcast sender wire / file", _per_run(runs, "c", "modelcast", None, _wire), ("<=", 1.08), ".3f")
    row("c", "modelcast T(16) / UFTP T(16)", _per_run(runs, "c", "modelcast", "uftp", t), ("<=", 1.0))
    row("c", "UFTP sender wire / file", _per_run(runs, "c", "uftp", None, _wire), fmt=".3f")
    row("c", "modelcast T(16) / line", _per_run(runs, "c", "modelcast", None, over_line))
    row("c", "repair datagrams per datagram lost", _per_run(runs, "c", "modelcast", None, _repairs_per_loss))
    row("d", "modelcast T(8) / chain T(8)", _per_run(runs, "d", "modelcast", "chain", t), ("<=", 1.0))
    row("d", "modelcast T(8) / line", _per_run(runs, "d", "modelcast", None, over_line))
    row("d", "chain T(8) / line", _per_run(runs, "d", "chain", None, over_line))
    row("d", "modelcast sender wire / file", _per_run(runs, "d", "modelcast", None, _wire), ("<=", 1.02), ".3f")
    row("e", "modelcast T(4) / line", _per_run(runs, "e", "modelcast", None, over_line), ("<=", 1.2))
    row("e", "modelcast T(4) / UFTP T(4)", _per_run(runs, "e", "modelcast", "uftp", t))
    row("e", "modelcast's clean receivers / line", _per_run(runs, "e", "modelcast", None, _clean_over_line))
    row("e", "repair datagrams per datagram lost", _per_run(runs, "e", "modelcast", None, _repairs_per_loss))
    over_tcp = lambda a, b: gbit(a, None) / gbit(b, None)  # noqa: E731
    row("f", "modelcast Gbit/s, 1 receiver / TCP stream's", _per_run(runs, "f", "modelcast@1", "tcp-stream", over_tcp),
        (">=", 0.35))
    row("f", "modelcast Gbit/s, 2 receivers / TCP stream's", _per_run(runs, "f", "modelcast", "tcp-stream", over_tcp))
    row("f", "modelcast Gbit/s, 1 receiver", _per_run(runs, "f", "modelcast@1", None, gbit), fmt=".1f")
    row("f", "modelcast Gbit/s, 2 receivers", _per_run(runs, "f", "modelcast", None, gbit), fmt=".1f")
    row("f", "TCP stream Gbit/s", _per_run(runs, "f", "tcp-stream", None, gbit), fmt=".1f")
    return [r for r in rows if r["value"] is not None]


def goals_markdown(rows: list[dict[str, Any]], meta: dict[str, Any],
                   base: Optional[list[dict[str, Any]]] = None) -> str:
    """The table; with ``base`` (the baseline agent's rows) a column for it."""
    before = {(r["case"], r["figure"]): r for r in base or []}
    out = [f"The agent's goal table (issue 47) — {describe(meta['machine'])} at the start, "
           f"{meta.get('load_end', '-')} at the end, {meta['date']}; kernel-bridge lab, medians over "
           f"{meta['runs']} runs of ratios taken within one run", "",
           "| case | figure | value | " + ("baseline | " if base else "") + "goal | met |",
           "|---|---|---|" + ("---|" if base else "") + "---|---|"]
    for r in rows:
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        b = before.get((r["case"], r["figure"]))
        cell = f"{format(b['value'], b['fmt'])} | " if b else ("- | " if base else "")
        out.append(f"| ({r['case']}) {r['title']} | {r['figure']} | {format(r['value'], r['fmt'])} | {cell}"
                   f"{r['goal'] or ''} | {met} |")
    return "\n".join(out) + "\n"


def goals(args: argparse.Namespace, work: Path, say: Any) -> list[Run]:
    """Every case of ``--cases``; with ``--smoke`` small files, at most 4 receivers, one run."""
    runs: list[Run] = []
    for key in args.cases:
        case = CASES[key]
        if args.smoke:
            # (the lossy cases at 16 MB: at 1% of a 4 MB file's ~470 datagrams a receiver
            # lost none about once in a hundred runs, and the smoke checks each one's loss)
            size = 32 if case.key == "f" else 16 if case.loss else 4
            case = Case(case.key, case.title, size, min(case.receivers, 4), case.mtu,
                        case.cap, case.methods, case.cap_all, case.loss)
        runs += run_case(case, args.runs, work, args.timeout, say,
                         Path(args.baseline).resolve() if args.baseline else None)
    return runs


def write_goals(out: Path, runs: list[Run], meta: dict[str, Any]) -> str:
    """agent-goals.json (every run, the table) and agent-goals.md in ``out``."""
    rows = goal_rows(runs)
    base = goal_rows(runs, baseline=True) if any(r.method.endswith(BASELINE) for r in runs) else None
    (out / "agent-goals.json").write_text(json.dumps(
        {"meta": meta, "runs": [r.as_dict() for r in runs], "table": rows, "baseline_table": base}, indent=1))
    md = goals_markdown(rows, meta, base)
    (out / "agent-goals.md").write_text(md)
    return md


def _median(values: list[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def medians(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    for key in sorted({(r.scenario, r.method, r.receivers) for r in runs}):
        rs = [r for r in runs if (r.scenario, r.method, r.receivers) == key]
        rows.append({"scenario": key[0], "method": key[1], "receivers": key[2],
                     "seconds": _median([r.seconds for r in rs]),
                     "line_rate_s": rs[0].line_rate_s,
                     "cpu_sender_per_gb": _median([r.cpu_sender_per_gb for r in rs]),
                     "cpu_receiver_per_gb": _median([r.cpu_receiver_per_gb for r in rs]),
                     "ok_runs": sum(r.ok for r in rs), "runs": len(rs)})
    return rows


def clean_receivers_ratio(runs: list[Run]) -> Optional[float]:
    """Median over runs of max over the clean receivers of (time with one lossy receiver /
    time in the clean run): 1.0 means the lossy receiver did not slow the others."""
    ratios = []
    clean = [r for r in runs if r.scenario == "asymmetry-clean" and r.method == "modelcast"]
    lossy = [r for r in runs if r.scenario == "asymmetry-one-lossy" and r.method == "modelcast"]
    for c, l in zip(clean, lossy):
        shared = [h for h in c.receiver_seconds if h in l.receiver_seconds and h != f"h{l.receivers}"]
        if shared:
            ratios.append(max(l.receiver_seconds[h] / c.receiver_seconds[h] for h in shared))
    return statistics.median(ratios) if ratios else None


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], runs: list[Run]) -> str:
    fmt = lambda v, f=".2f": "-" if v is None else format(v, f)  # noqa: E731
    out = [f"Host agent at line rate — {describe(meta['machine'])}, {meta['date']}",
           "",
           f"speed: {meta['size_mb']:g} MB, sender NIC capped at {meta['rate_cap']:g} Mbit/s, "
           f"MTU {meta['mtu']}, kernel-bridge lab; medians of {meta['runs']} runs",
           "",
           "| scenario | method | N | time (s) | x line rate | CPU s/GB sender | CPU s/GB per receiver | ok |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = r["seconds"] / r["line_rate_s"] if r["seconds"] and r["line_rate_s"] else None
        out.append(f"| {r['scenario']} | {r['method']} | {r['receivers']} | {fmt(r['seconds'])} | "
                   f"{fmt(ratio)} | {fmt(r['cpu_sender_per_gb'])} | {fmt(r['cpu_receiver_per_gb'])} | "
                   f"{r['ok_runs']}/{r['runs']} |")
    by = {(r["scenario"], r["method"], r["receivers"]): r["seconds"] for r in rows}
    t1, t4 = by.get(("speed", "modelcast", 1)), by.get(("speed", "modelcast", 4))
    out.append("")
    if t1 and t4:
        out.append(f"- modelcast T(4)/T(1) = {t4 / t1:.2f}")
    for m in ("tcp", "uftp", "uftp-gcm"):
        other = by.get(("speed", m, 4))
        if t4 and other:
            out.append(f"- modelcast T(4) / {m} T(4) = {t4 / other:.2f}")
    for label, _ in LANES_RECEIVERS:
        one = by.get(("lanes", f"modelcast --lanes 1{label}", 1))
        two = by.get(("lanes", f"modelcast --lanes 2{label}", 1))
        if one and two:
            out.append(f"- lanes{label} (N=1, {meta.get('lanes_cap') or 'no'} cap): T(2 lanes) / T(1 lane) = "
                       f"{two / one:.2f} ({meta['size_mb'] * 8 * 1.048576 / one:.0f} -> "
                       f"{meta['size_mb'] * 8 * 1.048576 / two:.0f} Mbit/s)")
    calm = [r for r in runs if r.scenario == "stall-1pct"]
    stalled = [r for r in runs if r.scenario == "stall-1pct-stalled"]
    if calm and stalled:
        cuts = fmt(_median([r.detail.get("rate_decreases") for r in stalled]), "g")
        slower = _median([s.seconds / c.seconds for c, s in zip(calm, stalled)])
        out.append(f"- stall: with a shared stall modelcast took {fmt(slower)} x its time without "
                   f"(median of runs), {cuts} rate decreases (median)")
    ratio = clean_receivers_ratio(runs)
    if ratio is not None:
        out.append(f"- asymmetry: the clean receivers took {ratio:.2f} x their clean-run time "
                   "while one receiver dropped 5% of its UDP")
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> int:
    say = stamp_printer()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(args.work) if args.work else Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    work = Path(tempfile.mkdtemp(prefix="modelcast-bench-agent-", dir=base))
    meta = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "size_mb": args.size_mb,
            "rate_cap": args.rate_cap, "mtu": args.mtu, "runs": args.runs,
            "receivers": args.receivers, "methods": args.methods, "lanes_cap": args.lanes_cap}
    say(f"benchmark: {meta}")
    # The agent as installed: pip byte-compiles a wheel at install time, so a process
    # start must not include compiling hostagent's sources (PYTHONDONTWRITEBYTECODE or
    # an editable install would otherwise add ~50 ms of CPU to every run).
    compileall.compile_dir(str(Path(hostagent.__file__).parent), quiet=1)
    if args.baseline:
        compileall.compile_dir(str(Path(args.baseline) / "hostagent"), quiet=1)
    try:
        # the model and every receiver's copy, twice over: what the largest transfer writes
        footprint = 2 * int(args.size_mb * (1 << 20)) * (1 + max(int(x) for x in args.receivers.split(",")))
        if args.goals or args.goals_only:  # and the goal table's largest (case f: 256 MB to 2)
            footprint = max(footprint, 2 * 256 * (1 << 20) * 3)
        with steady_memory(work, footprint) as steady:
            meta["memory"] = steady
            say(f"memory: a first write costs {steady['first_write_s_per_gb']} CPU-s/GB, a rewrite of "
                f"just-freed pages {steady['rewrite_s_per_gb']}; {footprint >> 20} MB touched up front in "
                f"{steady['warm_wall_s']} s, free page reporting "
                f"{'off' if steady['reporting_was'] is not None else 'left as it is'}")
            runs = [] if args.goals_only else speed(args, work, say)
            if args.lanes and not args.goals_only:
                runs += lanes(args, work, say)
            if args.asymmetry and not args.goals_only:
                runs += asymmetry(args, work, say)
            if args.stall and not args.goals_only:
                runs += stall(args, work, say)
            goal_runs = goals(args, work, say) if args.goals or args.goals_only else []
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    if goal_runs:
        print(write_goals(out, goal_runs, {**meta, "cases": "".join(args.cases), "smoke": args.smoke,
                                           "load_end": round(os.getloadavg()[0], 2)}))
    if args.goals_only:
        return exit_status(goal_runs, say)
    rows = medians(runs)
    (out / "agent.json").write_text(json.dumps(
        {"meta": meta, "runs": [r.as_dict() for r in runs], "medians": rows}, indent=1))
    md = markdown(rows, meta, runs)
    (out / "agent.md").write_text(md)
    print(md)
    return exit_status(runs + goal_runs, say)


def exit_status(runs: list[Run], say: Any) -> int:
    """Non-zero when a modelcast run failed, or a baseline failed without loss (the lab is
    broken). A baseline that loses a copy under injected loss is a result about that tool
    (UFTP leaves out a receiver that misses its announcement or status rounds): reported,
    and in the table as ok 0/1, not a failed benchmark."""
    status = 0
    for r in runs:
        if r.ok:
            continue
        if r.method.startswith("modelcast") or not (r.scenario.endswith("lossy") or r.detail.get("dropped")):
            status = 1
        else:
            missing = sorted(h for h, ok in (r.detail.get("verified") or {}).items() if not ok)
            say(f"note: {r.method} in {r.scenario} did not deliver every copy "
                f"(no verified copy at: {', '.join(map(str, missing)) or 'unknown'})")
    return status


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.agent", description=__doc__.splitlines()[0])
    # 256 MB: a Python process start (~0.1 s of CPU) is ~0.4 s/GB of it, not ~1 s/GB as on 96 MB.
    ap.add_argument("--size-mb", type=float, default=256)
    ap.add_argument("--rate-cap", type=float, default=1000, help="sender NIC cap, Mbit/s")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--receivers", default="1,4")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--methods", default=",".join(METHODS[:4]))
    ap.add_argument("--work", default=None, help="directory for the files (default /dev/shm)")
    ap.add_argument("--timeout", type=float, default=120, help="per transfer, seconds")
    ap.add_argument("--asymmetry", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the one-lossy-receiver scenario (default on)")
    ap.add_argument("--stall", action=argparse.BooleanOptionalAction, default=True,
                    help="also run 1%% loss with and without a shared stall, N=4 (default on)")
    ap.add_argument("--lanes", action=argparse.BooleanOptionalAction, default=True,
                    help="also run one transfer over 1 and 2 lanes, N=1 (default on)")
    ap.add_argument("--lanes-cap", type=float, default=0.0,
                    help="sender NIC cap in the lanes scenario, Mbit/s (0: none; --rate %g)" % LANES_RATE)
    ap.add_argument("--goals", action=argparse.BooleanOptionalAction, default=True,
                    help="also run issue 47's goal table, each case against its reference (default on)")
    ap.add_argument("--goals-only", action="store_true", help="only the goal table (agent-goals.md/.json)")
    ap.add_argument("--cases", default="".join(CASES), help="the goal table's cases (default %(default)s)")
    ap.add_argument("--baseline", default=None, metavar="CHECKOUT",
                    help="the goal table also runs the agent of this checkout (another commit's work tree, its "
                         "C extension built), in turn with this one")
    ap.add_argument("--out", default="docs/bench")
    ap.add_argument("--smoke", action="store_true", help="8 MB, N=1,2, one run (what CI runs)")
    args = ap.parse_args(argv)
    if set(args.cases) - set(CASES):
        print(f"error: unknown case(s) {args.cases}; use letters of {''.join(CASES)}", file=sys.stderr)
        return 2
    bad = set(args.methods.split(",")) - set(METHODS)
    if bad:
        print(f"error: unknown method(s) {', '.join(sorted(bad))}; use {', '.join(METHODS)}", file=sys.stderr)
        return 2
    if args.smoke:
        args.size_mb, args.receivers, args.runs = 8, "1,2", 1
    if os.geteuid() != 0:
        print("error: the benchmark builds network namespaces: run it as root", file=sys.stderr)
        return 1
    try:
        return run(args)
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
