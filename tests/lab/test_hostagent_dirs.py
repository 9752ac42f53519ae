"""Whole model directories with the real CLI on a kernel-bridge netns lab (issue 13 parts
1, 2 and 4): a 40-file directory (three multi-MB shards, tiny config and tokenizer files,
an empty file, subdirectories, modes 755/600/644) to three receivers in one session --
one SIGKILLed mid-transfer and restarted resumes from its record, one that expects
another content id refuses every manifest and exits 1; the output appears only once
verified. And a multi-shard safetensors model built here (nothing downloaded), loaded on
each receiver by its ``--on-complete`` hook and compared tensor by tensor. And issue 46's
finding 4 re-run: in a shared sticky directory another user (uid 65534) plants the
temporary directory and the resume record of a model and swaps its ``config.json`` there
and at OUT as fast as it can; the receiver uses neither, says so, and OUT holds the
model. Needs root: skipped off CI, a failure under CI=true."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

import msgpack
import pytest

from hostagent.dirs import DirSource
from hostagent.sender import file_digests
from lab.bridge import BridgeLab
from lab.models import make_key_file, make_model_dir, tree_of

from tests.support.agents import REPO, cli_argv
from tests.support.lab import bridge_lab, need_module


pytestmark = pytest.mark.lab

MIB = 1024 * 1024
CHUNK = 256 * 1024


@pytest.fixture
def lab4() -> Iterator[BridgeLab]:
    with bridge_lab(4) as lab:
        yield lab


def _group() -> str:
    return f"232.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}:{random.randint(20000, 60000)}"


def _recv(lab: BridgeLab, host: int, group: str, out: Path, key: Path, *extra: str) -> subprocess.Popen:
    return lab.popen(host, *cli_argv("recv", "--group", group, "--source", lab.ip(0), "--out", str(out),
                                     "--json", "--timeout", "8", "--key-file", str(key), *extra),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _send(lab: BridgeLab, group: str, path: Path, key: Path, receivers: int, rate: str) -> subprocess.Popen:
    return lab.popen(0, *cli_argv("send", str(path), "--group", group, "--interface", lab.ip(0),
                                  "--receivers", str(receivers), "--rate", rate, "--chunk-size", str(CHUNK),
                                  "--json", "--timeout", "30", "--key-file", str(key)),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _finish(proc: subprocess.Popen, timeout: float = 90) -> tuple[int, Optional[dict], str]:
    out, err = proc.communicate(timeout=timeout)
    lines = out.strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else None, err


def _held(tmp: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in tmp.rglob("*") if p.is_file()) if tmp.exists() else 0


def test_a_40_file_directory_in_one_session_with_a_killed_receiver_resuming_and_a_wrong_expect(
        lab4: BridgeLab, tmp_path: Path) -> None:
    src = make_model_dir(tmp_path / "model", seed=13, files=40, big=3, big_size=4 * MIB)
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    key = make_key_file(tmp_path / "session.key")
    group = _group()
    outs = [tmp_path / f"rx{i}" / "model" for i in (1, 2, 3)]
    for out in outs:
        out.parent.mkdir()
    hook_log = tmp_path / "hook.txt"
    hook = f"{sys.executable} -c \"import sys; open('{hook_log}', 'w').write(sys.argv[1])\""
    wrong = "blake3:" + "0" * 64
    rx1 = _recv(lab4, 1, group, outs[0], key, "--on-complete", hook)
    killed = _recv(lab4, 2, group, outs[1], key)
    rx3 = _recv(lab4, 3, group, outs[2], key, "--expect", wrong)
    time.sleep(0.5)
    sender = _send(lab4, group, src, key, receivers=2, rate="40")
    tmp2 = outs[1].parent / ".model.modelcast-tmp"
    deadline = time.monotonic() + 30
    while _held(tmp2) < 0.6 * total:  # (records lag the data by up to a save interval and a verify)
        assert killed.poll() is None, killed.communicate()[1]
        assert time.monotonic() < deadline, "receiver 2 never got 60% of the model"
        time.sleep(0.005)
    assert not outs[1].exists(), "a half-written model is never at OUT"
    killed.kill()
    killed.wait(10)
    restarted = _recv(lab4, 2, group, outs[1], key)
    results = [_finish(p) for p in (rx1, restarted, rx3)]
    s_code, s_sum, s_err = _finish(sender)
    assert s_code == 0 and s_sum is not None and s_sum["ok"], s_err
    assert s_sum["files"] == 40 and s_sum["bytes"] == total
    cid = s_sum["content_id"]
    assert cid.startswith("blake3:")
    want = tree_of(src)
    for (code, summary, err), out in zip(results[:2], outs[:2]):
        assert code == 0 and summary is not None and summary["digest_ok"], err
        assert summary["content_id"] == cid and summary["files"] == 40
        assert tree_of(out) == want  # bytes and modes of all 40 files
        assert not (out.parent / ".model.modelcast-tmp").exists()
        assert not (out.parent / "model.modelcast-state").exists()
    assert hook_log.read_text() == str(outs[0]), "--on-complete gets the directory"
    resumed = results[1][1]
    assert resumed["resumed_chunks"] * CHUNK >= 0.3 * total, resumed
    code, summary, err = results[2]
    assert code == 1 and summary is not None and not summary["digest_ok"], err
    assert summary["dropped"].get("wrong_content_id", 0) >= 1, summary
    assert not outs[2].exists() and not (outs[2].parent / ".model.modelcast-tmp").exists()
    print(f"40 files, {total / MIB:.1f} MiB: receiver 2 killed at >=50%, resumed "
          f"{resumed['resumed_chunks'] * CHUNK / total:.0%} from its record; "
          f"wrong --expect dropped {summary['dropped']['wrong_content_id']} manifests")


LOAD_CHECK = """\
import json, sys
from pathlib import Path
import numpy as np
from safetensors.numpy import load_file
src, out = Path(sys.argv[1]), Path(sys.argv[2])
index = json.loads((out / "model.safetensors.index.json").read_text())
shards = sorted(set(index["weight_map"].values()))
got = {}
for shard in shards:
    got.update(load_file(str(out / shard)))
