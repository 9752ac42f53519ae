"""``modelcast fetch hf://ORG/NAME[@REVISION]``: the offer of a name found at the
controller, its content fetched as any fetch (``hostagent.serve.fetch``: verified, resumed
across rounds) into the repository's staging directory, then installed into the Hugging
Face cache layout (``hostagent.hf``): blobs, the snapshot in one rename, the ref last."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .api import OnEvent, ReceiveOptions, ReceiveResult, TransferError, _client, _ignore
from .control import ControllerError
from .hf import INCOMING, HfRef, find_snapshot, install_snapshot, is_commit, pick_offer, prepare_repo, repo_folder, \
    write_ref
from .serve import NO_OFFER_POLL_S, Backoff, FetchWaiting, fetch, permanent

__all__ = ["HfFetched", "fetch_hf"]


@dataclass
class HfFetched:
    """A ``fetch hf://...`` that ended: the snapshot (None unless verified and installed),
    its commit, and the receive's result (None when the snapshot was already whole)."""

    ok: bool
    ref: str
    snapshot: Optional[str]
    commit: Optional[str]
    model: Optional[str]
    result: Optional[ReceiveResult]
    error: Optional[str] = None
    had_it: bool = False

    def summary(self) -> dict[str, Any]:
        """What ``fetch --json`` prints: the receive's summary (when it ran) and where the model is."""
        base = self.result.summary() if self.result is not None else {"ok": self.ok, "error": self.error}
        return {**base, "ok": self.ok, "error": self.error, "hf": self.ref, "commit": self.commit,
                "model": self.model, "snapshot": self.snapshot, "had_it": self.had_it}


class _Lock:
    """One fetch per repository folder at a time on this host (two pods' init containers
    on one node share the cache): an exclusive ``flock`` held while it runs."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def __enter__(self) -> "_Lock":
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def fetch_hf(ref: HfRef, cache: str, options: ReceiveOptions, *, patience: float = 300.0,
             on_event: Optional[OnEvent] = None, clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> HfFetched:
    """Fetch ``ref`` into the cache at ``cache``: wait (within ``patience``) for an offer of
    its name and revision, fetch that content (``serve.fetch``: verified, resumed across
    rounds) into staging, install it (``install_snapshot``) and write the ref. A snapshot
    of that commit already whole in the cache is kept (only the ref is written)."""
    emit = on_event or _ignore
    if not options.controller:
        raise TransferError("fetch needs a controller (it says who serves the model)")
    client = _client(options)
    deadline = clock() + patience
    backoff = Backoff()
    while True:
        try:
            offer = pick_offer(client.offers(name=ref.repo, revision=ref.wanted), ref)
        except ControllerError as exc:
            if permanent(exc):
                raise
            offer, why = None, f"the controller is unavailable: {exc}"
            pause = backoff.pause(getattr(exc, "retry_after", None))
        else:
            why, pause = f"nobody offers {ref} yet", NO_OFFER_POLL_S
        if offer is not None:
            break
        left = deadline - clock()
        if left <= 0:
            raise TransferError(f"no offer of {ref} within --patience {patience:g}s ({why})")
        emit(FetchWaiting(why, round(min(pause, left), 3)))
        sleep(min(pause, left))
    hf, model = offer["hf"], offer["model"]
    commit = hf.get("commit")
    if not isinstance(commit, str) or not is_commit(commit):
        raise TransferError(f"the offer of {ref} names no commit")
    folder = repo_folder(cache, ref.repo)
    prepare_repo(folder)
    branch = None if is_commit(ref.wanted) else ref.wanted
    with _Lock(os.path.join(folder, INCOMING, "lock")):
        had = find_snapshot(folder, commit, int(offer.get("files") or 0), int(offer.get("size") or 0))
        result = None
        if had is None:
            staged = os.path.join(folder, INCOMING, commit)
            result = fetch(model, staged, dataclasses.replace(options, on_complete=None),
                           patience=max(1.0, deadline - clock()), on_event=emit)
            if not result.digest_ok:
                return HfFetched(False, str(ref), None, commit, model, result, result.error or "not verified")
            had = install_snapshot(folder, commit, staged, hf.get("lfs") or ())
        if branch is not None:
            write_ref(folder, branch, commit)
    return HfFetched(True, str(ref), had, commit, model, result, had_it=result is None)

