"""A small Hugging Face model made by the test, in the cache layout the hub writes
(``models--ORG--NAME/{blobs,refs,snapshots/<commit>}``): a config, a tokenizer file, a
shard index and two safetensors shards, so the real libraries can be pointed at it
offline. The hub is never reached; its naming is reproduced here on purpose (LFS files'
blobs by sha256, small files' by git blob sha1, relative symlinks, ``refs/main`` without
a newline) so the code under test is checked against huggingface_hub, not against itself."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class HfModel:
    """What a made model holds: its id, commit, every file's bytes and each shard's tensors."""

    repo: str
    commit: str
    files: dict[str, bytes]
    tensors: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # shard file -> name -> array
    lfs: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return sum(len(b) for b in self.files.values())


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def model_files(repo: str, seed: int, shard_elems: int = 250_000) -> HfModel:
    """The files of a tiny two-shard model (float32 tensors; ``shard_elems`` per shard)."""
    from safetensors.numpy import save

    rng = np.random.default_rng(seed)
    half = shard_elems // 2
    tensors = {
        "model-00001-of-00002.safetensors": {
            "embed.weight": rng.standard_normal((half // 64, 64), dtype=np.float32),
            "layers.0.weight": rng.standard_normal((half // 32, 32), dtype=np.float32),
        },
        "model-00002-of-00002.safetensors": {
            "layers.1.weight": rng.standard_normal((half // 32, 32), dtype=np.float32),
            "lm_head.weight": rng.standard_normal((half // 64, 64), dtype=np.float32),
            "norm.bias": rng.standard_normal(64, dtype=np.float32).astype(np.float16),
        },
    }
    files: dict[str, bytes] = {
        "config.json": json.dumps({"model_type": "toy", "hidden_size": 64, "seed": seed}, indent=2).encode(),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {
            f"t{i}": i for i in range(200)}}}).encode(),
    }
    weight_map = {}
    for shard, named in tensors.items():
        files[shard] = save(named, metadata={"format": "pt"})
        weight_map.update({name: shard for name in named})
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": sum(a.nbytes for t in tensors.values() for a in t.values())},
         "weight_map": weight_map}, indent=2).encode()
    commit = hashlib.sha1(repr((repo, seed, sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())))
                          .encode()).hexdigest()
    return HfModel(repo, commit, files, tensors, tuple(sorted(tensors)))


def write_hub_cache(cache: Path, model: HfModel, refs: tuple[str, ...] = ("main",)) -> Path:
    """``model`` into ``cache`` as the hub's downloads leave it; returns the snapshot."""
    folder = cache / ("models--" + model.repo.replace("/", "--"))
    snap = folder / "snapshots" / model.commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for rel, data in model.files.items():
        name = hashlib.sha256(data).hexdigest() if rel in model.lfs else git_blob_sha1(data)
        (folder / "blobs" / name).write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(folder / "blobs" / name, link.parent), link)
    for ref in refs:
        path = folder / "refs" / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(model.commit)
    return snap


def hub_names(model: HfModel) -> dict[str, str]:
    """Each file's blob name as the hub gives it."""
    return {rel: hashlib.sha256(data).hexdigest() if rel in model.lfs else git_blob_sha1(data)
            for rel, data in model.files.items()}


def check_loads(snapshot: str | Path, model: HfModel) -> dict[str, Any]:
    """Every file of ``model`` read through ``snapshot`` equals the source, and safetensors
    loads every tensor of every shard equal to the source's; returns the tensors loaded."""
    from safetensors.numpy import load_file

    loaded: dict[str, Any] = {}
    for rel, data in model.files.items():
        assert (Path(snapshot) / rel).read_bytes() == data, rel
    for shard, named in model.tensors.items():
        got = load_file(str(Path(snapshot) / shard))
        assert set(got) == set(named), (shard, sorted(got))
        for name, array in named.items():
            assert got[name].dtype == array.dtype and np.array_equal(got[name], array), (shard, name)
        loaded.update(got)
    return loaded
