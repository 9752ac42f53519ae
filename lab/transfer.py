"""One model file from a sender to many receivers through a controller-built tree, with
the real ``modelcast send`` / ``modelcast recv`` in host namespaces of a ``Fabric``.

``Transfer`` starts the agents, injects loss, watches progress on the wire, offers
mid-transfer hooks (wait for a fraction sent, kill/restart a receiver, late joiners,
IGMP-only receivers) and ``finish()`` -> ``TransferReport``, with every copy's digest
checked here, independently of the agents. ``make demo`` (``lab.demo``), the end-to-end
tests and the distribution benchmark all drive it, so what the demo shows is what CI
tests. Every process is started through the lab (killed by PID at teardown).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Callable, Iterable, Optional, Sequence

from hostagent.control import ControllerError
from lab.controller import VENV_BIN, Say
from lab.fabric import Fabric, PortCounters, natural
from lab.models import ModelFile, file_digest, make_key_file
from lab.probes import Capture
from lab.sh import LabError

# ------------------------------------------------------------------------ agents


@dataclass
class AgentRun:
    """One ``modelcast send|recv`` process in a host namespace."""

    host: str
    role: str
    argv: list[str]
    proc: subprocess.Popen
    stdout: Path
    stderr: Path
    started: float
    summary: Optional[dict] = None
    returncode: Optional[int] = None
    killed: bool = False

    @classmethod
    def start(cls, fabric: Fabric, host: str, role: str, argv: list[str], stem: Path) -> "AgentRun":
        """Run ``argv`` in ``host``'s namespace in a session of its own (stopped by PID),
        its stdout (the ``--json`` summary) in ``stem``.json and its log in ``stem``.log."""
        stdout, stderr = Path(f"{stem}.json"), Path(f"{stem}.log")
        with open(stdout, "w") as out, open(stderr, "w") as err:
            proc = fabric.live_lab().popen(host, *argv, stdout=out, stderr=err, start_new_session=True)
        return cls(host, role, argv, proc, stdout, stderr, time.monotonic())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.killed = True
        self.returncode = self.proc.returncode

    def wait(self, timeout: float) -> Optional[dict]:
        """Wait for exit; parse its one-line JSON summary. Kills it (by PID) on timeout."""
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait(10)
            raise LabError(f"{self.role} on {self.host} did not finish within {timeout:.0f}s; "
                              f"stderr: {self.stderr_tail()}") from None
        text = self.stdout.read_text(errors="replace").strip()
        if text:
            try:
                self.summary = json.loads(text.splitlines()[-1])
            except ValueError:
                self.summary = None
        return self.summary

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            return self.stderr.read_text(errors="replace")[-n:].strip()
        except OSError:
            return ""


# ------------------------------------------------------------------------ transfer


@dataclass
class ReceiverResult:
    host: str
    ip: str
    ok: bool  # exit 0, JSON digest_ok, and our own hash of the output matches
    digest: Optional[str]
    seconds: Optional[float]
    summary: Optional[dict]  # last run's JSON summary
    runs: int  # processes started for this receiver (2+ after a restart)
    join: str  # "rest" or "igmp"
    loss: Optional[str]  # loss method on its link, if any
    loss_dropped: Optional[int]
    error: Optional[str]
    summaries: list[dict] = field(default_factory=list)  # one per run that printed one


@dataclass
class TransferReport:
    name: str
    model: str
    size: int
    digest: str
    sender: str
    ok: bool
    seconds: float  # sender's transfer time (first datagram .. all verified / finished)
    wall: float  # sender process start .. last receiver verified, incl. REST and tree setup
    goodput_mbit: float
    sender_summary: Optional[dict]
    sender_link: PortCounters  # delta of OVS counters on the sender's switch port
    receivers: list[ReceiverResult]
    tree: str
    group: dict
    events: list[tuple[float, str]]
    probes: dict[str, int]  # non-receiver host -> multicast datagrams seen
    errors: list[str]

    @property
    def repair_pct(self) -> float:
        s = self.sender_summary or {}
        sent = s.get("bytes_sent") or 0
        return 100.0 * (s.get("repair_bytes") or 0) / sent if sent else 0.0

    def format(self) -> str:
        """A human-readable summary (the demo prints it; tests print it on failure)."""
        s = self.sender_summary or {}
        mb = self.size / 1e6
        link = self.sender_link
        lines = [
            f"transfer {self.name!r}: {'OK' if self.ok else 'FAILED'} -- model {self.model}, "
            f"{mb:.1f} MB, blake3 {self.digest[:16]}...",
            f"  time            {self.seconds:.2f} s sender transfer ({self.wall:.2f} s incl. "
            f"tree setup and last verification)",
            f"  goodput         {self.goodput_mbit:.1f} Mbit/s per receiver; "
            f"{self.goodput_mbit * len(self.receivers):.1f} Mbit/s delivered in total",
            f"  sender link     {link.rx_bytes / 1e6:.1f} MB / {link.rx_packets} packets into the "
            f"fabric (OVS port counters) = {link.rx_bytes / max(1, self.size):.3f} x the file "
            f"for {len(self.receivers)} receivers (unicast copies would be "
            f"{len(self.receivers)} x)",
            f"  repairs         {self.repair_pct:.2f}% of sent bytes ({s.get('repair_bytes', 0)} B: "
            f"{s.get('repair_bytes_unicast', 0)} unicast, {s.get('repair_bytes_multicast', 0)} "
            f"multicast), {s.get('nacks', 0)} NACKs",
            f"  group           {self.group.get('address')}:{self.group.get('port')} "
            f"(id {self.group.get('id')}, {self.group.get('algorithm')} tree)",
            "  tree            " + self.tree.replace("\n", "\n                  "),
            "  receivers",
        ]
        for r in self.receivers:
            sm = r.summary or {}
            extra = []
            if r.join != "rest":
                extra.append(f"joined by {r.join}")
            if r.runs > 1:
                extra.append(f"restarted, resumed {sm.get('resumed_chunks', 0)} chunks")
            if r.loss:
                extra.append(f"loss {r.loss}" + (f" ({r.loss_dropped} dropped)"
                                                 if r.loss_dropped is not None else ""))
            lines.append(
                f"    {r.host:5} {r.ip:11} {'verified' if r.ok else 'FAILED  '} "
                f"{(sm.get('goodput_mbit') or 0):6.1f} Mbit/s  nacks {sm.get('nacks', 0):4} "
                f"repairs {sm.get('repairs_received', 0):5}"
                + (f"  [{'; '.join(extra)}]" if extra else "")
                + (f"  error: {r.error}" if r.error else ""))
        for host, n in sorted(self.probes.items(), key=lambda x: natural(x[0])):
            lines.append(f"    {host:5} not a receiver: {n} multicast datagrams reached its NIC")
        if self.events:
            lines.append("  events          " + "; ".join(f"+{t:.2f}s {e}" for t, e in self.events))
        for e in self.errors:
            lines.append(f"  ERROR           {e}")
        return "\n".join(lines)


def agent_argv(fabric: Fabric, host: str, args: Sequence[str]) -> list[str]:
    """``modelcast ARGS`` as ``host`` runs it against the fabric's controller (admin
    token, the host's lab address, a ``--json`` summary on stdout)."""
    return [str(VENV_BIN / "modelcast"), *args, "--controller", fabric.url,
            "--token", fabric.controller.token, "--ip", fabric.ip(host), "--json"]


