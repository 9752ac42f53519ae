"""Memory that costs the same for every method a bench compares.

On the VMs this project is measured on, guest memory is backed by the host lazily and
freed pages are handed back to it (virtio-balloon free page reporting, ~2 s after they
are freed): the first write to such a page costs ~3 s/GB of CPU, a write to a page the
guest touched recently ~0.5 s/GB. A receiver writing its copy into /dev/shm (or the page
cache) pays one or the other depending on what ran just before it -- which in a side-by-side
bench is the previous method -- so the first transfer of a series at a new N used to lose
datagrams and repair a third of the file, whichever method it was. Real GPU nodes have no
such cost. ``steady_memory`` therefore stops the reporting for the bench's duration (the old
setting is kept in the lab state directory and put back, also by the next bench if this
one was killed) and touches the memory the transfers will use once, up front, so that every
method writes into memory that is equally warm; ``first_touch`` measures both costs so the
report says how large the effect is on the machine it ran on.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from lab.ovs import STATE_DIR

log = logging.getLogger("modelcast.bench")

REPORTING_ORDER = Path("/sys/module/page_reporting/parameters/page_reporting_order")
NO_REPORTING = 11  # above the buddy allocator's largest order (10): no free block qualifies
_PIECE = 1 << 20


def _write(directory: Path, nbytes: int) -> float:
    """CPU seconds to write ``nbytes`` into a new file in ``directory`` (then deleted)."""
    piece = b"\1" * _PIECE
    fd, path = tempfile.mkstemp(prefix="modelcast-warm-", dir=directory)
    started = time.process_time()
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            for _ in range(0, nbytes, _PIECE):
                f.write(piece)
        return time.process_time() - started
    finally:
        os.unlink(path)


def first_touch(directory: Path, nbytes: int = 256 << 20) -> dict[str, float]:
    """CPU s/GB of writing ``nbytes`` into freshly allocated memory in ``directory``, and
    of writing them again at once into the pages just freed."""
    gb = nbytes / (1 << 30)
    cold = _write(directory, nbytes)
    warm = _write(directory, nbytes)
    return {"first_write_s_per_gb": round(cold / gb, 2), "rewrite_s_per_gb": round(warm / gb, 2)}


@contextlib.contextmanager
def steady_memory(directory: Path, nbytes: int) -> Iterator[dict[str, Any]]:
    """Free page reporting off (where the kernel has it) and ``nbytes`` of memory touched
    through ``directory`` inside the block; yields what was measured and done, for the
    report (``first_touch``'s two costs first)."""
    info: dict[str, Any] = {**first_touch(directory, min(nbytes, 256 << 20)), "warmed_bytes": nbytes}
    with _reporting_off(info):
        started = time.monotonic()
        info["warm_cpu_s"] = round(_write(directory, nbytes), 2)
        info["warm_wall_s"] = round(time.monotonic() - started, 2)
        yield info


@contextlib.contextmanager
def _reporting_off(info: dict[str, Any]) -> Iterator[None]:
    """Free page reporting off inside the block, its old order in ``info["reporting_was"]``
    (None: not root, no such kernel feature, or it could not be changed)."""
    info["reporting_was"] = None
    if os.geteuid() != 0 or not REPORTING_ORDER.exists():
        yield
        return
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    saved = STATE_DIR / "page_reporting_order.orig"  # there only while changed
    old: Optional[str] = None
    with open(STATE_DIR / "page_reporting.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            old = saved.read_text().strip() if saved.exists() else REPORTING_ORDER.read_text().strip()
            saved.write_text(old)
            REPORTING_ORDER.write_text(str(NO_REPORTING))
            info["reporting_was"] = int(old)
            log.info("bench: free page reporting off (page_reporting_order %s -> %d) while it runs", old, NO_REPORTING)
        except (OSError, ValueError) as exc:
            log.warning("bench: cannot stop free page reporting (%s): fresh memory may cost a "
                        "method more than the one before it", exc)
            old = None
        try:
            yield
        finally:
            if old is not None:
                REPORTING_ORDER.write_text(old)
                saved.unlink(missing_ok=True)


def in_turn(methods: list[str], run: int) -> list[str]:
    """``methods`` as run number ``run`` takes them: each run starts with the next one, so
    none always goes first or always follows the same one."""
    k = run % len(methods)
    return methods[k:] + methods[:k]