want = {}
for shard in shards:
    want.update(load_file(str(src / shard)))
assert set(got) == set(want) == set(index["weight_map"]), "tensor names"
for name, tensor in want.items():
    assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
    assert np.array_equal(got[name], tensor), name
print(f"loaded {len(got)} tensors from {len(shards)} shards")
"""


def _safetensors_model(root: Path, shards: int = 4, layers_per_shard: int = 3) -> Path:
    """A small Hugging Face-style checkpoint: sharded safetensors, index, config, tokenizer."""
    np = need_module("numpy")
    save_file = need_module("safetensors.numpy").save_file
    rng = np.random.default_rng(5)
    root.mkdir()
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {}
        for layer in range(s * layers_per_shard, (s + 1) * layers_per_shard):
            tensors[f"layers.{layer}.attn.weight"] = rng.standard_normal((256, 256), dtype=np.float32)
            tensors[f"layers.{layer}.mlp.weight"] = rng.standard_normal((256, 512)).astype(np.float16)
            tensors[f"layers.{layer}.norm"] = rng.integers(0, 100, 256, dtype=np.int64)
        save_file(tensors, str(root / name))
        weight_map.update(dict.fromkeys(tensors, name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "toy", "num_hidden_layers": shards * layers_per_shard}))
    (root / "tokenizer.json").write_text(json.dumps({"vocab": {f"t{i}": i for i in range(500)}}))
    return root


def test_a_sharded_safetensors_model_loads_on_every_receiver(lab4: BridgeLab, tmp_path: Path) -> None:
    src = _safetensors_model(tmp_path / "toy-model")
    check = tmp_path / "load_check.py"
    check.write_text(LOAD_CHECK)
    key = make_key_file(tmp_path / "session.key")
    group = _group()
    outs = [tmp_path / f"rx{i}" / "toy-model" for i in (1, 2, 3)]
    procs = []
    for i, out in enumerate(outs, start=1):
        out.parent.mkdir()
        hook = f"{sys.executable} {check} {src}"
        procs.append(_recv(lab4, i, group, out, key, "--on-complete", hook))
    time.sleep(0.5)
    sender = _send(lab4, group, src, key, receivers=3, rate="150")
    s_code, s_sum, s_err = _finish(sender)
    assert s_code == 0 and s_sum is not None and s_sum["ok"], s_err
    for proc, out in zip(procs, outs):
        code, summary, err = _finish(proc)
        assert code == 0 and summary is not None and summary["ok"], err
        assert summary["on_complete"]["exit_status"] == 0 and "loaded 36 tensors from 4 shards" in err
        assert summary["content_id"] == s_sum["content_id"]
        assert tree_of(out) == tree_of(src)


# A local user of the receiving host (uid 65534) who planted the temporary directory:
# swaps config.json for its own in it and at OUT, as often as it can, until SIGTERM;
# prints how often each swap succeeded.
SWAPPER = """
import json, os, signal, sys, time
swaps = {"tmp": 0, "out": 0}
signal.signal(signal.SIGTERM, lambda *a: (print(json.dumps(swaps), flush=True), os._exit(0)))
print("ready", flush=True)
while True:
    for where, folder in (("tmp", sys.argv[1]), ("out", sys.argv[2])):
        target = os.path.join(folder, "config.json")
        try:
            with open(target + ".evil", "wb") as handle:
                handle.write(b'{"evil": true}')
            os.replace(target + ".evil", target)
            swaps[where] += 1
        except OSError:
            pass
    time.sleep(0.002)
