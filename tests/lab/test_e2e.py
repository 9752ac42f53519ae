"""End to end: the real controller, real OVS (userspace datapath), real host agents in
network namespaces, one 8 MiB "model" per scenario on a 2-spine / 4-leaf fabric.

Every scenario asserts that each receiver's output file has the model's BLAKE3 digest
(hashed here, independently of the agents' own check). Timing is printed, never
asserted. Orchestration lives in ``lab.fabric``/``lab.transfer`` (shared with ``make demo``).

Fabric (``leaf_spine(2, 4, 2)``): spines dpid 1-2, leaves dpid 3-6; h1 h2 on leaf1,
h3 h4 on leaf2, h5 h6 on leaf3, h7 h8 on leaf4. h1 always sends.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import topologies as T
from lab.controller import stamp_printer
from lab.fabric import Fabric
from lab.models import ModelFile, make_model
from lab.transfer import Transfer, TransferReport
from tests.support.lab import need_lab

pytestmark = pytest.mark.lab

TOPO = T.leaf_spine(2, 4, 2)
SIZE = 8 * 1024 * 1024
RATE = 120.0  # Mbit/s: comfortably below what userspace OVS replicates without loss
SLOW = 40.0  # for scenarios that act mid-transfer: the stream lasts a few seconds
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    need_lab()
    work = tmp_path_factory.mktemp("e2e")
    fab = Fabric(TOPO, work, say=stamp_printer())
    fab.start(ping_hosts=False)  # as the demo: no host announces itself first
    try:
        yield fab
    finally:
        fab.stop()
        if TIMES:  # shown even without -s: the lead reports these
            line = "e2e transfer times: " + ", ".join(f"{k} {v:.2f}s" for k, v in TIMES.items())
            capman = request.config.pluginmanager.get_plugin("capturemanager")
            tr = request.config.pluginmanager.get_plugin("terminalreporter")
            if capman is not None and tr is not None:
                with capman.global_and_fixture_disabled():
                    tr.write_line("\n" + line)
            else:
                print(line)


@pytest.fixture(scope="module")
def model(fabric: Fabric) -> ModelFile:
    return make_model(fabric.workdir / "model.bin", SIZE + 12345, seed=5)


def ip(host: str) -> str:
    return TOPO.host(host).ip


def check(report: TransferReport, sender_ok: bool = True) -> None:
    """Digests of every receiver's file (our own hash) and of its JSON summary."""
    print(report.format())
    TIMES[report.name] = report.seconds
    for r in report.receivers:
        assert r.digest == report.digest, f"{r.host}: output digest differs\n{report.format()}"
        assert r.summary and r.summary["file_digest"] == report.digest, report.format()
        assert r.ok, report.format()
    if sender_ok:
        assert report.ok, report.format()
        s = report.sender_summary
        assert s is not None and s["ok"], report.format()
        assert sorted(x["addr"] for x in s["receivers"] if x["ok"]) == sorted(r.ip for r in report.receivers)


def test_basic_four_receivers_and_bystanders_get_nothing(fabric: Fabric, model: ModelFile,
                                                         tmp_path: Path) -> None:
    receivers = ["h3", "h5", "h7", "h8"]
    with Transfer(fabric, model, "h1", receivers, rate=RATE, name="basic", workdir=tmp_path) as t:
        t.start_probes(["h2", "h4", "h6"])
        t.start_receivers()
        tree = t.group["tree"]
        t.start_sender()
        report = t.finish()
    check(report)
    assert report.probes == {"h2": 0, "h4": 0, "h6": 0}, report.format()
    # The tree reaches exactly the receivers' switches (leaf2, leaf3, leaf4) and prunes:
    # on leaf2 and leaf3 only the receiver's port is an output, not the bystander's.
    assert set(tree["switches"]) >= {3, 4, 5, 6}
    for host in ("h2", "h4", "h6"):
        h = TOPO.host(host)
        assert h.port not in tree["out_ports"].get(str(h.dpid), []), tree
    # One copy on the sender's link, not one per receiver.
    assert report.sender_link.rx_bytes < 2 * model.size, report.format()


def test_random_and_bursty_loss_all_complete(fabric: Fabric, model: ModelFile, tmp_path: Path) -> None:
    receivers = ["h3", "h4", "h5", "h7"]
    with Transfer(fabric, model, "h1", receivers, rate=RATE, name="loss", workdir=tmp_path) as t:
        t.add_loss("h3", "random")
        t.add_loss("h5", "random")
        t.add_loss("h7", "bursty")
        t.start_receivers()
        t.start_sender()
        report = t.finish()
    check(report)
    lossy = [r for r in report.receivers if r.loss]
    assert len(lossy) == 3
    for r in lossy:  # loss really happened on those links (the rules' own counters), and was repaired
        assert isinstance(r.loss_dropped, int) and r.loss_dropped > 0, \
            f"{r.host}: nothing dropped\n{report.format()}"
    assert sum(r.summary["nacks"] for r in lossy) > 0, report.format()
    assert report.sender_summary["repair_bytes"] > 0


