"""Content ids as a user meets them: ``send`` prints the whole id at once (receivers need
it whole to join), a wrong ``recv --expect`` is refused at the sender's first manifest
page with both ids and nothing written, and ``--lanes`` does not change the id."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Optional

import pytest

from hostagent.cli import main
from lab.models import make_model, make_model_dir
from lab.sh import free_port
from tests.support.agents import LOOPBACK, FakeController, cli, file_id, loopback_group

ID = re.compile(r"content id (blake3:[0-9a-f]{64}) \(receivers: --expect \1\)")
CHUNK = 65536


def key_file(tmp_path: Path) -> str:
    path = tmp_path / "secret"
    path.write_text("c0ffee" * 11)
    return str(path)


def test_send_prints_the_whole_content_id_before_waiting_for_receivers(tmp_path: Path, capsys) -> None:
    """With a controller, receivers join the group named by the id: the sender says it,
    whole, while it waits for them (here for ever: the tree is never installed)."""
    model = make_model_dir(tmp_path / "model", files=4, big=1)
    with FakeController(free_port(socket.SOCK_DGRAM), stuck_state="pending") as fake:
        code = main(["send", str(model), "--controller", fake.url, "--interface", LOOPBACK, "--insecure",
                     "--chunk-size", str(CHUNK), "--receivers", "2", "--wait-timeout", "0.3", "--poll", "0.05"])
    err = capsys.readouterr().err
    assert code == 1
    ids = ID.findall(err)
    lines = err.splitlines()
    waiting = next(i for i, line in enumerate(lines) if "waiting for installation" in line)
    assert len(ids) == 1 and any(ID.search(line) for line in lines[:waiting])
    assert f"for model {ids[0]}:" in lines[waiting]  # the group's name, whole too
    assert fake.calls[0][2]["model"] == ids[0]


def _receive_with(tmp_path: Path, expect: str, group: str, key: str,
                  chunk: int = CHUNK) -> tuple[int, str, dict, float]:
    """``recv --expect`` against a slow sender of a 2 MB model (one manifest page in
    64 KiB chunks, four in 1 KiB ones): (exit, stderr, summary, seconds)."""
    model = make_model(tmp_path / "model.bin", 2_000_000, seed=3)
    out = tmp_path / "out.bin"
    receiver = cli("recv", "--group", group, "--key-file", key, "--source", LOOPBACK, "--interface", LOOPBACK,
                   "--expect", expect, "--out", str(out), "--timeout", "20", "--json")
    time.sleep(0.5)
    started = time.monotonic()
    sender = cli("send", str(model.path), "--group", group, "--key-file", key, "--interface", LOOPBACK, "--ttl", "0",
                 "--rate", "4", "--chunk-size", str(chunk), "--receivers", "1", "--timeout", "1", "--quiet")
    try:
        stdout, err = receiver.communicate(timeout=30)
        seconds = time.monotonic() - started
    finally:
        sender.kill()
        sender.communicate()
        if receiver.poll() is None:
            receiver.kill()
    return receiver.returncode, err, json.loads(stdout), seconds


@pytest.mark.parametrize("chunk", [CHUNK, 1024], ids=["one page", "four pages"])
def test_a_wrong_expect_is_refused_at_the_first_manifest_page(tmp_path: Path, chunk: int) -> None:
    """The sender offers one model, the receiver expects another: exit 1 at once (the
    stream at 4 Mbit/s would take 4 s), both ids in the error, nothing written -- also
    when the manifest takes several pages (the first one heard names the id)."""
    group, port = loopback_group()
    wrong = "blake3:" + "5f1c" * 16
    code, err, summary, seconds = _receive_with(tmp_path, wrong, f"{group}:{port}", key_file(tmp_path), chunk)
    offered = file_id(tmp_path / "model.bin", chunk)
    assert code == 1 and seconds < 2.5, (seconds, err)
    assert summary["error"] == f"content id mismatch: expected {wrong}, the sender offers {offered}"
    assert summary["bytes"] == 0 and summary["dropped"].get("wrong_content_id", 0) >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin", "secret"]  # no OUT, no temporary, no record


@pytest.mark.parametrize("chunk", [CHUNK, 1024], ids=["one page", "four pages"])
def test_the_right_expect_is_taken(tmp_path: Path, chunk: int) -> None:
    group, port = loopback_group()
    model_id = file_id(make_model(tmp_path / "model.bin", 2_000_000, seed=3).path, chunk)
    code, err, summary, _ = _receive_with(tmp_path, model_id, f"{group}:{port}", key_file(tmp_path), chunk)
    assert code == 0, err
    assert summary["content_id"] == model_id


def _said_id(err: str) -> Optional[str]:
    found = ID.findall(err)
    assert len(found) == 1, err
    return found[0]


def test_lanes_do_not_change_the_content_id(tmp_path: Path) -> None:
    """``send --lanes 2`` says the id the same file has without lanes (no lane's slice)."""
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 600_000, seed=5)
    expected = file_id(model.path, CHUNK)
    said = []
    for lanes in ("1", "2"):
        sender = cli("send", str(model.path), "--group", f"{group}:{port}", "--key-file", key_file(tmp_path),
                     "--interface", LOOPBACK, "--ttl", "0", "--chunk-size", str(CHUNK), "--lanes", lanes,
                     "--receivers", "0", "--timeout", "0.5")
        _, err = sender.communicate(timeout=60)
        said.append(_said_id(err))
    assert said == [expected, expected]


