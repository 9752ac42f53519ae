"""The Vagrant lab VM recipe: the Vagrantfile parses (``vagrant validate``) and provisions
with the very scripts CI runs, so a green CI means the VM's install steps work too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.lab import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


def test_provisioning_runs_the_ci_install_scripts() -> None:
    vagrantfile = (REPO / "Vagrantfile").read_text()
    assert "scripts/vagrant-provision.sh" in vagrantfile
    assert 'guest: 8080' in vagrantfile
    script = (REPO / "scripts" / "vagrant-provision.sh").read_text()
    assert "bash scripts/lab-deps.sh" in script and "bash scripts/venv.sh" in script
    subprocess.run(["bash", "-n", str(REPO / "scripts" / "vagrant-provision.sh")], check=True)


def test_vagrant_validate(tmp_path: Path) -> None:
    if shutil.which("vagrant") is None:
        # Under CI the install step is what makes this run: once lab-deps.sh installs
        # vagrant, its absence is a failure; until then the check is optional.
        if os.environ.get("CI") == "true" and "vagrant" in (REPO / "scripts" / "lab-deps.sh").read_text():
            pytest.fail("vagrant missing under CI=true although scripts/lab-deps.sh installs it")
        pytest.skip("vagrant not installed (apt-get install --no-install-recommends vagrant)")
    # A copy in a scratch dir: validate may create .vagrant/ next to the Vagrantfile.
    shutil.copy(REPO / "Vagrantfile", tmp_path / "Vagrantfile")
    env = {**os.environ, "VAGRANT_HOME": str(tmp_path / "vagrant.d"), "VAGRANT_CHECKPOINT_DISABLE": "1"}
    proc = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "validated successfully" in proc.stdout


def _vagrantfile_copy_and_provision() -> tuple[list[str], str]:
    """The rsync excludes of the synced folder and the inline provision command, as the
    Vagrantfile states them (so the test below follows the file, not a copy of it)."""
    text = (REPO / "Vagrantfile").read_text()
    excludes = re.findall(r'"([^"]+)"', re.search(r"rsync__exclude:\s*\[(.*?)\]", text, re.S).group(1))
    inline = re.search(r'inline:\s*"([^"]+)"', text).group(1)
    return excludes, inline


@pytest.mark.lab
@pytest.mark.slow
@pytest.mark.timeout(1500)  # the provisioning it runs may take its 1200 s
def test_provisioning_builds_a_working_lab_on_this_debian(tmp_path: Path) -> None:
    """Do what `vagrant up` does inside the VM, on this machine: copy the tree with the
    Vagrantfile's rsync excludes to where the VM mounts it, run its inline provision
    command there, and check the result is usable: the venv runs the controller and the
    agent, and Open vSwitch answers. (No VM provider runs here; the box is Debian 12 like
    this machine.)"""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        skip_or_fail("provisioning needs root and apt-get")
    excludes, inline = _vagrantfile_copy_and_provision()
    assert "/opt/modelcast/scripts/vagrant-provision.sh" in inline
    dest = tmp_path / "modelcast"
    dest.mkdir()
    if shutil.which("rsync") is None:
        skip_or_fail("rsync is not installed (scripts/lab-deps.sh installs it)")
    subprocess.run(["rsync", "-a", *[f"--exclude={e}" for e in excludes], f"{REPO}/", f"{dest}/"],
                   check=True)
    assert not (dest / ".venv").exists() and (dest / "scripts" / "lab-deps.sh").exists()
    cmd = inline.replace("/opt/modelcast", str(dest))
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "provision: ready" in proc.stdout
    venv = dest / ".venv" / "bin"
    for tool in ("modelcast", "modelcast-controller"):
        run = subprocess.run([str(venv / tool), "--help"], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and "usage" in run.stdout.lower(), run.stderr[-2000:]
    ovs = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True, text=True)
    assert ovs.returncode == 0, ovs.stderr
