"""The one shell runner, error type, availability check and cleanup helpers of every lab.

Everything a lab does to the machine goes through ``sh`` so a failure always reads the
same way: what it was for, the command as the user would type it, and its stderr.
Processes are stopped by PID (ours only), never by name.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from typing import Any, Optional, Self, Sequence

log = logging.getLogger("modelcast.lab")

VSCTL = ("ovs-vsctl", "--timeout=20")
HOST_IFACE = "eth0"  # every lab host's data-plane interface, as in Mininet


class LabError(RuntimeError):
    """Building, using, checking or tearing down a lab failed; the message names the step,
    the command and its stderr, so a failure is diagnosable from a CI log alone."""


def fmt(cmd: Sequence[Any]) -> str:
    """A command as a user would type it."""
    return " ".join(shlex.quote(str(c)) for c in cmd)


def sh(cmd: Sequence[Any], check: bool = True, timeout: float = 30, what: str = "",
       shown: Sequence[Any] | None = None, **popen_kw: Any) -> subprocess.CompletedProcess:
    """Run a command (output captured as text unless the caller redirects it) and turn a
    failure into a LabError with context: ``what`` it was for and the command as the user
    would recognise it (``shown``, e.g. without the ``ip netns exec`` prefix)."""
    cmd = [str(c) for c in cmd]
    pretty = fmt(shown if shown is not None else cmd)
    prefix = f"{what}: " if what else ""
    popen_kw.setdefault("text", True)
    if "stdout" not in popen_kw and "stderr" not in popen_kw:
        popen_kw.setdefault("capture_output", True)
    log.debug("$ %s", fmt(cmd))
    try:
        proc = subprocess.run(cmd, timeout=timeout, **popen_kw)
    except FileNotFoundError as exc:
        raise LabError(f"{prefix}command not found: {cmd[0]} (running `{pretty}`)") from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{prefix}`{pretty}` timed out after {timeout}s; output: "
                       f"{exc.stdout!r} {exc.stderr!r}") from exc
    if check and proc.returncode != 0:
        raise LabError(f"{prefix}`{pretty}` exited {proc.returncode}: "
                       f"{(proc.stderr or proc.stdout or '').strip()}")
    return proc


# ------------------------------------------------------------------------- availability

def unavailable(ovs: bool = True) -> Optional[str]:
    """None if this process can build a lab, else the precise reason: root, ``ip netns``
    and, with ``ovs``, ``ethtool`` and a reachable ovs-vswitchd offering the userspace
    (netdev) datapath. The kernel-bridge lab needs only the first two (``ovs=False``)."""
    if os.geteuid() != 0:
        return f"the lab needs root (running as uid {os.geteuid()})"
    tools = ("ip", "tc") + (("ovs-vsctl", "ethtool") if ovs else ())
    for tool in tools:
        if shutil.which(tool) is None:
            return (f"`{tool}` is not on PATH (install openvswitch-switch, iproute2, ethtool; "
                    "see scripts/lab-deps.sh)")
    try:
        sh(["ip", "netns", "list"], timeout=10, what="`ip netns` unusable")
        if ovs:
            try:
                sh([VSCTL[0], "--timeout=5", "show"], timeout=10, what="ovs-vsctl unreachable")
                types = sh([VSCTL[0], "--timeout=5", "get", "Open_vSwitch", ".",
                            "datapath_types"], timeout=10).stdout
            except LabError as exc:
                return (f"{exc} -- is ovs-vswitchd running? start it with "
                        "`/usr/share/openvswitch/scripts/ovs-ctl start --system-id=random`")
            if "netdev" not in types:
                return (f"ovs-vswitchd does not offer the userspace datapath (datapath_types="
                        f"{types.strip()}); the lab needs datapath_type=netdev")
    except LabError as exc:
        return str(exc)
    return None


def require(ovs: bool = True) -> None:
    """Raise LabError with the reason unless ``unavailable(ovs)`` is None."""
    reason = unavailable(ovs)
    if reason:
        raise LabError(reason)


# ------------------------------------------------------------------------- processes

def stop_processes(procs: list[subprocess.Popen], grace: float = 3) -> None:
    """SIGTERM our processes (by PID), then SIGKILL whatever is still running after
    ``grace`` seconds in all."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_netns_pids(ns: str) -> list[int]:
    """Processes still running inside one of *our* namespaces (e.g. forked by a child we
    started) would keep it alive: SIGTERM, then SIGKILL, by PID. Returns those signalled."""
    pids = [int(p) for p in sh(["ip", "netns", "pids", ns], check=False).stdout.split()
            if p.isdigit()]
    signalled: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            break
        signalled = sorted(set(signalled) | set(alive))
        time.sleep(0.2)
        pids = alive
    return signalled


