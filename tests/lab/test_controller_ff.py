"""Fast-failover protection on a real Open vSwitch fabric (userspace datapath, netns
hosts): a tree link is taken down under a 1000 datagrams/s sequence-numbered stream and
the receivers' loss window is measured -- with protection (the switches move traffic
onto the pre-installed detour themselves) and without (``--no-protection``: the
controller's PortStatus -> reroute -> barrier path), each also with a CPU hog on every
core, all in the same run on the same lab; and with protection and the controller process
stopped across the cut ("switches alone"), which separates OVS's own failover from what
the controller's move to the new tree adds afterwards (delivery must come back while the
controller is stopped); that once more with ``--no-nicira`` ("plain openflow": detours end
in one flow per group, plain OpenFlow 1.3, as for switches without Open vSwitch's Nicira
actions). The numbers are printed; the bound asserted
with protection (median < 50 ms; < 500 ms with the hog, which starves userspace OVS
itself on 2 cores) is generous so that a shared CI machine passes it, the target is
< 10 ms. The hole after the failover's -- the controller's move to the new tree, also
once the stopped controller resumes -- should be none (issue 12: the move cut old feeds
before every new one was confirmed; tests/controller/test_move.py checks every state a
move passes through); its median is held to the same bounds, and without the hog no
receiver may get a datagram twice (issue 44: moves by version). Each hole's datagrams are
also timed at the sender: a sender starved by the hog catches up in a burst, and a burst
a starved switch drops is the load's loss, not a cut path (``after_sent_ms``)."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

import topologies as T
from controller import ofmsgs
from lab.ovs import Lab
from lab.probes import Capture, send
from tests.support.controller_lab import controller_lab, group_from_h1, wait_for

pytestmark = pytest.mark.lab

TOPO = T.leaf_spine(2, 3, 2)  # h1 h2 @leaf 3, h3 h4 @leaf 4, h5 h6 @leaf 5; spines 1, 2
INTERVAL = 0.001  # 1000 datagrams/s
BOUND_S = 0.050  # asserted with protection (target 10 ms; a shared 2-core CI machine)
BOUND_HOG_S = 0.5  # the same with a CPU hog on every core (OVS's own threads starve)
RECEIVERS = ("h3", "h5")
# failures per mode and load; MODELCAST_FF_REPEATS, MODELCAST_FF_HOG=off (no hog rows) and
# MODELCAST_FF_MODES (a comma list of "protection", "switches alone", "plain openflow",
# "controller reroute")
# narrow a run to what is being looked at
REPEATS = int(os.environ.get("MODELCAST_FF_REPEATS", "3"))
HOGS = {"off": (False,), "only": (True,)}.get(os.environ.get("MODELCAST_FF_HOG", ""), (False, True))
MODES = tuple(m.strip() for m in os.environ.get(
    "MODELCAST_FF_MODES", "protection,switches alone,plain openflow,controller reroute").split(","))
# MODELCAST_FF_KEEP=DIR: each failure's receiver captures kept there (with the cut's and
# the resume's instants), to lay against the controller's MODELCAST_TRACE
KEEP = Path(os.environ["MODELCAST_FF_KEEP"]) if os.environ.get("MODELCAST_FF_KEEP") else None
HOG = "while True: pass"
PAUSE_S = 1.0  # the controller stopped for this long from the cut (the switches' own failover)


@contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    """One busy process per core (started here, stopped here by PID)."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() or 1)] if on else []
    try:
        time.sleep(0.3 if on else 0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def ff_groups(lab: Lab, dpid: int) -> int:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-groups", lab.bridge(dpid)],
                         capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"type=ff", out))


def turn_groups(lab: Lab, dpid: int) -> list[int]:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-groups", lab.bridge(dpid)],
                         capture_output=True, text=True, check=True).stdout
    return [int(x) for x in re.findall(r"group_id=(\d+)", out) if ofmsgs.is_turn(int(x))]


def nicira_flows(lab: Lab, dpid: int) -> list[str]:
    """The switch's flows with a Nicira action (a detour's shared rejoin: move, load, resubmit)."""
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", lab.bridge(dpid)],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if re.search(r"resubmit|move:|load:", line)]


def metric_ff_groups(ctl) -> dict[int, int]:
    text = ctl.api("GET", "/metrics").text
    return {int(d): int(float(v)) for d, v in re.findall(
        r'modelcast_switch_entries\{dpid="(\d+)",kind="ff_groups"\} (\S+)', text)}


