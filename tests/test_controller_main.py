"""``modelcast-controller`` rejects bad input with one clear line and a non-zero exit."""

import subprocess
import sys
from pathlib import Path

import pytest

from lab.sh import free_port

EXE = str(Path(sys.executable).parent / "modelcast-controller")


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args,needle", [
    (["--algorithm", "ospf"], "--algorithm must be one of spt, steiner"),
    (["--udp-port", "70000"], "--udp-port must be 1..65535"),
    (["--host-timeout", "0"], "--host-timeout must be 1..65535 s"),
    (["--audit-interval", "-1"], "--audit-interval must be >= 0 s"),
    (["--state-file", "/nonexistent-dir/state.json"], "does not exist"),
    (["--no-such-option"], "unrecognized arguments"),
    (["--ofp-tcp-listen-port", "x"], "Invalid Integer value"),
])
def test_bad_options_exit_nonzero_with_a_clear_message(args, needle):
    proc = run(*args)
    assert proc.returncode != 0
    assert needle in proc.stderr + proc.stdout


def test_unreadable_state_file_stops_the_controller(tmp_path):
    state = tmp_path / "state.json"
    state.write_text("{not json")
    proc = run("--state-file", str(state), "--ofp-tcp-listen-port", str(free_port()),
               "--wsapi-host", "127.0.0.1", "--wsapi-port", str(free_port()))
    assert proc.returncode == 2
    assert "is not valid JSON" in proc.stdout + proc.stderr
    assert state.read_text() == "{not json"  # never overwritten


def test_help_lists_our_options():
    proc = run("--help")
    assert proc.returncode == 0 and "--state-file" in proc.stdout and "--token" in proc.stdout