"""


def test_a_planted_temporary_directory_and_record_in_a_shared_directory_are_not_used(
        lab4: BridgeLab, tmp_path: Path) -> None:
    src = make_model_dir(tmp_path / "model", seed=17, files=12, big=2, big_size=2 * MIB)
    (src / "config.json").write_text('{"hidden_size": 64}')
    key = make_key_file(tmp_path / "session.key")
    shared = Path(tempfile.mkdtemp(prefix="modelcast-lab-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    try:
        shared.chmod(0o1777)
        out, planted, record = shared / "model", shared / ".model.modelcast-tmp", shared / "model.modelcast-state"
        shutil.copytree(src, planted)  # the model's own files: a reused directory would verify
        source = DirSource(str(src))
        whole = file_digests(source, CHUNK)[1]
        record.write_bytes(msgpack.packb({"v": 1, "digest": whole, "size": source.size, "chunk": CHUNK,
                                          "verified": [[0, -(-source.size // CHUNK)]], "complete": False, "rid": 5}))
        source.close()
        for top, dirs, files in os.walk(planted):
            for path in [top, *(os.path.join(top, f) for f in files)]:
                os.chmod(path, 0o777 if os.path.isdir(path) else 0o666)
                os.chown(path, 65534, 65534)
        os.chown(record, 65534, 65534)
        script = shared / "swap.py"
        script.write_text(SWAPPER)
        swapper = lab4.popen(1, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                             str(script), str(planted), str(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        assert swapper.stdout is not None and swapper.stdout.readline() == "ready\n", swapper.communicate()[1]
        group = _group()
        rx = _recv(lab4, 1, group, out, key)
        time.sleep(0.5)
        sender = _send(lab4, group, src, key, receivers=1, rate="100")
        code, summary, err = _finish(rx)
        s_code, _, s_err = _finish(sender)
        time.sleep(0.5)  # the swapper has a go at OUT too
        swapper.send_signal(signal.SIGTERM)
        swaps = json.loads(swapper.communicate(timeout=10)[0])
        assert code == 0 and summary is not None and summary["digest_ok"], err
        assert s_code == 0, s_err
        assert tree_of(out) == tree_of(src)
        assert os.stat(out).st_uid == os.geteuid() and not os.stat(out).st_mode & 0o022
        assert swaps["tmp"] > 0 and swaps["out"] == 0, swaps
        assert summary["resumed_chunks"] == 0, "the planted record was used"
        assert f"ignoring {planted}" in err and f"ignoring resume record {record}" in err, err
        assert os.stat(planted).st_uid == 65534 and record.exists(), "what was planted is left alone"
        print(f"planted directory and record ignored; the other user swapped config.json {swaps['tmp']} times "
              f"in its own directory and 0 times at OUT; OUT verified")
    finally:
        shutil.rmtree(shared, ignore_errors=True)