@contextmanager
def paused(ctl, on: bool) -> Iterator[None]:
    """The controller process stopped (SIGSTOP) for the block, so only the switches act."""
    if on:
        os.kill(ctl.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if on:
            os.kill(ctl.proc.pid, signal.SIGCONT)


def holes_of(recs: list[tuple[int, float]]) -> list[tuple[float, int, int]]:
    """(arrival time of the datagram before the hole, datagrams missing, that datagram's
    sequence number) for every run of consecutive sequence numbers that never arrived."""
    first: dict[int, float] = {}
    for s_, t in recs:
        first.setdefault(s_, t)
    order = sorted(first)
    return [(first[x], y - x - 1, x) for x, y in zip(order, order[1:]) if y - x > 1]


def measure(lab: Lab, ctl, work, gid: int, hog: bool, pause: bool = False,
            name: str = "failure", receivers: tuple[str, ...] = RECEIVERS,
            link: tuple[int, int] | None = None, topo: T.Topology = TOPO) -> dict[str, float]:
    """Take a downstream tree link down under the stream; the receivers' loss window.
    With ``pause`` the controller is stopped from just before the cut until PAUSE_S
    after it: the window is then the switches' failover alone (OVS noticing the carrier
    loss and moving its datapath flows onto the FF backup bucket), and delivery must be
    back before the controller runs again. ``after_ms``: the longest hole after that
    first one -- after the controller resumed (``pause``), or after the failover's own
    hole (the controller's move to the new tree must not cut delivery)."""
    g = ctl.wait_group(gid, lambda g: g["state"] == "installed")
    # ``link``, else a spine -> leaf link of the tree (the spine's FF group protects it)
    a, b = link or next((p, c) for p, c in g["tree"]["links"] if p in (1, 2))
    assert [a, b] in g["tree"]["links"], (a, b, g["tree"]["links"])
    probes = {h: Capture(lab, h, g["address"], work) for h in receivers}
    sent_log = Path(work) / "sent.txt"
    sender = send(lab, "h1", g["address"], g["port"], INTERVAL, 1_000_000, log=sent_log)
    try:
        assert wait_for(lambda: all(len(p.seqs()) > 300 for p in probes.values()), 10)
        with cpu_hog(hog):
            with paused(ctl, pause):
                down_at = time.time()
                lab.set_link(a, b, False)
                if pause:
                    time.sleep(PAUSE_S)
                    for h, p in probes.items():  # the switches alone restored delivery
                        assert len([t for _, t in p.records() if t > down_at + PAUSE_S / 2]) > 20, h
                resumed = time.time()
            ctl.wait_group(gid, lambda g: [a, b] not in g["tree"]["links"]
                           and g["state"] == "installed", timeout=15)
            time.sleep(1.0)
        last_sent = time.time()
        time.sleep(0.3)
    finally:
        sender.kill()
        sender.wait()
    result = {"lost": 0.0, "gap_ms": 0.0, "dups": 0.0, "window_ms": 0.0, "before_ms": 0.0,
              "at_ms": 0.0, "after_ms": 0.0, "after_at_ms": 0.0, "after_sent_ms": 0.0}
    # when each datagram left the sender: a hole of n datagrams sent over n ms is a cut
    # path; n datagrams sent within a few ms (a sender starved by the load catching up
    # in a burst) and dropped by a full queue is the load's, not the controller's
    sent = {int(a): float(b) for a, b in (line.split() for line in sent_log.read_text().splitlines()
                                          if len(line.split()) == 2)}
    if KEEP:
        (KEEP / f"{name}-sent.txt").write_text(sent_log.read_text())
    for h, p in probes.items():
        recs = [(s, t) for s, t in p.records() if down_at - 0.5 <= t <= last_sent]
        p.stop()
        if KEEP:  # the capture and the instants, to lay against the controller's trace
            (KEEP / f"{name}-{h}.txt").write_text(
                f"# down_at {down_at:.4f} resumed {resumed:.4f} link {a}-{b} pause {pause} hog {hog}\n"
                + p.path.read_text())
        seqs = [s for s, _ in recs]
        assert seqs, f"{h} received nothing around the failure"
        result["dups"] += len(seqs) - len(set(seqs))
        result["lost"] = max(result["lost"], (max(seqs) - min(seqs) + 1) - len(set(seqs)))
        ts = [t for _, t in recs if t <= (resumed if pause else last_sent)]
        result["gap_ms"] = max(result["gap_ms"], max(y - x for x, y in zip(ts, ts[1:])) * 1000)
        # the loss window: the longest run of consecutive datagrams lost, times the
        # sending interval (the sender keeps its schedule, so this does not depend on when
        # the receiver's capture process got the CPU), for runs starting after the failure
        holes = holes_of(recs)
        after = [(n, t) for t, n, _ in holes if down_at - 0.05 <= t <= (resumed if pause else last_sent)]
        if after and 1000 * INTERVAL * max(after)[0] > result["window_ms"]:
            n, t = max(after)
            result["window_ms"], result["at_ms"] = 1000 * INTERVAL * n, (t - down_at) * 1000
        # what follows the switches' failover: holes after the controller resumed, or
        # after the first hole of the failure when it ran throughout
        later = [(n, t, x) for t, n, x in (
            [hole for hole in holes if hole[0] > resumed] if pause
            else sorted(hole for hole in holes if hole[0] >= down_at - 0.05)[1:])]
        if later and 1000 * INTERVAL * max(later)[0] > result["after_ms"]:
            n, t, x = max(later)
            result["after_ms"], result["after_at_ms"] = 1000 * INTERVAL * n, (t - down_at) * 1000
            if x + 1 in sent and x + n in sent:
                result["after_sent_ms"] = 1000 * (sent[x + n] - sent[x + 1] + INTERVAL)
        # the same measure in the 0.5 s before the failure: what the load alone costs
        result["before_ms"] = max(result["before_ms"], 1000 * INTERVAL * max(
            (n for t, n, _ in holes if t < down_at - 0.05), default=0))
    lab.set_link(a, b, True)
    ctl.wait_topology(switches=len(topo.switches), links=len(topo.links))
    return result


def test_loss_window_with_and_without_protection(tmp_path, capsys):
    work = tmp_path
    rows = []
    with controller_lab(TOPO, work) as (lab, ctl):
        gid = group_from_h1(lab, ctl, TOPO, "ff-test", RECEIVERS)["id"]
        # protection armed, and the controller's count is what the switches hold
        assert wait_for(lambda: metric_ff_groups(ctl) == {d: ff_groups(lab, d) for d in TOPO.switches}, 5)
        assert sum(ff_groups(lab, d) for d in TOPO.switches) > 0
        for hog in HOGS:
            for mode, pause in (("protection", False), ("switches alone", True)):
                if mode not in MODES:
                    continue
                for i in range(REPEATS):
                    name = f"{'alone' if pause else 'prot'}-{'hog' if hog else 'idle'}-{i}"
                    rows.append((mode, hog, measure(lab, ctl, work, gid, hog, pause, name)))
                    # re-armed for the new tree: the switches hold what the controller counts
                    assert wait_for(lambda: metric_ff_groups(ctl) == {
                        d: ff_groups(lab, d) for d in TOPO.switches}, 5)

        # the same lab and group, the controller restarted with --no-nicira (as for
        # switches without Open vSwitch's Nicira actions): the reconnect replaces each
        # link's shared rejoin flow by one per group and link, and those bypass a failure
        # with the controller stopped too
        if "plain openflow" in MODES:
            assert any(nicira_flows(lab, d) for d in TOPO.switches)  # (shared rejoin flows)
            # (OVS describes itself as such, and has fast-failover groups: nothing fell back)
            assert ctl.api("GET", "/v1/health").json()["protection"] == {
                "on": True, "detour_ends": "per-link", "unprotected_switches": []}, ctl.log_text()
            assert "not rate-limited" not in ctl.log_text()  # (and meters: its punts stay metered)
            ctl.stop()
            ctl.args = ["--no-nicira"]
            ctl.start()
            ctl.wait_topology(switches=len(TOPO.switches), links=len(TOPO.links))
            ctl.wait_group(gid, lambda g: g["state"] == "installed", timeout=20)
            assert wait_for(lambda: not any(nicira_flows(lab, d) for d in TOPO.switches), 10), \
                "the reconnect left a Nicira action on a switch"
            assert ctl.api("GET", "/v1/health").json()["protection"]["detour_ends"] == "per-group"
            for i in range(REPEATS):
                rows.append(("plain openflow", False, measure(lab, ctl, work, gid, False, True, name=f"plain-{i}")))
                assert not any(nicira_flows(lab, d) for d in TOPO.switches)

        # the same lab and group, the controller restarted without protection
        if "controller reroute" not in MODES:
            with capsys.disabled():  # (the figures in CI's log too)
                return print_rows(rows)
        ctl.stop()
        ctl.args = ["--no-protection"]
        ctl.start()
        ctl.wait_topology(switches=len(TOPO.switches), links=len(TOPO.links))
        ctl.wait_group(gid, lambda g: g["state"] == "installed", timeout=20)
        assert wait_for(lambda: sum(ff_groups(lab, d) for d in TOPO.switches) == 0, 10), \
            "the reconnect did not remove the FF groups"
        for hog in HOGS:
            for i in range(REPEATS):
                name = f"noprot-{'hog' if hog else 'idle'}-{i}"
                rows.append(("controller reroute", hog, measure(lab, ctl, work, gid, hog, name=name)))
        assert ctl.api("DELETE", f"/v1/groups/{gid}").status_code == 204
    with capsys.disabled():
        print_rows(rows)


def print_rows(rows: list) -> None:
    print("\nloss window at the receivers when a tree link goes down (1000 datagrams/s, "
          f"{os.cpu_count()} cores):")
    for mode, hog, m in rows:
        print(f"  {mode:18} cpu hog {'on ' if hog else 'off'}: loss window {m['window_ms']:.1f} ms "
              f"(from {m['at_ms']:.0f} ms after the link went down) "
              f"(0.5 s before it: {m['before_ms']:.1f} ms); then {m['after_ms']:.0f} ms "
              f"(from {m['after_at_ms']:.0f} ms, sent over {m['after_sent_ms']:.0f} ms); "
              f"{m['lost']:.0f} datagrams lost in all, "
              f"longest gap between arrivals {m['gap_ms']:.1f} ms, {m['dups']:.0f} duplicates")
    # every move after a failure is a versioned one: no receiver gets a datagram twice (with
    # the hog on every core the userspace switch can lag its own revalidation past the
    # plan's waits: counted and printed, not held to 0)
    doubled = [(mode, m["dups"]) for mode, hog, m in rows if not hog and m["dups"]]
    assert not doubled, doubled
    for mode in ("protection", "switches alone", "plain openflow", "controller reroute"):
        for hog in (False, True):
            got = [m for md, h, m in rows if (md, h) == (mode, hog)]
            if not got:
                continue
            w = sorted(m["window_ms"] for m in got)
            later = sorted(m["after_ms"] for m in got)
            print(f"  {mode:18} cpu hog {'on ' if hog else 'off'}: loss window median "
                  f"{statistics.median(w):.0f} ms (min {w[0]:.0f}, max {w[-1]:.0f}, {len(w)} failures); "
                  f"the hole after it {'(controller resumed)' if mode in ('switches alone', 'plain openflow') else '(the move)'}: "
                  f"median {statistics.median(later):.0f} ms (max {later[-1]:.0f})")
            if mode in ("protection", "plain openflow"):  # the median: one failure may meet a busy moment
                # with the hog on every core the switch itself (userspace OVS) is starved:
                # its failover then takes up to a few hundred ms on a loaded 2-core machine
                assert statistics.median(w) / 1000 < (BOUND_HOG_S if hog else BOUND_S), (hog, w)
            if mode != "controller reroute":  # the move after the failover cuts nothing
                assert statistics.median(later) / 1000 < (BOUND_HOG_S if hog else BOUND_S), (hog, later)
            else:  # the stream did lose datagrams there: the measurement sees failures
                assert w[-1] > 0, (hog, w)


def test_a_move_that_turns_the_tree_around_loses_nothing(tmp_path, capsys):
    """ring:6, a group from h1 (s1) to h2, h3 and h4: the tree runs s1 -> s2 -> s3 -> s4.
    Link s1-s2 fails; the FF group at s1 sends the copies round the ring to s2 (arriving
    from s3, one of s2's own tree ports: once with the controller stopped), and the
    controller's new tree runs the other way, s1 -> s6 -> s5 -> s4 -> s3 -> s2: s3 turns
    from copying to s4 to copying to s2 (it holds the new direction in a turn group until
    the old feed is cut, ``controller.core``). The link comes back (the tree stays: no
    churn), then s1-s6 fails and the tree turns back; and so on. The switches' failover
    hole is measured as above; the move after it must lose nothing."""
    topo = T.ring(6, 1)
    work = tmp_path
    rows = []
    with controller_lab(topo, work) as (lab, ctl):
        receivers = ("h2", "h3", "h4")
        g = group_from_h1(lab, ctl, topo, "turn-test", receivers)
        gid = g["id"]
        way = ([1, 2], [2, 3], [3, 4])  # the tree's path to s4 this way round, and the other
        other = ([1, 6], [6, 5], [5, 4], [4, 3], [3, 2])
        assert all(k in g["tree"]["links"] for k in way), g["tree"]
        for i in range(max(REPEATS, 2) + 1):
            # the last failure with the controller stopped: the detour arrives at s2 over
            # its own tree port to s3, and the switches alone must send it on to s3 (the
            # detour's last flow looks the copy up as if it came over the failed link)
            alone = i == max(REPEATS, 2)
            m = measure(lab, ctl, work, gid, False, pause=alone, name=f"turn-{i}", receivers=receivers,
                        link=tuple(way[0]), topo=topo)
            g = ctl.wait_group(gid, lambda g: g["state"] == "installed")
            assert all(k in g["tree"]["links"] for k in other), g["tree"]  # it turned
            assert not any(turn_groups(lab, d) for d in topo.switches), "a turn group was left behind"
            rows.append(("switches alone" if alone else "protection", False, m))
            way, other = other, way
        assert ctl.api("DELETE", f"/v1/groups/{gid}").status_code == 204
    print("\nring:6, the tree turned around by each move:")
    with capsys.disabled():
        print_rows(rows)
    assert all(m["after_ms"] == 0 for _, _, m in rows), [m["after_ms"] for _, _, m in rows]
