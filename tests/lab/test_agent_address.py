"""The agent's own address and its network errors in a host shaped like the demo's: a
fabric interface that carries the multicast route, a management network that carries
the default route, and the controller reached on this host's loopback. Each test runs
the agent inside a network namespace of its own (``unshare --net``), which ends with
the process: nothing is left to clean up."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.agents import REPO
from tests.support.lab import need_lab, skip_or_fail

pytestmark = pytest.mark.lab

FABRIC_IP, MGMT_IP = "10.0.0.1", "169.254.9.1"
# lo up; the fabric and the management network are veth pairs (both ends here, up)
DEMO_HOST = f"""
ip link set lo up
ip link add fab0 type veth peer name fab1
ip link add mg0 type veth peer name mg1
ip addr add {FABRIC_IP}/24 dev fab0
ip addr add {MGMT_IP}/24 dev mg0
for i in fab0 fab1 mg0 mg1; do ip link set $i up; done
ip route add default via 169.254.9.254 dev mg0
ip route add 224.0.0.0/4 dev fab0
"""


def in_namespace(setup: str, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``argv`` in a fresh network namespace after the shell lines ``setup``."""
    need_lab(ovs=False)
    if shutil.which("unshare") is None:
        skip_or_fail("unshare (util-linux) is not installed")
    script = f"set -e\n{setup}\nexec \"$@\""
    return subprocess.run(["unshare", "--net", "sh", "-c", script, "sh", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def test_a_sender_registers_its_fabric_address_not_the_controllers_route(tmp_path: Path) -> None:
    """The newcomer's failure: with the controller on 127.0.0.1 (or across a management
    network) the sender registered itself as 127.0.0.1. It must register the address
    its multicast leaves from."""
    model = tmp_path / "m.bin"
    model.write_bytes(b"x" * 100_000)
    script = textwrap.dedent(f"""
        import json
        from hostagent.cli import main
        from tests.support.agents import FakeController
        with FakeController(5500, stuck_state="pending") as fake:
            code = main(["send", {str(model)!r}, "--controller", fake.url, "--insecure", "--wait-timeout", "0.2",
                         "--poll", "0.05", "--quiet"])
            print(json.dumps({{"code": code, "posts": [b for m, p, b, _ in fake.calls if p == "/v1/groups"]}}))
    """)
    done = in_namespace(DEMO_HOST, sys.executable, "-c", script)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["code"] == 1  # (the fake never installs the tree)
    assert [post["source"] for post in result["posts"]] == [FABRIC_IP]


def test_a_host_with_no_fabric_route_is_told_the_candidates(tmp_path: Path) -> None:
    """No multicast route and no default route: the error names both addresses and --ip."""
    model = tmp_path / "m.bin"
    model.write_bytes(b"x" * 100_000)
    setup = "\n".join(line for line in DEMO_HOST.splitlines() if "route" not in line)
    script = textwrap.dedent(f"""
        from hostagent.cli import main
        from tests.support.agents import FakeController
        with FakeController(5500) as fake:
            raise SystemExit(main(["recv", "--controller", fake.url, "--model", "m", "--source", "10.9.9.9",
                                   "--out", {str(tmp_path / "o.bin")!r}]))
    """)
    done = in_namespace(setup, sys.executable, "-c", script)
    assert done.returncode == 1
    err = done.stderr.strip().splitlines()[-1]
    assert err.startswith("modelcast: error: cannot tell this host's address on the multicast fabric")
    assert f"candidates: {FABRIC_IP} (fab0), {MGMT_IP} (mg0)" in err and "--ip ADDR" in err


def test_network_errors_name_the_address(tmp_path: Path) -> None:
    """ENETUNREACH and ENODEV in a host with no routes at all: the group in each line."""
    model = tmp_path / "m.bin"
    model.write_bytes(b"x" * 1000)
    key = tmp_path / "key"
    key.write_text("7" * 64)
    send = in_namespace("ip link set lo up", sys.executable, "-m", "hostagent.cli", "send", str(model),
                        "--group", "232.1.2.3:5500", "--key-file", str(key))
    assert send.returncode == 1
    assert send.stderr.startswith("modelcast: error: route to 232.1.2.3 (no multicast route")
    assert send.stderr.rstrip().endswith("Network is unreachable (ENETUNREACH)")
    recv = in_namespace("ip link set lo up", sys.executable, "-m", "hostagent.cli", "recv", "--group",
                        "232.1.2.3:5500", "--key-file", str(key), "--source", "10.0.0.7", "--out",
                        str(tmp_path / "o.bin"))
    assert recv.returncode == 1
    assert recv.stderr.strip() == "modelcast: error: joining 232.1.2.3 from source 10.0.0.7: No such device (ENODEV)"
