"""The README's quick start as a newcomer runs it, on a lab shaped like the demo's: the
controller reached over a management network, hosts that send nothing first, the token
in a file. The README's own ``recv`` and ``send`` lines (with a controller), and its
``serve``, ``fetch`` and ``ls`` lines, run as written in the host namespaces -- no
``--ip``, no ``--interface`` -- with only the machine's particulars put in: the
controller's URL, the token file's path, the sender's address, the model and output
paths, the model id ``serve`` printed, the receiver count and a rate the lab carries.
Every receiver must verify the model, the controller must know the hosts by their
fabric addresses (not the management network's), ``serve`` must print the line the
README shows, ``ls`` must show the offer, and ``serve`` must stop on SIGTERM with exit 0.

Then the README's several controllers: its ``modelcast-controller --store etcd://...``
line started three times on a throw-away etcd (the token in ``$MODELCAST_TOKEN``, one
cluster secret file), every switch connected to all three, and its ``recv`` and
``send --controller A,B,C`` lines run with a follower named first; then, the leader
SIGKILLed, the same lines again."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import topologies as T
from lab import etcd as lab_etcd
from lab.controller import VENV_BIN, Controller
from lab.fabric import Fabric
from lab.models import make_model, make_model_dir, tree_of
from lab.transfer import AgentRun
from tests.support.doc_examples import ROOT, AgentExample, agent_examples
from tests.support.controller_lab import health, leader_of, wait_for
from tests.support.lab import need_lab, skip_or_fail

pytestmark = pytest.mark.lab

SENDER, RECEIVERS = "h1", ("h3", "h4")


def readme_example(command: str, **where: str) -> AgentExample:
    """The README's first ``modelcast COMMAND`` example that has every option of ``where``,
    its value containing the one given (``controller=","``: several controllers)."""
    for ex in agent_examples(ROOT / "README.md"):
        if ex.argv[0] == command and all(f"--{k}" in ex.argv and v in ex.argv[ex.argv.index(f"--{k}") + 1]
                                         for k, v in where.items()):
            return ex
    raise AssertionError(f"the README shows no `modelcast {command}` with {where}")


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
    return [str(VENV_BIN / example.program), *argv]


def demo_lab(tmp_path: Path) -> tuple[Fabric, dict[str, str]]:
    """The demo's lab, started as the demo starts it, and the particulars every README
    line shares: the controller's URL and a token file (mode 0600) holding its token."""
    fabric = Fabric(T.leaf_spine(2, 2, 2), tmp_path / "lab")
    fabric.start(ping_hosts=False)  # as in the demo: no host announces itself
    token = tmp_path / "token"
    token.write_text(fabric.controller.token + "\n")
    token.chmod(0o600)
    return fabric, {"http://10.0.0.254:8080": fabric.url, "/etc/modelcast/token": str(token)}


def send_and_receive(fabric: Fabric, recv: AgentExample, send: AgentExample, values: dict[str, str],
                     work: Path, seed: int = 49, sender_first: bool = False) -> list[AgentRun]:
    """The README's ``recv`` on every receiver, then (``sender_first``: before them, as
    docs/agent.md shows) its ``send`` from the sender, each with ``values`` put in, of a
    model of its own (``seed``); asserted: every one exits 0 and every receiver wrote the
    model. The runs: the sender's first."""
    work.mkdir(parents=True, exist_ok=True)
    model = make_model(work / "model.safetensors", 6_000_000, seed=seed)
    values = {**values, "10.0.0.1": fabric.ip(SENDER), "model.safetensors": str(model.path),
              "model.bin": str(model.path), "8": str(len(RECEIVERS)), "800": "150"}
    argv = as_run_here(send, values)
    if sender_first:
        sender = AgentRun.start(fabric, SENDER, "send", argv, work / SENDER)
    receivers = []
    for host in RECEIVERS:
        out = work / f"{host}.safetensors"
        recv_argv = as_run_here(recv, {**values, "/dev/shm/llama.safetensors": str(out)})
        receivers.append((AgentRun.start(fabric, host, "recv", recv_argv, work / host), out))
    if not sender_first:
        time.sleep(1.0)  # receivers first, as the README says
        sender = AgentRun.start(fabric, SENDER, "send", argv, work / SENDER)
    sender.wait(120)
    for run, _ in receivers:
        run.wait(60)
    assert sender.returncode == 0, f"send: {sender.stderr_tail()}"
    want = hashlib.sha256(model.path.read_bytes()).hexdigest()
    for run, out in receivers:
        assert run.returncode == 0, f"recv on {run.host}: {run.stderr_tail()}"
        assert hashlib.sha256(out.read_bytes()).hexdigest() == want
    return [sender, *(run for run, _ in receivers)]


