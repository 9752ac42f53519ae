"""Crash-safe resume and disk full with the real CLI on a kernel-bridge netns lab (issue
11, items 4 and 5): a receiver SIGKILLed at 60% of a 32 MiB file and restarted fetches at
most 15% of the file again; chunks its record claims that are torn on disk are re-fetched;
a receiver whose filesystem fills exits 1 with one line naming the path and ENOSPC,
keeps a valid record, and after space is freed resumes and completes verified. Every
run's digest is checked here. Needs root: skipped off CI, a failure under CI=true."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional

import msgpack
import pytest

from hostagent.dirs import tmp_path as receiving_dir
from lab.bridge import BridgeLab
from lab.models import ModelFile, file_digest, make_key_file, make_model
from lab.sh import sh
from tests.support.agents import REPO, cli_argv
from tests.support.lab import bridge_lab

pytestmark = pytest.mark.lab

MIB = 1024 * 1024
SIZE = 32 * MIB
CHUNK = 256 * 1024
RATE = "60"  # Mbit/s: ~4.5 s for the file, so the kill lands mid-transfer


@pytest.fixture
def lab2() -> Iterator[BridgeLab]:
    with bridge_lab(2) as lab:
        yield lab


@pytest.fixture
def model(tmp_path: Path) -> ModelFile:
    return make_model(tmp_path / "model.bin", SIZE, seed=11)


def _group() -> str:
    return f"232.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}:{random.randint(20000, 60000)}"


def _recv(lab: BridgeLab, group: str, out: Path, key: Path) -> subprocess.Popen:
    return lab.popen(1, *cli_argv("recv", "--group", group, "--source", lab.ip(0), "--out", str(out),
                                  "--json", "--timeout", "20", "--key-file", str(key)),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _send(lab: BridgeLab, group: str, model: ModelFile, key: Path) -> subprocess.Popen:
    return lab.popen(0, *cli_argv("send", str(model.path), "--group", group, "--interface", lab.ip(0),
                                  "--receivers", "1", "--rate", RATE, "--chunk-size", str(CHUNK),
                                  "--json", "--timeout", "30", "--key-file", str(key)),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _partial(out: Path) -> Path:
    """Where a file is received until it is verified (and renamed to ``out``)."""
    return Path(receiving_dir(str(out))) / out.name


def _held(out: Path) -> int:
    """Bytes of the file being received actually written (it is sparse until filled)."""
    try:
        return os.stat(_partial(out)).st_blocks * 512
    except FileNotFoundError:
        return 0


def _wait_held(out: Path, fraction: float, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _held(out) < fraction * SIZE:
        assert proc.poll() is None, f"receiver exited early: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, f"receiver did not reach {fraction:.0%}"
        time.sleep(0.002)


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, Optional[dict], str]:
    out, err = proc.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else None, err


def _claimed(out: Path) -> list[int]:
    flat = msgpack.unpackb((out.parent / (out.name + ".modelcast-state")).read_bytes(), raw=False)["verified"]
    return [c for i in range(0, len(flat), 2) for c in range(flat[i], flat[i + 1])]


def _kill_at_60_and_restart(lab: BridgeLab, model: ModelFile, out: Path, tear: int = 0) -> tuple[dict, int]:
    """Receive, SIGKILL at 60% (nothing at OUT yet), optionally tear ``tear`` claimed
    chunks on disk, restart;
    returns the second run's summary and the bytes the first run had written."""
    group, key = _group(), make_key_file(out.parent / "session.key")
    first = _recv(lab, group, out, key)
    time.sleep(0.4)
    sender = _send(lab, group, model, key)
    _wait_held(out, 0.6, first)
    first.kill()
    first.wait(10)
    held = _held(out)
    assert not out.exists(), "nothing at OUT before the file is verified"
    if tear:
        with open(_partial(out), "r+b") as f:
            for chunk in _claimed(out)[:tear]:
                f.seek(chunk * CHUNK + 1000)
                f.write(b"torn by the crash")
    second = _recv(lab, group, out, key)
    code, summary, err = _finish(second)
    s_code, s_summary, s_err = _finish(sender)
    assert code == 0 and summary is not None and summary["digest_ok"], err
    assert s_code == 0 and s_summary["ok"], s_err
    assert file_digest(out) == model.digest == summary["file_digest"]
    return summary, held


