"""The peer-to-peer baseline with real clients from Debian (what Dragonfly and Kraken do
at scale): ``opentracker`` on the model server, a torrent made by ``mktorrent``, ``aria2c``
seeding on the server and downloading on every receiver, each receiver re-uploading the
pieces it has. Peers come from the tracker only: DHT, local peer discovery and peer
exchange are off, and the torrent is private.

Time runs from the receivers' start (the seeder is already seeding and known to the
tracker, as a model server would be) to the last receiver holding the file. A receiver
counts when aria2c reports the download complete (every piece passed its SHA-1 check:
aria2c's hook fires only then) *and* our BLAKE3 of the file on disk matches.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from bench.baselines import RunResult, read_stats, tx_bytes, wrapped
from lab.models import file_digest
from lab.ovs import Lab
from lab.sh import LabError, sh, stop_processes

TRACKER_PORT = 6969
PIECE_LOG2 = 18  # 256 KiB pieces: mktorrent's default, also for files of a few hundred MB
TOOLS = ("opentracker", "aria2c", "mktorrent")

# aria2c calls this with (GID, number of files, first file's path) once the download is
# complete and verified, before it starts seeding; the receiver keeps uploading after.
HOOK = '#!/bin/sh\ndate +%s.%N > "$3.done"\n'

# The same client options on the seeder and on every receiver.
ARIA2 = ("--enable-dht=false", "--enable-dht6=false", "--bt-enable-lpd=false",
         "--enable-peer-exchange=false", "--disable-ipv6=true", "--seed-ratio=0.0",
         "--file-allocation=none", "--summary-interval=0", "--quiet=true",
         "--log-level=notice", "--bt-tracker-interval=5", "--allow-overwrite=true")


def missing_tools() -> list[str]:
    """The BitTorrent programs this machine lacks (``scripts/lab-deps.sh`` installs them)."""
    return [t for t in TOOLS if shutil.which(t) is None]


def _skip(data: bytes, i: int) -> int:
    """Index just past the bencoded value starting at ``data[i]``."""
    c = data[i:i + 1]
    if c == b"i":
        return data.index(b"e", i) + 1
    if c in (b"l", b"d"):
        i += 1
        while data[i:i + 1] != b"e":
            i = _skip(data, i)
        return i + 1
    colon = data.index(b":", i)
    return colon + 1 + int(data[i:colon])


def info_hash(torrent: bytes) -> bytes:
    """SHA-1 of the bencoded ``info`` dictionary: the torrent's identity at the tracker."""
    if torrent[:1] != b"d":
        raise ValueError("a torrent file is a bencoded dictionary")
    i = 1
    while torrent[i:i + 1] != b"e":
        key_end = _skip(torrent, i)
        key = torrent[torrent.index(b":", i) + 1:key_end]
        end = _skip(torrent, key_end)
        if key == b"info":
            return hashlib.sha1(torrent[key_end:end]).digest()
        i = end
    raise ValueError("torrent has no info dictionary")


def seeders(url: str, ih: bytes) -> int:
    """Seeders the tracker at ``url`` (its base, http://ip:port) lists for torrent ``ih``."""
    q = urllib.parse.quote_from_bytes(ih)
    with urllib.request.urlopen(f"{url}/scrape?info_hash={q}", timeout=2) as r:
        m = re.search(rb"8:completei(\d+)e", r.read())
    return int(m.group(1)) if m else 0


def bittorrent(lab: Lab, sender: str, receivers: list[str], path: Path, work: Path,
               timeout: float = 900) -> RunResult:
    """One BitTorrent distribution of ``path`` from ``sender`` to ``receivers``."""
    work.mkdir(parents=True, exist_ok=True)
    want = file_digest(path)
    sender_ip = lab.ip(sender)
    torrent = work / f"{path.name}.torrent"
    sh(["mktorrent", "-p", "-l", str(PIECE_LOG2), "-a",
        f"http://{sender_ip}:{TRACKER_PORT}/announce", "-o", str(torrent), str(path)],
       what="mktorrent")
    ih = info_hash(torrent.read_bytes())
    hook = work / "bt-done.sh"
    hook.write_text(HOOK)
    hook.chmod(0o755)
    common = [*ARIA2, f"--stop-with-process={os.getpid()}"]
    tracker_dir = work / "tracker"
    tracker_dir.mkdir(exist_ok=True)
    # Debian's opentracker serves whitelisted torrents only; it reads the list after it
    # chroots into -d, hence the relative name (and the same cwd, should it read it before).
    (tracker_dir / "whitelist").write_text(ih.hex() + "\n")
    procs: list[subprocess.Popen] = []
    clients: list[tuple[str, Path, subprocess.Popen]] = []
    try:
        procs.append(lab.popen(sender, "opentracker", "-p", str(TRACKER_PORT), "-P",
                               str(TRACKER_PORT), "-d", str(tracker_dir), "-u", "nobody",
                               "-w", "whitelist", cwd=tracker_dir, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL))
        seed_stats = work / "bt-seed.json"
        procs.append(wrapped(lab, sender, seed_stats, "aria2c", *common, "--check-integrity=true",
                             f"--log={work / 'bt-seed.log'}", f"--dir={path.parent}", str(torrent),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # The tracker is reached from here over the sender's management address.
        url = f"http://{lab.mgmt_ip(sender)}:{TRACKER_PORT}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if seeders(url, ih) >= 1:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise LabError(f"the BitTorrent seeder on {sender} never registered with the "
                               f"tracker: {(work / 'bt-seed.log').read_text(errors='replace')[-800:]}")
            time.sleep(0.05)
        before = tx_bytes(lab, sender)
        t0 = time.time()
        for r in receivers:
            d = work / f"bt-{r}"
            d.mkdir(exist_ok=True)
            clients.append((r, d, wrapped(
                lab, r, work / f"bt-{r}.json", "aria2c", *common,
                f"--on-bt-download-complete={hook}", f"--log={d / 'aria2.log'}", f"--dir={d}",
                str(torrent), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        done: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(done) < len(clients) and time.monotonic() < deadline:
            for r, d, p in clients:
                marker = d / f"{path.name}.done"
                if r not in done and marker.exists() and marker.read_text().strip():
                    done[r] = float(marker.read_text())
            if any(p.poll() is not None for _, _, p in clients):
                break  # a client gave up
            time.sleep(0.02)
        sent = tx_bytes(lab, sender) - before
        seconds = (max(done.values()) - t0) if done else time.time() - t0
    finally:  # SIGTERM first: the CPU wrapper passes it on and reports aria2c's CPU
        stop_processes([c[2] for c in clients] + procs[::-1], grace=15)
    oks = {r: r in done and file_digest(d / path.name) == want for r, d, _ in clients}
    cpu_rx = sum(read_stats(work / f"bt-{r}.json")["cpu_s"] or 0 for r, _, _ in clients)
    for _, d, _ in clients:
        shutil.rmtree(d, ignore_errors=True)
    return RunResult("bittorrent", len(receivers), seconds, all(oks.values()) and bool(oks), sent,
                     path.stat().st_size, None, read_stats(seed_stats)["cpu_s"], cpu_rx,
                     {"verified": oks, "aria2_complete": sorted(done),
                      "piece_bytes": 1 << PIECE_LOG2,
                      "finish_s": {r: round(t - t0, 3) for r, t in sorted(done.items())}})
