"""The one maker of test "models" (files of incompressible bytes, like weights), the
one digest helper the labs, tests and benchmarks check copies with, and the one maker
of shared key files (``modelcast --key-file``) for runs without a controller."""

from __future__ import annotations

import random
import secrets
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
    """BLAKE3 hex of a file, or None if it does not exist."""
    try:
        h = blake3.blake3()
        with open(path, "rb") as f:
            while block := f.read(_STEP):
                h.update(block)
        return h.hexdigest()
    except FileNotFoundError:
        return None


def make_key_file(path: Path | str) -> Path:
    """A fresh random shared secret for ``--key-file`` (mode 0600): every run without a
    controller authenticates its datagrams like a controller run does."""
    path = Path(path)
    path.touch(mode=0o600)
    path.write_text(secrets.token_hex(32) + "\n")
    return path
