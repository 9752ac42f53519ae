"""A 40-file model directory against the same bytes as one file, same lab, same run.

The target: a 40-file directory costs at most 1.05 x the time of the same bytes sent as
one file. On a kernel-bridge netns lab (MTU 9000; by default 24 MB, the sender at
``--rate 200``, 3 receivers) the real CLI sends a directory (three large shards, 36 tiny
config/tokenizer files, one empty file) and, alternating with it, one file holding
exactly its bytes; every copy is verified (the CLI's exit status and the received tree).
Two times for each: the sender's own (its ``seconds``: socket open to every receiver
verified) and the wall time (the sender's spawn to the last process gone: start-up and
digests before, every copy durable and renamed into place after), with the parts
``bench.fixedcost`` names. ``--baseline CHECKOUT`` runs another commit's agent in turn
with this one. Prints one JSON object: the runs, the medians and the directory's ratios
to the file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from bench.fixedcost import compiled_agents, medians, parts, transfer
from bench.machine import describe, machine
from lab.bridge import BridgeLab
from lab.models import files_in_order, make_key_file, make_model_dir

REPO = Path(__file__).resolve().parent.parent


def _one(lab: BridgeLab, path: Path, outs: list[Path], key: Path, rate: float, timeout: float,
         cwd: Path = REPO) -> dict[str, Any]:
    """One transfer of ``path`` (file or directory) to every receiver host, by the agent
    found at ``cwd``; verified."""
    sender, sent, with_procs, ok = transfer(lab, path, outs, key, rate, timeout, cwd)
    got = [g for _, g in with_procs]
    receivers = [p for p, _ in with_procs]
    s_err = sender.err
    return {"kind": "directory" if path.is_dir() else "file", "ok": ok, "bytes": sent and sent["bytes"],
            "files": sent and sent.get("files"), "sender_s": sent and sent["seconds"],
            "receiver_goodput_mbit": [g and g["goodput_mbit"] for g in got],
            "datagrams_sent": sent and sent["datagrams_sent"], "bytes_sent": sent and sent["bytes_sent"],
            # the sender's spawn to the last process gone: start-up, digests, every copy in place
            "wall_s": round(max([sender.exit or 0.0] + [p.exit or 0.0 for p in receivers]) - sender.spawn, 3),
            "parts": parts(sender, sent, with_procs, sent["bytes"] * 8 / (rate * 1e6))  # type: ignore[arg-type]
            if ok and sent and "clock" in sent else None,
            "error": None if ok else (s_err[-500:] if not sent else sent.get("error"))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="modelcast-bench-dirs-", dir=args.work))
    shard = int(args.size_mb * 1024 * 1024 / 3)
    model = make_model_dir(work / "model", seed=21, files=40, big=3, big_size=shard)
    one = work / "model.bin"
    with open(one, "wb") as f:  # exactly the directory's byte space, in its order
        for entry_path in files_in_order(model):
            f.write(entry_path.read_bytes())
    key = make_key_file(work / "session.key")
    agents = compiled_agents(args.baseline)
    lab = BridgeLab(args.receivers + 1, mtu=args.mtu)
    lab.start()
    runs = []
    try:
        for i in range(args.runs):
            for name in (list(agents) if i % 2 == 0 else list(reversed(agents))):
                for path in ((one, model) if i % 2 == 0 else (model, one)):
                    outs = [work / f"rx{h}-{i}-{name}-{path.name}" for h in range(1, args.receivers + 1)]
                    runs.append({"agent": name, **_one(lab, path, outs, key, args.rate, args.timeout, agents[name])})
                    print(json.dumps(runs[-1]), file=sys.stderr)
                    for out in outs:
                        subprocess.run(["rm", "-rf", str(out)], check=False)
    finally:
        lab.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    result = {"machine": describe(machine()), "receivers": args.receivers, "rate_mbit": args.rate,
              "mtu": args.mtu, "size_mb": args.size_mb, "runs": runs,
              **summary([r for r in runs if r["agent"] == "this"]), "ok": all(r["ok"] for r in runs)}
    if args.baseline:
        result["baseline"] = summary([r for r in runs if r["agent"] == "baseline"])
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of one agent's runs: the sender's own time and the wall time of each kind,
    the directory's over the file's, and the parts (``bench.fixedcost``)."""
    kinds = [k for k in ("file", "directory") if any(r["kind"] == k and r["ok"] for r in runs)]
    med = {k: statistics.median(r["sender_s"] for r in runs if r["kind"] == k and r["ok"]) for k in kinds}
    wall = {k: statistics.median(r["wall_s"] for r in runs if r["kind"] == k and r["ok"]) for k in kinds}
    both = len(kinds) == 2
    return {"median_sender_s": med, "directory_vs_file": round(med["directory"] / med["file"], 3) if both else None,
            "median_wall_s": wall,
            "wall_directory_vs_file": round(wall["directory"] / wall["file"], 3) if both else None,
            "parts": {k: medians([r["parts"] | {"ok": True} for r in runs if r["kind"] == k and r["parts"]])
                      for k in kinds}}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dirs", description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=24, help="bytes of the directory (and of the file)")
    ap.add_argument("--receivers", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200, help="sender rate cap, Mbit/s")
    ap.add_argument("--mtu", type=int, default=9000)
    ap.add_argument("--runs", type=int, default=5, help="transfers of each (alternating)")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--work", default=None, help="where the model and copies go (default: $TMPDIR)")
    ap.add_argument("--baseline", default=None, help="another checkout whose agent runs in turn with this one")
    ap.add_argument("--smoke", action="store_true", help="8 MB, one run of each (what CI runs)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size_mb, args.runs = 8, 1
    result = run(args)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
