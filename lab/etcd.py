"""A throw-away single-node etcd for labs and tests (Debian's ``etcd-server``, 3.4+):
its own free ports and data directory, stopped by PID; ``restart`` keeps the data (an
etcd restarted mid-run, as the controller HA test needs). A start that fails stops the
process it started before it raises; ``with Etcd(dir) as etcd:`` stops it on the way out."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Optional

import requests

from lab.sh import LabError, free_port

ETCD = "etcd"


def available() -> str | None:
    """Why etcd cannot run here (None: it can)."""
    return None if shutil.which(ETCD) else "etcd is not installed (apt-get install etcd-server)"


class Etcd:
    def __init__(self, workdir: Path) -> None:
        self.workdir = Path(workdir)
        self.data = self.workdir / "etcd-data"
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def store_url(self) -> str:
        return f"etcd://{self.endpoint}"

    def __enter__(self) -> "Etcd":
        self.start()
        return self

    def __exit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.stop()

    def start(self, timeout: float = 20) -> None:
        """Start (or start again over the same data) and wait until it serves; if it does
        not, stop it (by PID) and raise LabError with its log."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        log = self.workdir / f"etcd-{self.starts}.log"
        self.starts += 1
        client = f"http://{self.endpoint}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [ETCD, "--name", "lab", "--data-dir", str(self.data),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"lab={peer}"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(f"etcd exited {self.proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if requests.get(f"{client}/health", timeout=1).json().get("health") in ("true", True):
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.1)
        raise LabError(f"etcd did not become healthy in {timeout:g} s:\n{log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop our etcd process by PID (SIGKILL after 10 s). Safe to call again."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()