def test_igmpv3_only_receiver_gets_the_file(fabric: Fabric, model: ModelFile, tmp_path: Path) -> None:
    # The IGMP receiver never talks to the controller, so it cannot fetch the group's
    # session key: all parties use a shared --key-file instead.
    with Transfer(fabric, model, "h1", ["h3", "h5", "h8"], rate=RATE, name="igmp",
                  workdir=tmp_path, shared_key=True) as t:
        t.start_sender()  # creates the group over REST, then waits for 3 installed receivers
        t.wait_group_created()
        t.start_receivers(["h3", "h5"], wait_joined=False)
        run = t.start_receiver("h8", igmp=True)  # SSM socket join -> IGMPv3 report
        assert "--controller" not in run.argv and "--group" in run.argv
        g = t.wait_installed([ip("h3"), ip("h5"), ip("h8")])
        # h8 never called REST (no --controller): the controller installed it from its
        # IGMPv3 report, and the tree feeds h8's switch port.
        h8 = TOPO.host("h8")
        assert g["receivers"][ip("h8")] == "installed"
        assert h8.port in g["tree"]["out_ports"][str(h8.dpid)], g["tree"]
        report = t.finish()
        # Closing its socket sends an IGMPv3 leave (TO_IN {}): the controller prunes h8.
        fabric.controller.wait_group(t.group["id"], lambda g: ip("h8") not in g.get("receivers", {}))
    check(report)
    assert next(r for r in report.receivers if r.host == "h8").join == "igmp"


def test_late_joiner_at_half_completes(fabric: Fabric, model: ModelFile, tmp_path: Path) -> None:
    # The sender is not told how many receivers to expect (it would wait for the late one
    # to be installed before sending); it serves every receiver that shows up in time.
    with Transfer(fabric, model, "h1", ["h3", "h5", "h7"], rate=SLOW, name="late-joiner",
                  workdir=tmp_path, expect_receivers=None) as t:
        t.start_receivers(["h3", "h5"])
        t.start_sender()
        t.wait_sent(0.5)
        t.start_receiver("h7")
        report = t.finish()
    check(report)
    late = next(r for r in report.receivers if r.host == "h7")
    assert late.summary["repairs_received"] > 0, "late joiner got the first half by repair"


def test_receiver_killed_at_60_percent_resumes(fabric: Fabric, model: ModelFile, tmp_path: Path) -> None:
    chunk = 32 * 1024  # small chunks: the resume record (every 0.25 s) claims finely
    with Transfer(fabric, model, "h1", ["h3", "h5", "h7"], rate=SLOW, name="receiver-restart",
                  workdir=tmp_path, chunk_size=chunk) as t:
        t.start_receivers()
        t.start_sender()
        t.wait_received("h5", 0.6)
        t.kill_receiver("h5", signal.SIGKILL)
        t.start_receiver("h5")  # same --out: resumes from PATH.modelcast-state
        report = t.finish()
    # The restarted receiver keeps its id (it is in the resume record): the sender sees one
    # receiver that resumed, and every expected receiver verified.
    check(report)
    h5 = next(r for r in report.receivers if r.host == "h5")
    assert h5.runs == 2
    second = h5.summary
    assert second["resumed_chunks"] > 0, f"nothing resumed: {second}"
    missing = model.size - second["resumed_chunks"] * chunk
    fetched = second["bytes_received"]  # every datagram that reached it, headers included
    print(f"restart: resumed {second['resumed_chunks']} chunks, missing {missing} B, "
          f"fetched ~{fetched} B ({fetched / max(1, missing):.2f} x missing)")
    assert fetched < 0.9 * model.size, "the restarted receiver fetched (nearly) everything again"
    assert fetched <= 1.3 * missing + 256 * 1024, f"fetched {fetched} B for {missing} B missing"
    s = report.sender_summary
    assert s is not None and {x["addr"] for x in s["receivers"] if x["ok"]} == {ip(h) for h in ("h3", "h5", "h7")}


def test_link_failure_mid_transfer_rerouted(fabric: Fabric, model: ModelFile, tmp_path: Path) -> None:
    with Transfer(fabric, model, "h1", ["h3", "h5", "h7"], rate=SLOW, name="link-failure",
                  workdir=tmp_path) as t:
        t.start_receivers()
        tree = t.group["tree"]
        # the tree's link out of the source's leaf: every receiver depends on it
        a, b = next([p, c] for p, c in tree["links"] if p == TOPO.host("h1").dpid)
        t.start_sender()
        t.wait_sent(0.3)
        try:
            fabric.set_link(a, b, False)
            t.event(f"link {TOPO.switches[a]}-{TOPO.switches[b]} down")
            fabric.controller.wait_group(t.group["id"], lambda g: [a, b] not in g["tree"]["links"]
                                         and g["state"] == "installed", timeout=20)
            t.event("controller rerouted the tree")
            t.refresh_tree()  # the report shows the tree the rest of the file took
            report = t.finish()
        finally:
            fabric.set_link(a, b, True)
            fabric.controller.wait_topology(len(TOPO.switches), len(TOPO.links), timeout=60)
    check(report)
    assert [a, b] not in report.group["tree"]["links"]


def test_controller_sigkilled_and_restarted_mid_transfer(fabric: Fabric, model: ModelFile,
                                                         tmp_path: Path) -> None:
    with Transfer(fabric, model, "h1", ["h3", "h5", "h7", "h8"], rate=SLOW, name="controller-restart",
                  workdir=tmp_path) as t:
        t.start_receivers()
        t.start_sender()
        t.wait_sent(0.2)
        assert t.sender is not None and t.sender.alive()
        fabric.controller.stop(signal.SIGKILL)
        t.event("controller SIGKILLed")
        fabric.controller.start()
        t.event("controller restarted")
        report = t.finish()
        fabric.controller.wait_topology(len(TOPO.switches), len(TOPO.links), timeout=60)
        assert fabric.find_group(t.model_name, ip("h1")) is not None, "group lost across the restart"
    check(report)