def test_the_readme_send_and_receive_run_as_written_on_a_demo_lab(tmp_path: Path) -> None:
    need_lab()
    recv = readme_example("recv", controller="", source="")
    send = readme_example("send", controller="", receivers="")
    fabric, shared = demo_lab(tmp_path)
    try:
        _, *receivers = send_and_receive(fabric, recv, send, shared, tmp_path)
        # each registered its fabric address, not the management network's
        group = next(g for g in fabric.controller.client.list_groups() if g["model"] == "llama-3-70b")
        assert group["source"] == fabric.ip(SENDER)
        for run in receivers:
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


FAILOVER_BOUND_S = 5.0  # lease TTL 2 s + etcd's expiry check + one election step (docs/ha.md)


class ReadmeInstance(Controller):
    """One of the README's several controllers, started by its ``modelcast-controller``
    line with this machine's particulars put in: the store, the secret file, the
    management network's address (for the README's 0.0.0.0) and ports of its own, its
    URL as ``--advertise-url``; three on one machine also need OpenFlow ports of their own.
    The token comes from ``$MODELCAST_TOKEN``, as the README says, not from argv."""

    def __init__(self, workdir: Path, line: AgentExample, values: dict[str, str], token: str,
                 name: str) -> None:
        super().__init__(workdir, token=token, name=name)
        self.line, self.values = line, values

    def command(self) -> list[str]:
        here = {**self.values, "0.0.0.0": self.rest_host, "8080": str(self.rest_port),
                "http://10.0.0.251:8080": self.url}
        return [*as_run_here(self.line, here), "--ofp-tcp-listen-port", str(self.of_port),
                "--ofp-listen-host", "127.0.0.1"]


def test_the_readme_several_controllers_run_as_written_and_survive_the_leader(tmp_path: Path) -> None:
    """Three instances on one etcd as the README starts them, every switch connected to
    all three; the agents name all three with a follower first (a follower that has not
    mirrored the group the leader just made answers 404: the sender must ask again, not
    fail). Then the leader is SIGKILLed and the same lines run again: the receivers join
    through the others within the bound, and the transfer verifies."""
    need_lab()
    if why := lab_etcd.available():
        skip_or_fail(why)
    line = next(ex for ex in agent_examples(ROOT / "README.md", "modelcast-controller") if "--store" in ex.argv)
    recv = readme_example("recv", controller="", source="")
    send = readme_example("send", controller=",")
    token = secrets.token_hex(8)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    secret = tmp_path / "cluster-secret"  # as docs/ha.md makes it: 32 random bytes in base64
    secret.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    secret.chmod(0o600)
    etcd = lab_etcd.Etcd(tmp_path)
    fabric = Fabric(T.leaf_spine(2, 2, 2), tmp_path / "lab")
    try:
        etcd.start()
        shared = {"etcd://10.0.0.250:2379": etcd.store_url, "/etc/modelcast/cluster-secret": str(secret)}
        fabric.controllers = [ReadmeInstance(tmp_path, line, shared, token, f"c{i}") for i in range(3)]
        with pytest.MonkeyPatch.context() as env:  # (only the instances get it)
            env.setenv("MODELCAST_TOKEN", token)
            fabric.start(ping_hosts=False)
        for c in fabric.controllers:
            assert token.encode() not in Path(f"/proc/{c.proc.pid}/cmdline").read_bytes()
        lead = leader_of(fabric.controllers)
        first, second = (c for c in fabric.controllers if c is not lead)
        urls = ",".join(c.url for c in (first, lead, second))  # a follower answers first
        values = {"/etc/modelcast/token": str(token_file), "http://10.0.0.254:8080": urls,
                  "http://10.0.0.251:8080,http://10.0.0.252:8080,http://10.0.0.253:8080": urls}
        # the sender first: it makes the group, and the follower it asks next has not mirrored it yet
        send_and_receive(fabric, recv, send, values, tmp_path / "before", sender_first=True)

        # the leader SIGKILLed; at once the same lines again, a model of their own
        gen = health(lead)["generation"]
        killed = time.monotonic()
        lead.stop(signal.SIGKILL)
        logs = [tmp_path / "after" / f"{host}.log" for host in RECEIVERS]
        with ThreadPoolExecutor(1) as pool:
            again = pool.submit(send_and_receive, fabric, recv, send, values, tmp_path / "after", seed=50)
            joined = wait_for(lambda: all(p.exists() and "joined group" in p.read_text() for p in logs), 30,
                              step=0.02)
            failover = time.monotonic() - killed
            again.result()
        assert joined, "a receiver never joined after the leader died"
        assert failover <= FAILOVER_BOUND_S, failover
        new = leader_of(fabric.controllers)
        assert new is not lead and health(new)["generation"] > gen
        print(f"\nleader SIGKILLed: both receivers joined through the others {failover:.2f} s later")
    finally:
        fabric.stop()
        etcd.stop()
