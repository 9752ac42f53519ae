"""``modelcast-controller`` as a subprocess of a lab, test or benchmark: its own free
ports, state file and log; every REST wait goes through the agent's ``ControllerClient``
(the one polling loop)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import requests

from hostagent.control import ControllerClient, ControllerError
from lab.sh import LabError, free_port

VENV_BIN = Path(sys.executable).parent
Say = Callable[[str], None]


def stamp_printer(t0: Optional[float] = None, stream: Any = None) -> Say:
    """A ``say`` that prints ``[ 12.3s] text`` (seconds since ``t0``) and flushes, so a
    long run shows what it is doing as it goes."""
    start = time.monotonic() if t0 is None else t0

    def say(text: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {text}", file=stream or sys.stdout, flush=True)

    return say


def quiet(text: str) -> None:
    """A ``say`` that says nothing."""


class Controller:
    """``modelcast-controller`` with its own ports, state file and log; REST on
    ``rest_host`` (loopback unless set to a lab's management gateway before ``start``)."""

    def __init__(self, workdir: Path, token: str = "test-token", algorithm: str = "spt",
                 say: Say = quiet, args: Sequence[str] = (), store: str | None = None,
                 name: str = "controller") -> None:
        self.of_port = free_port()
        self.rest_port = free_port()
        self.rest_host = "127.0.0.1"
        self.workdir = Path(workdir)
        self.name = name
        self.store = store  # etcd://...: one of several instances (no state file)
        self.state = self.workdir / f"{name}-state.json"
        self.token = token
        self.algorithm = algorithm
        self.args = list(args)  # more controller options (e.g. --no-protection); read on start
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []
        self.say = say

    @property
    def url(self) -> str:
        return f"http://{self.rest_host}:{self.rest_port}"

    @property
    def of_target(self) -> str:
        return f"tcp:127.0.0.1:{self.of_port}"

    @property
    def client(self) -> ControllerClient:
        """The host agent's own REST client, with this controller's token."""
        return ControllerClient(self.url, token=self.token)

    def start(self) -> None:
        """Start and wait (<= 30 s) until /v1/health answers; on failure raise with the log."""
        logf = self.workdir / f"{self.name}-{len(self.logs)}.log"
        self.logs.append(logf)
        cmd = self.command()
        with open(logf, "w") as out:
            # Own session: a terminal's Ctrl-C reaches only the orchestrating process,
            # which then stops everything in order (this process by PID).
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.say(f"controller: started pid {self.proc.pid} (OpenFlow {self.of_target}, "
                 f"REST {self.url}, log {logf})")

        def alive() -> None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise LabError(f"controller exited {self.proc.returncode}:\n{self.log_text()}")

        try:
            self.client.wait_until(lambda: self.client._call("GET", "/v1/health"), lambda _: True,
                                   "the controller's REST API", timeout=30, poll=0.2,
                                   unreachable_ok=True, check=alive)
        except ControllerError as exc:
            raise LabError(f"{exc}\n{self.log_text()}") from None

    def command(self) -> list[str]:
        """The command line ``start`` runs (a test that runs a documented one overrides it)."""
        return [str(VENV_BIN / "modelcast-controller"), "--ofp-tcp-listen-port", str(self.of_port),
                "--ofp-listen-host", "127.0.0.1", "--wsapi-host", self.rest_host,
                "--wsapi-port", str(self.rest_port),
                *(["--store", self.store] if self.store else ["--state-file", str(self.state)]),
                "--token", self.token, "--algorithm", self.algorithm,
                # (lab tests fail links again and again to measure each failure alike)
                "--flap-damping", "0", *self.args]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop our controller process (by PID) with ``sig``; SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.say(f"controller: sending {signal.Signals(sig).name} to pid {self.proc.pid}")
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace")[-6000:] for p in self.logs if p.exists())

    def api(self, method: str, path: str, **kw: Any) -> requests.Response:
        """A raw HTTP call with the token, for tests that assert on status codes."""
        headers = kw.pop("headers", {})
        headers.setdefault("Authorization", f"Bearer {self.token}")
        kw.setdefault("timeout", 15)
        return requests.request(method, self.url + path, headers=headers, **kw)

    def wait_topology(self, switches: int, links: int, timeout: float = 30) -> dict:
        """Until LLDP found ``switches`` switches and ``links`` links that are up."""
        def done(topo: dict) -> bool:
            up = [link for link in topo.get("links", []) if link.get("up", True)]
            return len(topo.get("switches", [])) >= switches and len(up) >= links

        return self.wait(self.client.topology, done,
                          f"{switches} switches and {links} links to be discovered", timeout, 0.3)

    def wait_group(self, gid: int, pred: Callable[[dict], bool], timeout: float = 15,
                   what: str = "the expected state") -> dict:
        """Until group ``gid`` satisfies ``pred``."""
        return self.wait(lambda: self.client.get_group(gid), pred, f"group {gid} to reach {what}",
                          timeout, 0.05)

    def wait(self, fetch: Callable[[], Any], pred: Callable[[Any], bool], what: str,
             timeout: float, poll: float = 0.2, check: Optional[Callable[[], None]] = None,
             context: Callable[[], str] = lambda: "") -> Any:
        """``ControllerClient.wait_until`` through a (re)starting controller; a timeout
        is a LabError that carries ``context()`` (default: the controller's log)."""
        try:
            return self.client.wait_until(fetch, pred, what, timeout, poll, unreachable_ok=True,
                                          check=check)
        except ControllerError as exc:
            raise LabError(f"{exc}\n{context() or self.log_text()}") from None