def test_receiver_sigkilled_at_60_percent_refetches_at_most_15_percent(lab2: BridgeLab, model: ModelFile,
                                                                       tmp_path: Path) -> None:
    summary, held = _kill_at_60_and_restart(lab2, model, tmp_path / "out.bin")
    resumed = summary["resumed_chunks"] * CHUNK
    lost = held - resumed  # written before the kill but not in the record: fetched again
    # What the second run took off the wire beyond what the first never had.
    again = summary["bytes_received"] - (SIZE - held)
    print(f"SIGKILL at {held / SIZE:.0%}: record claimed {resumed / SIZE:.1%} of the file, "
          f"lost {lost / SIZE:.1%}; second run received {summary['bytes_received'] / SIZE:.1%} "
          f"of the file ({again / SIZE:.1%} beyond what it lacked); {summary['resume_records']} records, "
          f"{summary['record_sync_s']} s syncing them")
    assert held >= 0.6 * SIZE
    assert lost <= 0.15 * SIZE, f"the record lost {lost / SIZE:.0%} of the file"
    assert again <= 0.15 * SIZE, f"the restarted receiver fetched {again / SIZE:.0%} of the file again"
    assert summary["corrupt_chunks"] == 0


def test_claimed_chunks_torn_on_disk_are_refetched(lab2: BridgeLab, model: ModelFile, tmp_path: Path) -> None:
    summary, held = _kill_at_60_and_restart(lab2, model, tmp_path / "out.bin", tear=3)
    assert summary["corrupt_chunks"] == 3, summary
    assert summary["resumed_chunks"] >= 0.45 * SIZE / CHUNK - 3, summary


def test_disk_full_exits_with_one_line_keeps_the_record_and_resumes_after_space_is_freed(
        lab2: BridgeLab, model: ModelFile, tmp_path: Path) -> None:
    key = make_key_file(tmp_path / "session.key")
    mnt = tmp_path / "small"
    mnt.mkdir()
    sh(["mount", "-t", "tmpfs", "-o", "size=12m", "modelcast-test", str(mnt)], what="mount a small tmpfs")
    try:
        out = mnt / "out.bin"
        group = _group()
        rx = _recv(lab2, group, out, key)
        time.sleep(0.4)
        sender = _send(lab2, group, model, key)
        code, summary, err = _finish(rx)
        sender.kill()
        sender.wait(10)
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert code == 1 and summary is None, err
        # (the data write fills the disk; in a rare race the record's write hits it first)
        assert re.fullmatch(rf"modelcast: error: ({re.escape(str(_partial(out)))}|{re.escape(str(out))}"
                            r"\.modelcast-state): "
                            r"No space left on device \(ENOSPC\)", lines[-1]), err
        assert "Traceback" not in err
        # The record is valid and claims only chunks that are on disk, intact.
        claimed = _claimed(out)
        assert len(claimed) * CHUNK >= 4 * MIB, f"record claims only {len(claimed)} chunks"
        with open(_partial(out), "rb") as got, open(model.path, "rb") as want:
            for chunk in claimed:
                got.seek(chunk * CHUNK)
                want.seek(chunk * CHUNK)
                assert got.read(CHUNK) == want.read(CHUNK), f"claimed chunk {chunk} is not on disk"
        sh(["mount", "-o", "remount,size=80m", str(mnt)], what="free space")
        group = _group()
        rx = _recv(lab2, group, out, key)
        time.sleep(0.4)
        sender = _send(lab2, group, model, key)
        code, summary, err = _finish(rx)
        s_code, _, s_err = _finish(sender)
        assert code == 0 and summary is not None and summary["digest_ok"], err
        assert summary["resumed_chunks"] == len(claimed), summary
        assert s_code == 0, s_err
        assert file_digest(out) == model.digest
    finally:
        lab2.stop_procs()
        sh(["umount", str(mnt)], check=False)
