"""The ``modelcast`` command line as a newcomer meets it: help that shows defaults, marks
what is required and gives an example; only the options a command takes; a version;
progress where no terminal is; tokens from a file; key files made and checked; ``ls``."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import socket
import stat
import sys
from pathlib import Path

import pytest

from hostagent.cli import MIN_KEY_BYTES, Progress, build_parser, main
from lab.models import make_model
from lab.sh import free_port
from tests.support.agents import LOOPBACK, FakeController

COMMANDS = ("send", "recv", "serve", "fetch", "catalog", "ls", "keygen", "trace")


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def help_of(capsys: pytest.CaptureFixture, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


# --------------------------------------------------------------------------- help


def test_every_command_is_there_and_says_its_version(capsys) -> None:
    assert tuple(subparsers()) == COMMANDS
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(r"modelcast \d+\.\d+\.\d+\S*\n", capsys.readouterr().out)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_has_an_example_that_parses_and_every_option_is_explained(command, capsys) -> None:
    """``--help`` ends with an example of the command, which the parser accepts as
    written; every option has help text."""
    text = help_of(capsys, command)
    example = text.split("example:\n", 1)[1].strip()
    assert example.startswith(f"modelcast {command} ")
    build_parser().parse_args(example.split()[1:])  # (exits 2 on an option that is not there)
    unexplained = [a.option_strings for a in subparsers()[command]._actions if a.option_strings and not a.help]
    assert unexplained == []


def test_help_shows_defaults_and_marks_required_options(capsys) -> None:
    send = help_of(capsys, "send")
    assert re.search(r"--rate MBIT\s+rate cap .*\(default:\s+1000\.0\)", send, re.S)
    assert re.search(r"--chunk-size BYTES\s+bytes per verified chunk.*\(default:\s+1048576\)", send, re.S)
    assert re.search(r"--ttl TTL\s+multicast TTL.*\(default:\s+1\)", send, re.S)
    assert re.search(r"--quiet\s+print nothing but warnings and errors", send)
    assert "(--group ADDR:PORT | --controller URL[,URL...])" in send  # one of the two, required
    fetch = help_of(capsys, "fetch")
    assert re.search(r"--controller URL\[,URL\.\.\.\]\s.*?\(required\)", fetch, re.S)
    assert re.search(r"--timeout SECONDS\s.*?\(default:\s+30\.0\)", fetch, re.S)
    assert re.search(r"--patience SECONDS\s.*?\(default:\s+300\.0\)", fetch, re.S)


def test_each_command_lists_only_the_options_it_takes(capsys) -> None:
    """``fetch`` takes a whole model from whoever offers it: no group, model name, key
    file or lanes; ``ls`` and ``keygen`` no transfer options at all."""
    options = {name: {s for a in p._actions for s in a.option_strings} for name, p in subparsers().items()}
    assert not {"--group", "--model", "--key-file", "--lanes", "--metrics-port"} & options["fetch"]
    assert not {"--group", "--key-file", "--lanes", "--out", "--rate"} & options["ls"]
    assert options["keygen"] == {"-h", "--help", "--force", "--quiet"}
    for name in ("send", "recv", "serve", "fetch", "ls"):
        assert {"--controller", "--token-file", "--token"} <= options[name], name
    fetch = help_of(capsys, "fetch")
    assert "--group" not in fetch and "--key-file" not in fetch and "--lanes" not in fetch


# --------------------------------------------------------------------------- progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_send_starts_without_the_code_only_others_need() -> None:
    """Every agent's start is on a transfer's clock (a sender's start is most of a small
    transfer's fixed cost): ``modelcast send``'s imports and command line leave out the
    receiver, serve's rounds and the controller's URL handling, which it never uses."""
    import subprocess

    probe = ("import sys, hostagent.cli as c; c.build_parser('send'); "
             "print(' '.join(m for m in ('hostagent.receiver', 'hostagent.rounds', 'hostagent.serve', "
             "'urllib.parse', 'requests', 'shutil') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []
    # ... and its help still fills the terminal it is shown on ($COLUMNS, as shutil reads it)
    shown = {columns: subprocess.run([sys.executable, "-m", "hostagent.cli", "send", "--help"], capture_output=True,
                                     text=True, check=True, env={**os.environ, "COLUMNS": str(columns)}).stdout
             for columns in (60, 160)}
    assert len(shown[160].splitlines()) < 0.7 * len(shown[60].splitlines())
    option_lines = [line for line in shown[160].splitlines() if line.startswith("  --")]
    assert max(map(len, option_lines)) > 100


def test_a_receive_ends_without_loading_anything_and_leaves_only_the_file(tmp_path: Path) -> None:
    """The last receiver's exit ends a transfer's clock: after its copy is verified the
    receiver renames it into place and removes its emptied temporary directory without
    loading more code (shutil and its compression modules were ~4 ms there), and leaves
    nothing but the file."""
    import subprocess
    import time

    from tests.support.agents import cli, cli_argv, loopback_group

    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 3_000_000, seed=5)
    key = tmp_path / "secret"
    key.write_text("k" * 32)
    out = tmp_path / "out" / "copy.bin"
    out.parent.mkdir()
    rx = subprocess.Popen([sys.executable, "-X", "importtime", *cli_argv(
        "recv", "--group", f"{group}:{port}", "--source", LOOPBACK, "--interface", LOOPBACK, "--out", str(out),
        "--key-file", str(key), "--json", "--timeout", "20")[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    time.sleep(0.5)
    tx = cli("send", str(model.path), "--group", f"{group}:{port}", "--interface", LOOPBACK, "--ttl", "0",
             "--key-file", str(key), "--receivers", "1", "--rate", "200", "--json", "--quiet")
    assert tx.wait(60) == 0, tx.communicate()[1]
    got, imports = rx.communicate(timeout=60)
    assert rx.returncode == 0 and json.loads(got.strip().splitlines()[-1])["ok"], imports[-2000:]
    assert out.read_bytes() == model.path.read_bytes()
    assert [p.name for p in out.parent.iterdir()] == ["copy.bin"]
    loaded = [line.rsplit("|", 1)[-1].strip() for line in imports.splitlines() if line.startswith("import time:")]
    assert "shutil" not in loaded, loaded[-10:]


def test_progress_is_a_bar_on_a_terminal_and_a_line_a_second_elsewhere(monkeypatch) -> None:
    args = build_parser().parse_args(["recv", "--group", "232.1.1.1:5000", "--source", LOOPBACK, "--out", "x"])
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    bar = Progress(args, "recv")
    bar.update(500_000, 1_000_000, repairs=7, note="nacks 2")
    bar.close()
    assert "repairs 7" in tty.getvalue() and "nacks 2" in tty.getvalue()
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)
    now = [100.0]
    lines = Progress(args, "recv", clock=lambda: now[0])
    for step in range(1, 25):  # 3 s of updates, eight a second
        now[0] += 0.125
        lines.update(step * 1_000_000, 24_000_000, repairs=step // 8, note="nacks 0")
    lines.close()
    out = pipe.getvalue().splitlines()
    assert len(out) == 3, out  # one a second
    assert out[0] == "recv: 1.0 of 24.0 MB (4%), repairs 0, nacks 0"
    assert out[1] == "recv: 9.0 of 24.0 MB (37%), 64.0 Mbit/s, repairs 1, nacks 0"
    for quiet in (["--json"], ["--quiet"]):
        silent = io.StringIO()
        monkeypatch.setattr(sys, "stderr", silent)
        quiet_args = build_parser().parse_args(["recv", "--group", "232.1.1.1:5000", "--source", LOOPBACK, "--out",
                                                "x", *quiet])
        Progress(quiet_args, "recv").update(1, 2, repairs=0)
        assert silent.getvalue() == ""


def test_fetch_says_it_is_waiting_for_an_offer(tmp_path: Path, capsys) -> None:
    model_id = "blake3:" + "5f1c" * 16
    with FakeController(5000) as fake:
        code = main(["fetch", model_id, "--controller", fake.url, "--out", str(tmp_path / "m"), "--patience", "0.3"])
    err = capsys.readouterr().err.splitlines()
    assert code == 1
    assert err[0] == f"waiting for an offer of {model_id} (asking {fake.url} for up to 0.3s)"
    # why it waits, each time it waits (never in silence)
    assert re.fullmatch(r"asking again in [0-9.]+s: nobody offers .*", err[1]), err
    assert err[-1].startswith("modelcast: error: ") and f"nobody offers {model_id}" in err[-1]


# --------------------------------------------------------------------------- tokens


def test_the_token_comes_from_a_file_or_the_environment(tmp_path: Path, capsys, monkeypatch) -> None:
    token = tmp_path / "token"
    token.write_text("from-the-file\n")
    with FakeController(5000) as fake:
        assert main(["ls", "--controller", fake.url, "--token-file", str(token)]) == 0
        monkeypatch.setenv("MODELCAST_TOKEN", "from-the-env")
        assert main(["ls", "--controller", fake.url]) == 0
    assert [auth for *_, auth in fake.calls] == ["Bearer from-the-file"] * 2 + ["Bearer from-the-env"] * 2
    capsys.readouterr()


def test_a_token_file_that_is_empty_missing_or_doubled_is_refused(tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for argv, message in (
            (["--token-file", str(empty)], f"token file {empty} is empty"),
            (["--token-file", str(tmp_path / "none")], f"cannot read token file {tmp_path / 'none'}: "
                                                        "No such file or directory"),
            (["--token-file", str(empty), "--token", "x"], "give --token-file or --token, not both")):
        assert main(["ls", "--controller", "http://127.0.0.1:9", *argv]) == 1
        assert capsys.readouterr().err == f"modelcast: error: {message}\n"


# --------------------------------------------------------------------------- key files


def test_keygen_writes_a_private_key_file_and_never_overwrites_it(tmp_path: Path, capsys) -> None:
    path = tmp_path / "secret"
    assert main(["keygen", str(path)]) == 0
    text = path.read_text()
    assert re.fullmatch(r"[0-9a-f]{64}\n", text)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert str(path) in capsys.readouterr().err
    assert main(["keygen", str(path)]) == 1
    assert capsys.readouterr().err == f"modelcast: error: {path} exists: give --force to replace it\n"
    assert path.read_text() == text
    assert main(["keygen", str(path), "--force", "--quiet"]) == 0
    assert path.read_text() != text and capsys.readouterr().err == ""


def test_empty_or_short_key_files_are_refused(tmp_path: Path, capsys) -> None:
    model = make_model(tmp_path / "m.bin", 1000)
    port = free_port(socket.SOCK_DGRAM)
    for content, what in ((b"", "is empty"), (b" \n", "is empty"),
                          (b"x" * (MIN_KEY_BYTES - 1) + b"\n", f"holds {MIN_KEY_BYTES - 1} bytes, fewer than 16")):
        key = tmp_path / "key"
        key.write_bytes(content)
        for argv in (["send", str(model.path), "--group", f"232.1.2.3:{port}"],
                     ["recv", "--group", f"232.1.2.3:{port}", "--source", LOOPBACK, "--out", str(tmp_path / "o")]):
            assert main([*argv, "--key-file", str(key), "--interface", LOOPBACK]) == 1
            assert capsys.readouterr().err == (f"modelcast: error: key file {key} {what}: make one with "
                                               f"`modelcast keygen {key}`\n")
    assert not (tmp_path / "o").exists()


# --------------------------------------------------------------------------- ls


def test_ls_lists_groups_receivers_and_offers(tmp_path: Path, capsys) -> None:
    model_id = "blake3:" + "ab12" * 16
    with FakeController(5500, pending_polls=0) as fake:
        fake.route("POST", "/v1/groups", {"model": "llama", "source": "10.0.0.1", "receivers": ["10.0.0.3"]})
        fake.route("POST", "/v1/groups", {"model": model_id, "source": "10.0.0.2"})
        fake.route("POST", "/v1/groups/1/rekey", {"session": "00000000000000aa", "file_digest": "cd" * 32})
        fake.route("POST", "/v1/offers", {"model": model_id, "source": "10.0.0.2", "name": "mistral", "size": 7,
                                          "files": 2})
        keys = [g["key"] for g in fake.groups.values()]
        assert main(["ls", "--controller", fake.url]) == 0
        text = capsys.readouterr().out
        assert main(["ls", "--controller", fake.url, "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert main(["ls", "--controller", fake.url, "--source", "10.0.0.2", "--json"]) == 0
        mine = json.loads(capsys.readouterr().out)
    assert text.splitlines() == [
        "groups (2)",
        "  1  llama  source 10.0.0.1  239.255.77.1:5500  installed, announced session 00000000000000aa",
        "      receivers: 10.0.0.3 installed",
        f"  2  {model_id}  source 10.0.0.2  239.255.77.1:5500  installed",
        "      receivers: none",
        "offers (1)",
        f"  1  {model_id}  from 10.0.0.2  mistral  7 bytes, 2 files, group 2",
    ]
    assert [g["id"] for g in listed["groups"]] == [1, 2] and listed["groups"][0]["receivers"] == {
        "10.0.0.3": "installed"}
    assert [o["model"] for o in listed["offers"]] == [model_id]
    assert [g["id"] for g in mine["groups"]] == [2] and len(mine["offers"]) == 1
    assert not any(key in text or key in json.dumps(listed) for key in keys)


def test_cli_files_name_the_path_when_they_cannot_be_read(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nowhere" / "secret"
    assert main(["recv", "--group", "232.1.2.3:5000", "--key-file", str(missing), "--source", LOOPBACK,
                 "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == f"modelcast: error: cannot read key file {missing}: No such file or directory\n"
    assert main(["keygen", str(missing)]) == 1
    assert str(missing) in capsys.readouterr().err
    assert os.listdir(tmp_path) == []
