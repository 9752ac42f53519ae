"""The one maker of test "models" (files of incompressible bytes, like weights, and
model-shaped directories of them), the one digest helper the labs, tests and benchmarks check copies with, and the one maker
of shared key files (``modelcast --key-file``) for runs without a controller."""

from __future__ import annotations

import os
import random
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import blake3

_STEP = 4 << 20


@dataclass(frozen=True)
class ModelFile:
    path: Path
    size: int
    digest: str  # BLAKE3 hex of the whole file (what the host agent reports as file_digest)


def make_model(path: Path | str, size_bytes: int, seed: int = 0) -> ModelFile:
    """A deterministic pseudo-random file of ``size_bytes`` (same seed, same bytes)."""
    rng = random.Random(seed)
    h = blake3.blake3()
    with open(path, "wb") as f:
        left = size_bytes
        while left:
            block = rng.randbytes(min(_STEP, left))
            f.write(block)
            h.update(block)
            left -= len(block)
    return ModelFile(Path(path), size_bytes, h.hexdigest())


def file_digest(path: Path | str) -> Optional[str]:
    """BLAKE3 hex of a file, or None if it does not exist. A directory's is that of its
    byte space (its files in canonical order, what the host agent reports as file_digest)."""
    try:
        h = blake3.blake3()
        for part in files_in_order(Path(path)) if os.path.isdir(path) else [Path(path)]:
            with open(part, "rb") as f:
                while block := f.read(_STEP):
                    h.update(block)
        return h.hexdigest()
    except FileNotFoundError:
        return None


def files_in_order(root: Path) -> list[Path]:
    """A directory's files in the order of its byte space (``hostagent.tree``)."""
    return sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: str(p.relative_to(root)).encode())


def model_of(path: Path | str) -> ModelFile:
    """The ModelFile of an existing file or model directory."""
    path = Path(path)
    size = sum(p.stat().st_size for p in files_in_order(path)) if path.is_dir() else path.stat().st_size
    digest = file_digest(path)
    assert digest is not None
    return ModelFile(path, size, digest)


def make_key_file(path: Path | str) -> Path:
    """A fresh random shared secret for ``--key-file`` (mode 0600): every run without a
    controller authenticates its datagrams like a controller run does."""
    path = Path(path)
    path.touch(mode=0o600)
    path.write_text(secrets.token_hex(32) + "\n")
    return path


def make_model_dir(root: Path, seed: int = 3, files: int = 40, big: int = 3, big_size: int = 300_000) -> Path:
    """A model-shaped directory: ``files`` files, ``big`` of them large (shards), the rest
    tiny (config, tokenizer, empty marker), in subdirectories, with varied modes."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        sub = root / ("tokenizer" if i % 5 == 1 else "") / ("deep/er" if i % 11 == 3 else "")
        sub.mkdir(parents=True, exist_ok=True)
        size = big_size + i if i < big else (0 if i == files - 1 else rng.randint(1, 900))
        path = sub / (f"model-{i:05d}-of-{big:05d}.safetensors" if i < big else f"file{i}.json")
        path.write_bytes(rng.randbytes(size))
        path.chmod(0o755 if i % 7 == 0 else (0o600 if i % 7 == 1 else 0o644))
    return root


def tree_of(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: relative path -> (bytes, permission bits), to compare trees."""
    return {str(p.relative_to(root)): (p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
            for p in sorted(root.rglob("*")) if p.is_file()}


def make_moe_dir(root: Path, experts: int = 8, expert_size: int = 200_000, seed: int = 5) -> Path:
    """A Mixture-of-Experts-shaped model: ``config.json``, a shared ``dense.safetensors``
    and one ``experts/expert-NN.safetensors`` per expert (random bytes), for selective
    distribution (``hostagent.catalog``: one part per expert, one for the rest)."""
    rng = random.Random(seed)
    (root / "experts").mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text('{"num_experts": %d}\n' % experts)
    (root / "dense.safetensors").write_bytes(rng.randbytes(expert_size // 2))
    for i in range(experts):
        (root / "experts" / f"expert-{i:02d}.safetensors").write_bytes(rng.randbytes(expert_size + i))
    return root