def leftovers(base: str) -> list[str]:
    """Namespaces, OVS bridges or interfaces whose name starts with a lab's ``base``
    (prefix + tag): what a teardown must have removed."""
    found: list[str] = []
    cmds = [["ip", "netns", "list"], ["ip", "-o", "link"]]
    if shutil.which(VSCTL[0]):
        cmds.append([*VSCTL[:1], "--timeout=10", "list-br"])
    for cmd in cmds:
        out = sh(cmd, check=False, timeout=20).stdout
        for line in out.splitlines():
            words = line.replace(":", " ").replace("@", " ").split()
            found += [w for w in words if w.startswith(base)]
    return sorted(set(found))


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """An unused loopback port (bind to 0), TCP by default; ``socket.SOCK_DGRAM`` for UDP."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NetnsHosts:
    """What every lab offers for its hosts (one network namespace each): run or start a
    command inside a host, and stop exactly the processes it started, by PID. Subclasses
    say how a host maps to its namespace (``ns``)."""

    base = ""  # prefix + tag: the start of every name the lab creates

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []

    def start(self) -> None:
        """Build the lab; on any failure tear down what was built and raise."""
        raise NotImplementedError

    def stop(self) -> None:
        """Remove exactly what the lab made; idempotent."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def ns(self, host: Any) -> str:
        """The network namespace of ``host``."""
        raise NotImplementedError

    def ip(self, host: Any) -> str:
        """The data-plane IPv4 address of ``host``."""
        raise NotImplementedError

    def host_iface(self, host: Any) -> str:
        """The host's data-plane interface inside its namespace (always ``eth0``)."""
        self.ns(host)
        return HOST_IFACE

    def cmd(self, host: Any, *cmd: Any) -> list[str]:
        """``cmd`` as it runs inside ``host``'s namespace."""
        return ["ip", "netns", "exec", self.ns(host), *map(str, cmd)]

    def run(self, host: Any, *cmd: Any, check: bool = True, timeout: float = 30,
            **popen_kw: Any) -> subprocess.CompletedProcess:
        """Run ``cmd`` in a host's namespace and wait. Output is captured as text unless
        overridden; with ``check`` a non-zero exit raises LabError with its stderr."""
        return sh(self.cmd(host, *cmd), check, timeout, f"[{host}]", shown=cmd, **popen_kw)

    def popen(self, host: Any, *cmd: Any, **kw: Any) -> subprocess.Popen:
        """Start ``cmd`` in the background in a host's namespace; ``stop_procs`` (and the
        lab's teardown) kills it by PID."""
        proc = subprocess.Popen(self.cmd(host, *cmd), **kw)  # `ip netns exec` execs: same PID
        self._procs.append(proc)
        log.info("lab %s: [%s] started pid %d: %s", self.base, host, proc.pid, fmt(cmd))
        return proc

    def stop_procs(self) -> None:
        """Stop every process this lab started that still runs (SIGTERM, then SIGKILL)."""
        for proc in self._procs:
            if proc.poll() is None:
                log.info("lab %s: stopping pid %d (%s)", self.base, proc.pid,
                         fmt(proc.args) if isinstance(proc.args, list) else proc.args)
        stop_processes(self._procs)
        self._procs = []

    def kill_ns(self, ns: str) -> None:
        """Kill what still runs inside one of our namespaces (e.g. forked by our children)."""
        killed = kill_netns_pids(ns)
        if killed:
            log.info("lab %s: killed leftover processes %s in %s", self.base, killed, ns)
