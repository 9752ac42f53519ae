"""The README's quick start as a newcomer runs it, on a lab shaped like the demo's: the
controller reached over a management network, hosts that send nothing first, the token
in a file. The README's own ``recv`` and ``send`` lines (with a controller), and its
``serve``, ``fetch`` and ``ls`` lines, run as written in the host namespaces -- no
``--ip``, no ``--interface`` -- with only the machine's particulars put in: the
controller's URL, the token file's path, the sender's address, the model and output
paths, the model id ``serve`` printed, the receiver count and a rate the lab carries.
Every receiver must verify the model, the controller must know the hosts by their
fabric addresses (not the management network's), ``serve`` must print the line the
README shows, ``ls`` must show the offer, and ``serve`` must stop on SIGTERM with exit 0."""

from __future__ import annotations

import hashlib
import re
import signal
import time
from pathlib import Path

import pytest

import topologies as T
from lab.controller import VENV_BIN
from lab.fabric import Fabric
from lab.models import make_model, make_model_dir, tree_of
from lab.transfer import AgentRun
from tests.support.doc_examples import ROOT, AgentExample, agent_examples
from tests.support.lab import need_lab

pytestmark = pytest.mark.lab

SENDER, RECEIVERS = "h1", ("h3", "h4")


def readme_example(command: str, **where: str) -> AgentExample:
    """The README's first ``modelcast COMMAND`` example whose options include all of ``where``."""
    for ex in agent_examples(ROOT / "README.md"):
        if ex.argv[0] == command and all(f"--{k}" in ex.argv for k in where):
            return ex
    raise AssertionError(f"the README shows no `modelcast {command}` with {sorted(where)}")


def as_run_here(example: AgentExample, values: dict[str, str]) -> list[str]:
    """The example's argv with the documented particulars replaced: every option value and
    positional the README shows must be one ``values`` maps, or the test is stale."""
    argv = []
    for token in example.argv:
        if token.startswith("--"):
            argv.append(token)
            continue
        assert token in values or token in (example.argv[0], "llama-3-70b"), \
            f"{example}: a particular {token!r} the test does not know how to put in"
        argv.append(values.get(token, token))
    return [str(VENV_BIN / "modelcast"), *argv]


def demo_lab(tmp_path: Path) -> tuple[Fabric, dict[str, str]]:
    """The demo's lab, started as the demo starts it, and the particulars every README
    line shares: the controller's URL and a token file (mode 0600) holding its token."""
    fabric = Fabric(T.leaf_spine(2, 2, 2), tmp_path / "lab")
    fabric.start(ping_hosts=False)  # as in the demo: no host announces itself
    token = tmp_path / "token"
    token.write_text(fabric.controller.token + "\n")
    token.chmod(0o600)
    return fabric, {"http://10.0.0.254:8080": fabric.url, "/etc/modelcast/token": str(token)}


def test_the_readme_send_and_receive_run_as_written_on_a_demo_lab(tmp_path: Path) -> None:
    need_lab()
    recv = readme_example("recv", controller="", source="")
    send = readme_example("send", controller="", receivers="")
    model = make_model(tmp_path / "model.safetensors", 6_000_000, seed=49)
    fabric, shared = demo_lab(tmp_path)
    try:
        values = {**shared, "10.0.0.1": fabric.ip(SENDER), "model.safetensors": str(model.path),
                  "8": str(len(RECEIVERS)), "800": "150"}
        receivers = []
        for host in RECEIVERS:
            out = tmp_path / f"{host}.safetensors"
            argv = as_run_here(recv, {**values, "/dev/shm/llama.safetensors": str(out)})
            receivers.append((AgentRun.start(fabric, host, "recv", argv, tmp_path / host), out))
        time.sleep(1.0)  # receivers first, as the README says
        sender = AgentRun.start(fabric, SENDER, "send", as_run_here(send, values), tmp_path / SENDER)
        sender.wait(120)
        for run, _ in receivers:
            run.wait(60)
        assert sender.returncode == 0, f"send: {sender.stderr_tail()}"
        want = hashlib.sha256(model.path.read_bytes()).hexdigest()
        for run, out in receivers:
            assert run.returncode == 0, f"recv on {run.host}: {run.stderr_tail()}"
            assert hashlib.sha256(out.read_bytes()).hexdigest() == want
        # each registered its fabric address, not the management network's
        group = next(g for g in fabric.controller.client.list_groups() if g["model"] == "llama-3-70b")
        assert group["source"] == fabric.ip(SENDER)
        for run, _ in receivers:
            assert f"as {fabric.ip(run.host)}\n" in run.stderr.read_text(), run.stderr_tail()
    finally:
        fabric.stop()


# What the README shows ``serve`` printing: "serving NAME as blake3:... (SIZE bytes) on group N".
SERVING = re.compile(r"serving (\S+) as (blake3:[0-9a-f]{64}) \((\d+) bytes\) on group (\d+)$", re.M)


def test_the_readme_serve_fetch_and_ls_run_as_written_on_a_demo_lab(tmp_path: Path) -> None:
    need_lab()
    serve = readme_example("serve", controller="")
    fetch = readme_example("fetch", controller="", out="")
    ls = readme_example("ls", controller="")
    model = make_model_dir(tmp_path / "llama-3-70b", seed=49, files=12, big=2, big_size=2_000_000)
    fabric, shared = demo_lab(tmp_path)
    server = None
    try:
        server = AgentRun.start(fabric, SENDER, "serve", as_run_here(serve, {**shared, "./llama-3-70b/": f"{model}/",
                                                                               "800": "150"}), tmp_path / SENDER)
        deadline = time.monotonic() + 60
        while not (said := SERVING.search(server.stderr.read_text(errors="replace"))):
            assert server.alive() and time.monotonic() < deadline, f"serve: {server.stderr_tail()}"
            time.sleep(0.2)
        name, model_id, size, _ = said.groups()
        assert (name, int(size)) == ("llama-3-70b", sum(len(b) for b, _ in tree_of(model).values()))
        fetchers = []
        for host in RECEIVERS:
            out = tmp_path / f"{host}-llama-3-70b"
            argv = as_run_here(fetch, {**shared, "blake3:5f1c...": model_id, "/dev/shm/llama-3-70b": str(out)})
            fetchers.append((AgentRun.start(fabric, host, "fetch", argv, tmp_path / host), out))
        for run, out in fetchers:
            run.wait(120)
            assert run.returncode == 0, f"fetch on {run.host}: {run.stderr_tail()}"
            assert tree_of(out) == tree_of(model), f"fetch on {run.host}: another tree"
        listing = AgentRun.start(fabric, RECEIVERS[0], "ls", as_run_here(ls, shared), tmp_path / "ls")
        listing.wait(30)
        assert listing.returncode == 0, listing.stderr_tail()
        shown = listing.stdout.read_text()
        # the offer, from the server's fabric address (not the management network's)
        assert re.search(rf"^  \d+  {model_id}  from {re.escape(fabric.ip(SENDER))}  llama-3-70b  {size} bytes, "
                         rf"12 files, group \d+$", shown, re.M), shown
        server.kill(signal.SIGTERM)
        assert server.returncode == 0, server.stderr_tail()
        assert fabric.controller.client.offers(model_id) == []  # withdrawn when it stopped
    finally:
        if server is not None and server.alive():
            server.kill()
        fabric.stop()