def test_a_receiver_waiting_on_a_mistyped_id_is_told_what_the_source_announces(tmp_path: Path, capsys) -> None:
    """``recv --controller --expect X``: the group is named by X, and a sender of Y
    announces on Y's group. The receiver warns at once, names Y when it gives up."""
    offered = "blake3:" + "ab12" * 16
    wrong = "blake3:" + "5f1c" * 16
    with FakeController(free_port(socket.SOCK_DGRAM)) as fake:
        fake.route("POST", "/v1/groups", {"model": offered, "source": LOOPBACK})
        fake.route("POST", "/v1/groups/1/rekey", {"session": "00000000000000aa", "file_digest": "cd" * 32})
        code = main(["recv", "--controller", fake.url, "--expect", wrong, "--source", LOOPBACK, "--interface",
                     LOOPBACK, "--out", str(tmp_path / "o"), "--timeout", "0.5", "--insecure"])
    err = capsys.readouterr().err
    assert code == 1
    told = f"content id mismatch? {LOOPBACK} announces {offered} (group 1), this receiver expects {wrong}"
    warning, error = err.splitlines()[-2:]
    assert warning == f"warning: {told}; still waiting (check --expect)"
    assert error.startswith("modelcast: error: timed out after 0.5s waiting for the source of group 2")
    assert error.endswith(told)


def _lanes_transfer(tmp_path: Path, expect: Optional[str]) -> tuple[int, dict, str, float, list[bytes]]:
    """``send --lanes 2`` of a 2 MB model at 4 Mbit/s to ``recv --lanes 2 [--expect]``
    into an OUT that holds an older copy: (receiver's exit, its summary, the id the sender
    said, seconds, what OUT held each 0.2 s while the receiver ran)."""
    group, port = loopback_group()
    key = key_file(tmp_path)
    model = make_model(tmp_path / "model.bin", 2_000_000, seed=7)
    out = tmp_path / "out.bin"
    out.write_bytes(b"GOOD" * 1000)
    receiver = cli("recv", "--group", f"{group}:{port}", "--key-file", key, "--source", LOOPBACK, "--interface",
                   LOOPBACK, "--out", str(out), "--timeout", "20", "--json", "--lanes", "2",
                   *(("--expect", expect) if expect else ()))
    time.sleep(0.5)
    started = time.monotonic()
    sender = cli("send", str(model.path), "--group", f"{group}:{port}", "--key-file", key, "--interface", LOOPBACK,
                 "--ttl", "0", "--rate", "4", "--chunk-size", str(CHUNK), "--lanes", "2", "--receivers", "1",
                 "--timeout", "2")
    seen = []
    try:
        while receiver.poll() is None and time.monotonic() - started < 30:
            seen.append(out.read_bytes())
            time.sleep(0.2)
        stdout, _ = receiver.communicate(timeout=30)
        seconds = time.monotonic() - started
        _, said = sender.communicate(timeout=30)
    finally:
        for proc in (sender, receiver):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return receiver.returncode, json.loads(stdout), _said_id(said), seconds, seen


def test_lanes_verify_the_id_the_sender_says_and_rename_the_file_into_out_once_verified(tmp_path: Path) -> None:
    """``recv --lanes 2 --expect ID`` takes what ``send --lanes 2`` says is ID (the file's
    id without lanes), reports it, and OUT holds the older copy until the whole file is
    verified -- then the new one, with no temporary or lane record left beside it."""
    model_id = file_id(make_model(tmp_path / "model.bin", 2_000_000, seed=7).path, CHUNK)
    code, summary, said, _, seen = _lanes_transfer(tmp_path, model_id)
    assert code == 0, summary
    assert said == model_id and summary["content_id"] == model_id and summary["lanes"] == 2
    assert len(seen) >= 5 and all(held == b"GOOD" * 1000 for held in seen[:-1])  # the lanes wrote elsewhere
    assert (tmp_path / "out.bin").read_bytes() == (tmp_path / "model.bin").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin", "out.bin", "secret"]


def test_lanes_refuse_a_wrong_expect_at_the_first_manifest_page(tmp_path: Path) -> None:
    """A wrong ``--expect`` with ``--lanes``: exit 1 at once, the sentence naming the id
    the sender said, nothing written (OUT as it was, no temporary, no lane record)."""
    wrong = "blake3:" + "5f1c" * 16
    code, summary, said, seconds, _ = _lanes_transfer(tmp_path, wrong)
    assert code == 1 and seconds < 2.5, (seconds, summary)
    assert summary["error"] == f"content id mismatch: expected {wrong}, the sender offers {said}"
    assert said == file_id(tmp_path / "model.bin", CHUNK)
    assert (tmp_path / "out.bin").read_bytes() == b"GOOD" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin", "out.bin", "secret"]