def _failure(run: AgentRun, timed_out: bool) -> str:
    """One line on why an agent failed: timeout, its JSON error, or its last stderr line."""
    if timed_out:
        return "still running at the deadline (killed)"
    err = (run.summary or {}).get("error")
    if err:
        return str(err)
    lines = run.stderr_tail(400).splitlines()
    return f"exit {run.returncode}" + (f": {lines[-1]}" if lines else "")


class Transfer:
    """One model file from ``sender`` to ``receivers`` through a controller-built tree.

    Typical use::

        with Transfer(fabric, model, "h1", ["h3", "h5"], rate=100, name="basic") as t:
            t.start_receivers()
            t.start_sender()
            report = t.finish()

    Receivers join over REST (``modelcast recv --controller``), or by IGMPv3 only
    (``--group ADDR:PORT`` without a controller; start those after the sender created
    the group). ``__exit__`` kills whatever is still running and deletes the group."""

    def __init__(self, fabric: Fabric, model: ModelFile, sender: str, receivers: Sequence[str],
                 rate: float, name: str = "transfer", workdir: Optional[Path] = None,
                 model_name: Optional[str] = None, expect_receivers: Optional[int] = -1,
                 shared_key: bool = False, chunk_size: Optional[int] = None,
                 sender_timeout: float = 60, receiver_timeout: float = 30,
                 say: Optional[Say] = None) -> None:
        self.fabric = fabric
        self.model = model
        self.sender_host = fabric.name(sender)
        self.receiver_hosts = [fabric.name(r) for r in receivers]
        self.rate = rate
        self.name = name
        self.workdir = Path(workdir or fabric.workdir / name)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.model_name = model_name or f"{name}-{model.digest[:12]}"
        # -1: expect every receiver (the sender waits for all to be installed and verified);
        # None: don't tell the sender (late joiners: it cannot wait for them up front).
        self.expect = len(self.receiver_hosts) if expect_receivers == -1 else expect_receivers
        self.key_file: Optional[Path] = None
        if shared_key:  # IGMP-only receivers cannot fetch the controller's session key
            self.key_file = make_key_file(self.workdir / "session.key")
        self.chunk_size = chunk_size
        self.sender_timeout = sender_timeout
        self.receiver_timeout = receiver_timeout
        self.say = say or fabric.say
        self.sender: Optional[AgentRun] = None
        self.runs: dict[str, list[AgentRun]] = {}
        self.join_kind: dict[str, str] = {}
        self.loss: dict[str, str] = {}
        self.probes: dict[str, Capture] = {}
        self.events: list[tuple[float, str]] = []
        self.group: dict = {}
        self.tree_text = ""
        self._t0: Optional[float] = None
        self._link0: Optional[PortCounters] = None
        self._wire0: int = 0
        self._rx0: dict[str, int] = {}
        self._finished = False

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # ---------------------------------------------------------------- setup

    def out_path(self, host: str) -> Path:
        """Where ``host`` writes the model: a file, or a directory for a model directory."""
        return self.workdir / (f"{host}-model" if self.model.path.is_dir() else f"{host}.bin")

    def _cli(self, *args: str) -> list[str]:
        return [str(VENV_BIN / "modelcast"), *args]

    def _start(self, host: str, role: str, argv: list[str]) -> AgentRun:
        n = len(self.runs.get(host, [])) if role == "recv" else 0
        return AgentRun.start(self.fabric, host, role, argv, self.workdir / f"{role}-{host}-{n}")

    def add_loss(self, host: str, kind: str) -> str:
        """Inject ``kind`` loss ("random" 1% / "bursty") on the link towards ``host``."""
        host = self.fabric.name(host)
        method = self.fabric.add_loss(host, kind)
        self.loss[host] = method
        self.say(f"[{self.name}] {kind} loss towards {host}: {method}")
        return method

    def start_probes(self, hosts: Iterable[str]) -> None:
        """Count multicast reaching hosts that are not receivers (should stay 0)."""
        for h in hosts:
            h = self.fabric.name(h)
            self.probes[h] = Capture(self.fabric.live_lab(), h, "232.0.0.0/8", self.workdir)
        self.say(f"[{self.name}] capturing multicast on non-receivers {sorted(self.probes, key=natural)}")

    def start_receiver(self, host: str, igmp: bool = False) -> AgentRun:
        """Start (or restart, same --out: it resumes) ``modelcast recv`` on ``host``."""
        host = self.fabric.name(host)
        ip = self.fabric.ip(host)
        src = self.fabric.ip(self.sender_host)
        args = ["recv", "--source", src, "--out", str(self.out_path(host)), "--ip", ip,
                "--json", "--timeout", str(self.receiver_timeout)]
        if igmp:
            g = self.wait_group_created()
            args += ["--group", f"{g['address']}:{g['port']}"]
        else:
            args += ["--controller", self.fabric.url, "--token", self.fabric.controller.token,
                     "--model", self.model_name]
        if self.key_file is not None:
            args += ["--key-file", str(self.key_file)]
        run = self._start(host, "recv", self._cli(*args))
        self.runs.setdefault(host, []).append(run)
        self.join_kind[host] = "igmp" if igmp else "rest"
        verb = "restarted" if len(self.runs[host]) > 1 else "started"
        text = (f"receiver {host} ({ip}) {verb}, pid {run.proc.pid}, joins by "
                f"{'IGMPv3 (no REST call)' if igmp else 'REST'}")
        if self._t0 is not None:  # mid-transfer: part of the report's timeline
            self.event(text)
        else:
            self.say(f"[{self.name}] {text}")
        return run

    def start_receivers(self, hosts: Optional[Iterable[str]] = None, wait_joined: bool = True,
                        timeout: float = 30) -> None:
        """Start REST receivers (default: all) and wait until the controller installed them."""
        hosts = [self.fabric.name(h) for h in (hosts if hosts is not None else self.receiver_hosts)]
        for h in hosts:
            self.start_receiver(h)
        if wait_joined and hosts:
            self.wait_installed([self.fabric.ip(h) for h in hosts], timeout)

    def wait_group_created(self, timeout: float = 30) -> dict:
        """The group for (model, sender) once somebody created it over REST."""
        src = self.fabric.ip(self.sender_host)
        self.group = self.fabric.controller.wait(
            lambda: self.fabric.find_group(self.model_name, src), lambda g: g is not None,
            f"[{self.name}] the group for {self.model_name} to be created", timeout, 0.1,
            check=self._check_alive, context=self._stderr_tails)
        return self.group

    def wait_installed(self, ips: Sequence[str], timeout: float = 30) -> dict:
        """Until the controller reports every ip in ``ips`` installed in the group."""
        gid = self.wait_group_created(timeout)["id"]
        client = self.fabric.controller.client
        g = self.fabric.controller.wait(
            lambda: client.get_group(gid),
            lambda g: all(g.get("receivers", {}).get(ip) == "installed" for ip in ips),
            f"[{self.name}] receivers {list(ips)} to be installed", timeout, 0.1,
            check=self._check_alive, context=self._stderr_tails)
        self.group = g
        self.tree_text = self.fabric.describe_tree(g)
        self.say(f"[{self.name}] controller installed group {g['id']} "
                 f"{g['address']}:{g['port']} for {len(g['receivers'])} receivers")
        return g

    def refresh_tree(self) -> dict:
        """Re-read the group (e.g. after a reroute) so the report shows the current tree."""
        self.group = self.fabric.controller.client.get_group(self.group["id"])
        self.tree_text = self.fabric.describe_tree(self.group)
        return self.group

    def _check_alive(self) -> None:
        for host, runs in self.runs.items():
            r = runs[-1]
            if not r.alive() and not r.killed and r.proc.returncode not in (0, None):
                raise LabError(f"[{self.name}] receiver {host} exited {r.proc.returncode}: "
                                  f"{r.stderr_tail()}")
        if self.sender is not None and not self.sender.alive() and self.sender.proc.returncode:
            raise LabError(f"[{self.name}] sender exited {self.sender.proc.returncode}: "
                              f"{self.sender.stderr_tail()}")

    def start_sender(self) -> AgentRun:
        """Start ``modelcast send``; it creates/looks up the group over REST, waits for the
        tree (and ``expect`` receivers), then streams at up to ``rate`` Mbit/s."""
        lab_host = self.sender_host
        args = ["send", str(self.model.path), "--controller", self.fabric.url,
                "--token", self.fabric.controller.token, "--model", self.model_name,
                "--ip", self.fabric.ip(lab_host), "--rate", str(self.rate), "--json",
                "--timeout", str(self.sender_timeout), "--poll", "0.1"]
        if self.expect is not None:
            args += ["--receivers", str(self.expect)]
        if self.key_file is not None:
            args += ["--key-file", str(self.key_file)]
        if self.chunk_size:
            args += ["--chunk-size", str(self.chunk_size)]
        self._link0 = self.fabric.port_counters(lab_host)
        self._wire0 = self.fabric.wire_bytes(lab_host, towards_host=False)
        self._rx0 = {h.name: self.fabric.wire_bytes(h.name, towards_host=True)
                     for h in self.fabric.topology.hosts}
        self.sender = self._start(lab_host, "send", self._cli(*args))
        self._t0 = time.monotonic()
        self.say(f"[{self.name}] sender {lab_host} started, pid {self.sender.proc.pid}: "
                 f"{self.model.size / 1e6:.1f} MB at <= {self.rate:g} Mbit/s to "
                 f"{self.expect if self.expect is not None else 'any number of'} receivers")
        return self.sender

    def event(self, text: str) -> None:
        t = time.monotonic() - (self._t0 or time.monotonic())
        self.events.append((t, text))
        self.say(f"[{self.name}] {text}")

    # ---------------------------------------------------------------- progress

    def sent_fraction(self) -> float:
        """Bytes the sender put on its link since it started, as a fraction of the file."""
        return (self.fabric.wire_bytes(self.sender_host, towards_host=False) - self._wire0) / self.model.size

    def received_fraction(self, host: str) -> float:
        """Bytes delivered to ``host``'s NIC since the sender started, per file size."""
        host = self.fabric.name(host)
        return (self.fabric.wire_bytes(host, towards_host=True) - self._rx0.get(host, 0)) / self.model.size

    def wait_until(self, pred: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise LabError(f"[{self.name}] timed out after {timeout:.0f}s waiting for {what}"
                                  f"\nsender: {self.sender.stderr_tail() if self.sender else '-'}")
            self._check_alive()
            time.sleep(0.005)

    def wait_sent(self, fraction: float, timeout: float = 60) -> None:
        """Block until the sender's link carried ``fraction`` of the file."""
        self.wait_until(lambda: self.sent_fraction() >= fraction,
                        f"the sender to send {fraction:.0%} of the file", timeout)

    def wait_received(self, host: str, fraction: float, timeout: float = 60) -> None:
        self.wait_until(lambda: self.received_fraction(host) >= fraction,
                        f"{host} to receive {fraction:.0%} of the file", timeout)

    def kill_receiver(self, host: str, sig: int = signal.SIGKILL) -> None:
        host = self.fabric.name(host)
        run = self.runs[host][-1]
        got = self.received_fraction(host)
        run.kill(sig)
        self.event(f"receiver {host} killed ({signal.Signals(sig).name}) after ~{got:.0%} arrived")

    # ---------------------------------------------------------------- finish

    def finish(self, timeout: float = 180) -> TransferReport:
        """Wait for the sender and every receiver, verify each output file's BLAKE3
        against the model, collect counters and build the report."""
        if self.sender is None:
            raise LabError("finish() before start_sender()")
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        results: list[ReceiverResult] = []
        for host in self.receiver_hosts:
            if host not in self.runs:
                errors.append(f"receiver {host} was never started")
        for host, runs in self.runs.items():
            run = runs[-1]
            timed_out = False
            try:
                run.wait(max(1.0, deadline - time.monotonic()))
            except LabError:
                timed_out = True
            s = run.summary or {}
            digest = file_digest(self.out_path(host))
            ok = run.returncode == 0 and bool(s.get("digest_ok")) and digest == self.model.digest \
                and s.get("file_digest") == self.model.digest
            err = None
            if not ok:
                err = _failure(run, timed_out) if run.returncode != 0 or timed_out else \
                    f"output digest {digest and digest[:16]} != model {self.model.digest[:16]}"
                errors.append(f"receiver {host}: {err}")
            method = self.loss.get(host)
            results.append(ReceiverResult(
                host=host, ip=self.fabric.ip(host), ok=ok, digest=digest,
                seconds=s.get("seconds"), summary=run.summary, runs=len(runs),
                join=self.join_kind.get(host, "rest"), loss=method,
                loss_dropped=self.fabric.loss_dropped(host, method) if method else None,
                error=err, summaries=[r.summary for r in runs if r.summary]))
        timed_out = False
        try:
            self.sender.wait(max(1.0, deadline - time.monotonic()))
        except LabError:
            timed_out = True
        wall = time.monotonic() - self.sender.started  # all agents have exited by now
        s = self.sender.summary or {}
        if self.sender.returncode != 0 or timed_out:
            errors.append(f"sender {self.sender_host}: {_failure(self.sender, timed_out)}")
        link = self.fabric.port_counters(self.sender_host) - (self._link0 or PortCounters())
        probes = {h: p.stop() for h, p in self.probes.items()}
        self.probes.clear()
        for h, n in probes.items():
            if n:
                errors.append(f"non-receiver {h} got {n} multicast datagrams")
        results.sort(key=lambda r: natural(r.host))
        self._finished = True
        report = TransferReport(
            name=self.name, model=self.model_name, size=self.model.size, digest=self.model.digest,
            sender=self.sender_host, ok=not errors and all(r.ok for r in results) and bool(results),
            seconds=float(s.get("seconds") or 0.0), wall=wall,
            goodput_mbit=float(s.get("goodput_mbit") or 0.0), sender_summary=self.sender.summary,
            sender_link=link, receivers=results, tree=self.tree_text or "(not captured)",
            group=self.group, events=self.events, probes=probes, errors=errors)
        self.say(f"[{self.name}] {'all ' + str(len(results)) + ' receivers verified' if report.ok else 'FAILED'}"
                 f" in {report.seconds:.2f}s")
        return report

    def _stderr_tails(self) -> str:
        parts = []
        for host, runs in self.runs.items():
            parts.append(f"--- {host}: {runs[-1].stderr_tail(600)}")
        if self.sender:
            parts.append(f"--- sender: {self.sender.stderr_tail(600)}")
        return "\n".join(parts)

    def close(self) -> None:
        """Kill what still runs (by PID), stop probes, remove loss rules, delete the group."""
        for runs in self.runs.values():
            for run in runs:
                if run.alive():
                    run.kill(signal.SIGKILL)
        if self.sender is not None and self.sender.alive():
            self.sender.kill(signal.SIGKILL)
        for p in self.probes.values():
            try:
                p.stop()
            except (LabError, subprocess.TimeoutExpired):
                p.proc.kill()
        self.probes.clear()
        if self.fabric.lab is not None:
            for host in self.loss:
                self.fabric.clear_loss(host)
        self.loss.clear()
        try:
            if self.fabric.controller.proc is not None:
                g = self.fabric.find_group(self.model_name, self.fabric.ip(self.sender_host))
                if g is not None:
                    self.fabric.controller.client.delete_group(g["id"])
        except ControllerError:
            pass
