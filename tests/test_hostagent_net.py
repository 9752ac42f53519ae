"""The socket layer and CLI on loopback only (interface 127.0.0.1, TTL 0)."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pytest

from hostagent.cli import main
from hostagent.net import FileSink, FileSource, parse_group
from lab.models import make_model
from tests.support.agents import LOOPBACK, cli, loopback_group


def test_send_and_receive_over_loopback_multicast(tmp_path) -> None:
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 1_500_000, seed=4)
    addr = f"{group}:{port}"
    common = ["--group", addr, "--interface", LOOPBACK, "--json"]
    # One output in /dev/shm (tmpfs, where a loader would mmap it from) when present.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    outs = [Path(shm) / f"modelcast-test-{os.getpid()}-{random.getrandbits(32):08x}.bin", tmp_path / "out1.bin"]
    marker = tmp_path / "loaded.txt"
    hook = f"{sys.executable} -c \"import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(str(pathlib.Path(sys.argv[2]).stat().st_size))\" {marker}"
    receivers = [
        cli("recv", *common, "--source", LOOPBACK, "--out", str(outs[i]), "--timeout", "20",
            *(["--on-complete", hook] if i == 0 else []))
        for i in range(2)
    ]
    try:
        time.sleep(0.5)  # let the receivers join before the stream starts (not a pass/fail timing)
        sender = cli("send", str(model.path), *common, "--ttl", "0", "--receivers", "2", "--rate", "200",
                     "--chunk-size", "65536", "--timeout", "20")
        out, err = sender.communicate(timeout=60)
        results = [json.loads(r.communicate(timeout=60)[0]) for r in receivers]
        assert sender.returncode == 0, err
        summary = json.loads(out)
        assert summary["ok"] and [r["ok"] for r in summary["receivers"]] == [True, True]
        assert summary["file_digest"] == model.digest
        assert summary["bytes"] == 1_500_000 and summary["goodput_mbit"] > 0
        for key in ("seconds", "datagrams_sent", "repair_bytes", "nacks"):
            assert key in summary
        for i, (proc, result) in enumerate(zip(receivers, results)):
            assert proc.returncode == 0
            assert result["ok"] and result["digest_ok"] and result["file_digest"] == summary["file_digest"]
            assert outs[i].read_bytes() == model.path.read_bytes()
            assert not Path(str(outs[i]) + ".modelcast-state").exists()
        assert results[0]["on_complete"]["exit_status"] == 0 and results[1]["on_complete"] is None
        assert marker.read_text() == "1500000"  # the hook ran on the finished, full-size file
    finally:
        for proc in receivers:
            if proc.poll() is None:
                proc.kill()
        outs[0].unlink(missing_ok=True)


def test_cli_errors_are_one_line_and_nonzero(tmp_path, capsys) -> None:
    assert main(["send", str(tmp_path / "missing.bin"), "--group", "239.1.2.3:5000"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err

    model = tmp_path / "m.bin"
    model.write_bytes(b"x" * 10)
    for bad in ("10.0.0.1:5000", "239.1.2.3", "239.1.2.3:99999", "nonsense:5000"):
        assert main(["send", str(model), "--group", bad]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("modelcast: error:")

    assert main(["recv", "--group", "239.1.2.3:5000", "--source", "127.0.0.1",
                 "--out", str(tmp_path / "no" / "such" / "dir" / "out.bin")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err
    assert main(["recv", "--group", "239.1.2.3:5000", "--source", "not-an-ip", "--out", str(tmp_path / "o")]) == 1


def test_parse_group_accepts_only_multicast() -> None:
    assert parse_group("232.1.2.3:7000") == ("232.1.2.3", 7000)
    with pytest.raises(ValueError):
        parse_group("127.0.0.1:7000")


def test_file_source_and_sink_positional_io(tmp_path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    src = FileSource(str(path))
    assert src.size == 1024 and src.read(250, 10) == bytes(range(250, 256)) + bytes(range(4))
    src.close()
    sink = FileSink(str(tmp_path / "o.bin"))
    sink.write(10, b"late")
    sink.write(0, b"early")
    sink.save_state(b"state")
    assert sink.load_state() == b"state"
    assert sink.read(0, 5) == b"early" and sink.read(10, 4) == b"late"
    sink.finish(14)
    assert sink.load_state() is None
    sink.close()
    assert (tmp_path / "o.bin").stat().st_size == 14
