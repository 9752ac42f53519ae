"""The real CLI over a kernel Linux bridge between network namespaces, with injected loss.

One sender and three receivers, each in its own namespace this test creates; one receiver
link drops 10% at random, another drops in bursts, the third is clean. Every receiver must
exit 0 with a byte-identical file, and the lossy ones must have needed repairs (proof
that loss was actually injected). Needs root and ``ip netns``: skipped off CI without
them, a failure under CI=true.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import blake3
import pytest

from lab.bridge import BridgeLab
from lab.models import make_key_file
from tests.support.agents import REPO, cli_argv
from tests.support.lab import bridge_lab

pytestmark = pytest.mark.lab


@pytest.fixture
def lab4():
    with bridge_lab(4) as lab:
        yield lab


def test_three_receivers_with_random_and_bursty_loss(lab4: BridgeLab, tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(random.Random(7).randbytes(6 * 1024 * 1024 + 12345))
    digest = blake3.blake3(model.read_bytes()).hexdigest()
    group = f"232.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}"
    port = random.randint(20000, 60000)
    addr = f"{group}:{port}"
    # The sender's GSO batches cross the veth as one packet each (~100 for this file), so
    # the rule drops whole batches: 10% of them is sure to drop some (1% missed all ~40%
    # of the time), and is heavy loss for the receiver to repair.
    methods = {1: lab4.add_loss(1, "random", port, pct=10.0), 2: lab4.add_loss(2, "bursty", port)}
    key = str(make_key_file(tmp_path / "session.key"))

    receivers = {}
    for host in (1, 2, 3):
        out = tmp_path / f"out{host}.bin"
        receivers[host] = lab4.popen(
            host, *cli_argv("recv", "--group", addr, "--source", lab4.ip(0), "--out", str(out), "--json", "--timeout", "30",
                         "--key-file", key),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        )
    # Receivers join before the stream: give them a moment (late joiners would also be
    # fine -- manifests repeat -- but then the first chunks arrive as repairs).
    time.sleep(0.5)
    sender = lab4.popen(
        0, *cli_argv("send", str(model), "--group", addr, "--interface", lab4.ip(0), "--receivers", "3",
                "--rate", "300", "--gso", "--json", "--timeout", "40", "--key-file", key),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    s_out, s_err = sender.communicate(timeout=55)
    results = {}
    for host, proc in receivers.items():
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, f"receiver h{host} ({methods.get(host, 'clean')}): {err}\n{lab4.loss_counters(host)}"
        results[host] = json.loads(out)
    assert sender.returncode == 0, s_err
    summary = json.loads(s_out)
    assert summary["ok"] and len(summary["receivers"]) == 3
    assert all(r["ok"] for r in summary["receivers"])
    for host, result in results.items():
        assert result["digest_ok"] is True
        assert result["file_digest"] == digest
        assert blake3.blake3((tmp_path / f"out{host}.bin").read_bytes()).hexdigest() == digest
    for host in (1, 2):  # loss really happened on the lossy links, and was repaired
        assert lab4.loss_dropped(host) > 0, f"h{host}: the loss rules dropped nothing"
        # (the bursty rule's one sure drop is the first packet, often the first manifest
        # page: the data that comes before the next page is then held, not asked for)
        assert results[host]["nacks"] > 0 or results[host]["early_held"] > 0, \
            f"h{host}: no NACKs, nothing held -- was loss injected? {lab4.loss_counters(host)}"
    assert summary["repair_bytes"] > 0
