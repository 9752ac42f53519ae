"""The lab fixtures stop what they started when a start or a teardown step fails: the
controller lab (tests/support/controller_lab.py) and the throw-away etcd (lab/etcd.py).
No root and no lab needed: the controller and the OVS lab are stand-ins that record what
was done to them, etcd is a script that never gets healthy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import topologies as T
from lab import etcd as lab_etcd
from lab.sh import LabError
from tests.support import controller_lab as support


class Recorder:
    """Stand-ins for lab.controller.Controller and lab.ovs.Lab sharing one log; ``fail``
    names the steps that raise ("controller.start", "lab.stop", ...)."""

    def __init__(self, fail: set[str]) -> None:
        self.fail, self.log = fail, []
        recorder = self

        class Part:
            name = ""

            def __init__(self, *args: object, **kwargs: object) -> None:
                self.of_target = "tcp:127.0.0.1:6653"

            def _do(self, step: str) -> None:
                recorder.log.append(f"{self.name}.{step}")
                if f"{self.name}.{step}" in recorder.fail:
                    raise LabError(f"{self.name}.{step} failed")

            def start(self) -> None:
                self._do("start")

            def stop(self) -> None:
                self._do("stop")

            def wait_topology(self, **kwargs: object) -> None:
                self._do("wait_topology")

        self.Controller = type("Controller", (Part,), {"name": "controller"})
        self.Lab = type("Lab", (Part,), {"name": "lab"})


@pytest.fixture
def parts(monkeypatch: pytest.MonkeyPatch):
    def make(*fail: str) -> Recorder:
        rec = Recorder(set(fail))
        monkeypatch.setattr(support, "need_lab", lambda: None)
        monkeypatch.setattr(support, "Controller", rec.Controller)
        monkeypatch.setattr(support, "Lab", rec.Lab)
        return rec
    return make


TOPO = T.parse("linear:2")


def test_a_clean_run_stops_the_lab_then_the_controller(parts, tmp_path: Path) -> None:
    rec = parts()
    with support.controller_lab(TOPO, tmp_path):
        assert rec.log == ["controller.start", "lab.start", "controller.wait_topology"]
    assert rec.log[-2:] == ["lab.stop", "controller.stop"]


@pytest.mark.parametrize("failing", ["controller.start", "lab.start", "controller.wait_topology"])
def test_a_start_that_fails_half_way_stops_what_it_started(parts, tmp_path: Path, failing: str) -> None:
    rec = parts(failing)
    with pytest.raises(LabError, match=failing):
        with support.controller_lab(TOPO, tmp_path):
            pytest.fail("the body must not run")
    started = [step.split(".")[0] for step in rec.log if step.endswith(".start")]
    assert [step for step in rec.log if step.endswith(".stop")] == [f"{p}.stop" for p in reversed(started)]


def test_the_controller_is_stopped_when_the_labs_teardown_raises(parts, tmp_path: Path) -> None:
    rec = parts("lab.stop")
    with pytest.raises(LabError, match="lab.stop"):
        with support.controller_lab(TOPO, tmp_path):
            pass
    assert rec.log[-2:] == ["lab.stop", "controller.stop"]


def test_the_controller_is_stopped_when_the_test_body_and_the_labs_teardown_fail(parts, tmp_path: Path) -> None:
    rec = parts("lab.stop")
    with pytest.raises(LabError):
        with support.controller_lab(TOPO, tmp_path):
            raise AssertionError("the test failed")
    assert rec.log[-1] == "controller.stop"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


class Watched(lab_etcd.Etcd):
    """An Etcd that keeps each process it stops, to look at afterwards."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.stopped: list = []

    def stop(self, sig: int = lab_etcd.signal.SIGTERM) -> None:
        if self.proc is not None:
            self.stopped.append(self.proc)
        super().stop(sig)


def fake_etcd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str) -> None:
    fake = tmp_path / "etcd"
    fake.write_text(f"#!/bin/sh\n{script}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(lab_etcd, "ETCD", str(fake))


@pytest.mark.parametrize("script, reason", [("exec sleep 60", "did not become healthy"), ("exit 3", "exited 3")])
def test_an_etcd_that_never_serves_is_stopped_before_start_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                  script: str, reason: str) -> None:
    fake_etcd(monkeypatch, tmp_path, script)
    etcd = Watched(tmp_path)
    with pytest.raises(LabError, match=reason):
        etcd.start(timeout=1.0)
    (proc,) = etcd.stopped
    assert etcd.proc is None and proc.poll() is not None and not _alive(proc.pid)
    etcd.stop()  # (and stopping again is harmless)
    assert len(etcd.stopped) == 1


def test_with_stops_etcd_when_the_block_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``with Etcd(dir)`` on a stand-in that is healthy at once (its health check answered
    by a patched ``requests.get``): the process is gone after a failing block."""
    fake_etcd(monkeypatch, tmp_path, "exec sleep 60")

    class Healthy:
        def json(self) -> dict:
            return {"health": "true"}

    monkeypatch.setattr(lab_etcd.requests, "get", lambda *a, **k: Healthy())
    with pytest.raises(RuntimeError):
        with lab_etcd.Etcd(tmp_path) as etcd:
            proc = etcd.proc
            assert proc is not None and proc.poll() is None
            raise RuntimeError("the test failed")
    assert proc.poll() is not None and etcd.proc is None
