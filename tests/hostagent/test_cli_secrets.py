"""No key material in anything the agent prints: failing runs that held a session key
(from the controller) or a shared secret, every output read (stdout, stderr, the
``--json`` summary) and searched for the key, whole or in part."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from hostagent import wire
from hostagent.cli import main
from hostagent.control import describe_answer, without_keys
from lab.models import make_model
from lab.sh import free_port
from tests.support.agents import LOOPBACK, FakeController

TOKEN = "tok-secrets"


def key_traces(raw_hex: str) -> list[str]:
    """What would betray a key: its hex (any 16 consecutive digits of it), and the hex
    of the MAC key derived from it."""
    derived = wire.derive_key(bytes.fromhex(raw_hex)).hex()
    return [text[i:i + 16] for text in (raw_hex, derived) for i in range(0, len(text) - 15, 8)]


def assert_no_key(raw_hex: str, *outputs: str) -> None:
    for text in outputs:
        for trace in key_traces(raw_hex):
            assert trace not in text.lower(), f"key material {trace} printed:\n{text}"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELCAST_TOKEN", TOKEN)


def test_a_receive_that_times_out_waiting_for_the_sender_prints_no_key(tmp_path: Path, capsys, env) -> None:
    """The group is there and keyed, but its source never announces a transfer: the
    timeout's message describes the last answer, without the key it carried."""
    with FakeController(free_port(socket.SOCK_DGRAM), token=TOKEN) as fake:
        fake.route("POST", "/v1/groups", {"model": "m", "source": LOOPBACK})
        fake.route("POST", "/v1/groups/1/rekey", None)  # a fresh key, nothing announced
        key = fake.groups[1]["key"]
        for extra in ([], ["--json"]):
            code = main(["recv", "--controller", fake.url, "--model", "m", "--source", LOOPBACK, "--interface",
                         LOOPBACK, "--ip", "127.0.0.9", "--out", str(tmp_path / "o.bin"), "--timeout", "0.3", *extra])
            out, err = capsys.readouterr()
            assert code == 1 and "timed out after 0.3s waiting for the source of group 1" in err
            assert_no_key(key, out, err)
            assert "group 1 (m)" in err and "nothing announced" in err  # what the last answer said


def test_a_receive_whose_sender_falls_silent_prints_no_key(tmp_path: Path, capsys, env) -> None:
    """Announced, joined with the key, then nothing: the --json summary and stderr."""
    with FakeController(free_port(socket.SOCK_DGRAM), token=TOKEN) as fake:
        fake.route("POST", "/v1/groups", {"model": "m", "source": LOOPBACK})
        fake.route("POST", "/v1/groups/1/rekey", {"session": "00000000000000aa", "file_digest": "cd" * 32})
        key = fake.groups[1]["key"]
        code = main(["recv", "--controller", fake.url, "--model", "m", "--source", LOOPBACK, "--interface",
                     LOOPBACK, "--ip", "127.0.0.9", "--out", str(tmp_path / "o.bin"), "--timeout", "0.3", "--json"])
        out, err = capsys.readouterr()
    assert code == 1 and json.loads(out)["error"] == "sender silent"
    assert_no_key(key, out, err)


def test_a_send_that_times_out_waiting_for_receivers_prints_no_key(tmp_path: Path, capsys, env) -> None:
    model = make_model(tmp_path / "m.bin", 100_000)
    with FakeController(free_port(socket.SOCK_DGRAM), token=TOKEN, stuck_state="pending") as fake:
        code = main(["send", str(model.path), "--controller", fake.url, "--model", "m", "--interface", LOOPBACK,
                     "--receivers", "2", "--wait-timeout", "0.3", "--poll", "0.05"])
        out, err = capsys.readouterr()
        key = fake.groups[1]["key"]
    assert code == 1 and "timed out after 0.3s waiting for group 1 to be installed" in err
    assert_no_key(key, out, err)


def test_a_shared_secret_never_appears_in_output(tmp_path: Path, capsys) -> None:
    """A key file's bytes, on a receive that times out (nobody sends)."""
    secret = tmp_path / "secret"
    secret.write_text("9f" * 32)
    port = free_port(socket.SOCK_DGRAM)
    code = main(["recv", "--group", f"232.1.2.3:{port}", "--key-file", str(secret), "--source", LOOPBACK,
                 "--interface", LOOPBACK, "--out", str(tmp_path / "o.bin"), "--timeout", "0.3", "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "9f9f9f9f" not in out + err


def test_answers_are_described_without_their_keys() -> None:
    group = {"id": 3, "model": "m", "state": "pending", "receivers": {"10.0.0.2": "pending"}, "key": "ab" * 32,
             "session": "00000000000000aa"}
    text = describe_answer(group)
    assert text == "group 3 (m) pending, receivers: 10.0.0.2 pending, announced session 00000000000000aa"
    assert without_keys([{"key": "ab" * 32, "nested": {"key": "cd"}}]) == [
        {"key": "<hidden>", "nested": {"key": "<hidden>"}}]
    assert "abab" not in describe_answer({"unexpected": True, "key": "ab" * 32})
