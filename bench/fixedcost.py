"""The agent's fixed costs: what a transfer costs beyond its bytes, part by part (root).

    python -m bench.fixedcost [--size-mb 4] [--rate 200] [--receivers 3] [--runs 5]
                              [--dir] [--baseline CHECKOUT] [--smoke]

A small transfer pays a start and an end whatever its size: process start and imports,
the sockets and the manifest, the first pages and the rate ramp; then the catch-up, the
completion reports and the exit. On a kernel-bridge lab (one netns per host; MTU 1500;
the sender's ``--rate`` the only cap) the real CLI sends a small file (``--dir``: a
40-file model directory of that size) to N receivers, and every part is timed:

- from outside: each process's spawn (just before ``Popen``) and exit (a thread blocked
  in ``wait``), on ``time.monotonic()``, which every namespace of the host shares;
- from inside: the agent's own marks (``SendResult.clock``, ``ReceiveResult.clock``:
  ready, first data, end of the stream, verified, acknowledged).

Parts (seconds): sender ``start`` = spawn -> first data datagram (of which ``setup`` =
spawn -> socket and sender ready); ``stream_extra`` = the first pass's time beyond the
line time of its bytes (the start ramp, pacing); ``end`` = last data -> every receiver
verified (the sender heard every COMPLETE); ``exit`` = verified -> process gone. For each
receiver: ``start`` = spawn -> joined and ready; ``end`` = the sender's last data -> this
receiver verified; ``ack`` = verified -> the sender's acknowledgement; ``exit`` =
verified -> process gone. ``overhead`` = sender spawn -> last process gone, less the
line time.

References in the same run: ``python -c pass`` spawned the same way (the interpreter's
floor) and ``--baseline CHECKOUT`` (another commit's work tree: its agent runs in turn
with this one, A B A B, the same lab and file), so a change is judged by a ratio taken in
one run. Prints one JSON object (every run and the medians).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

from bench.machine import describe, machine
from lab.bridge import BridgeLab
from lab.models import file_digest, make_key_file, make_model, make_model_dir, tree_of

REPO = Path(__file__).resolve().parent.parent
JOIN_WAIT = 0.5  # receivers start this long before the sender (joined before the stream)


class Timed:
    """A process started in a lab host, its spawn and exit on the monotonic clock."""

    def __init__(self, lab: BridgeLab, host: int, argv: list[str], cwd: Path) -> None:
        self.spawn = time.monotonic()
        self.proc = lab.popen(host, *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        self.exit: Optional[float] = None
        self.out = self.err = ""
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        self.out, self.err = self.proc.communicate()  # (returns when the process is gone)
        self.exit = time.monotonic()

    def join(self, timeout: float) -> Optional[dict[str, Any]]:
        """Wait for the exit; the --json summary (the last line on stdout), or None."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.proc.kill()
            self._thread.join(5)
        lines = self.out.strip().splitlines()
        try:
            return json.loads(lines[-1]) if lines else None
        except ValueError:
            return None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "hostagent.cli", *args]


def parts(sender: Timed, sent: dict[str, Any], receivers: list[tuple[Timed, dict[str, Any]]],
          line_s: float) -> dict[str, Any]:
    """A run's parts (see the module docstring) from the marks and the spawn/exit times."""
    c = sent["clock"]
    r3 = lambda v: round(v, 4)  # noqa: E731
    out: dict[str, Any] = {
        "sender": {"setup": r3(c["ready"] - sender.spawn), "start": r3(c["first_data"] - sender.spawn),
                   "stream_extra": r3(c["stream_end"] - c["first_data"] - line_s),
                   "end": r3(c["verified"] - c["stream_end"]), "exit": r3(sender.exit - c["verified"])},
        "receivers": [],
    }
    for proc, got in receivers:
        rc = got["clock"]
        out["receivers"].append({"start": r3(rc["ready"] - proc.spawn), "end": r3(rc["verified"] - c["stream_end"]),
                                 "ack": r3(rc["acked"] - rc["verified"]), "exit": r3(proc.exit - rc["verified"])})
    last = max([sender.exit] + [p.exit for p, _ in receivers])
    out["wall"] = r3(last - sender.spawn)
    out["overhead"] = r3(last - sender.spawn - line_s)
    return out


def transfer(lab: BridgeLab, path: Path, outs: list[Path], key: Path, rate: float, timeout: float,
             cwd: Path) -> tuple[Timed, Optional[dict[str, Any]], list[tuple[Timed, Optional[dict[str, Any]]]], bool]:
    """One transfer of ``path`` (file or directory) to receiver hosts 1..len(outs) by the
    agent found at ``cwd``: (sender, its summary, each receiver and its summary, whether
    every copy was verified -- by the agents and again here)."""
    group = f"232.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(1, 254)}:{random.randint(20000, 60000)}"
    receivers = [Timed(lab, h, _cli("recv", "--group", group, "--source", lab.ip(0), "--out", str(out), "--json",
                                    "--timeout", str(timeout), "--key-file", str(key)), cwd)
                 for h, out in enumerate(outs, start=1)]
    time.sleep(JOIN_WAIT)
    sender = Timed(lab, 0, _cli("send", str(path), "--group", group, "--interface", lab.ip(0), "--receivers",
                                str(len(outs)), "--rate", f"{rate:g}", "--json", "--timeout", str(timeout),
                                "--key-file", str(key)), cwd)
    sent = sender.join(timeout * 3)
    got = [(p, p.join(timeout * 3)) for p in receivers]
    ok = bool(sent and sent["ok"] and all(g and g["ok"] for _, g in got))
    if ok and path.is_dir():
        want = tree_of(path)
        ok = all(tree_of(out) == want for out in outs)
    elif ok:
        ok = all(file_digest(out) == sent["file_digest"] for out in outs)  # type: ignore[index]
    return sender, sent, got, ok


def one(lab: BridgeLab, path: Path, outs: list[Path], key: Path, rate: float, timeout: float,
        cwd: Path) -> dict[str, Any]:
    """``transfer`` and its parts."""
    sender, sent, got, ok = transfer(lab, path, outs, key, rate, timeout, cwd)
    run: dict[str, Any] = {"ok": ok, "error": None if ok else ((sent or {}).get("error") or sender.err[-400:])}
    if ok and sent and "clock" in sent:
        line_s = sent["bytes"] * 8 / (rate * 1e6)
        run.update(parts(sender, sent, got, line_s), line_s=round(line_s, 4))  # type: ignore[arg-type]
    return run


def floor(lab: BridgeLab, runs: int) -> float:
    """Median spawn -> exit of ``python -c pass`` in a lab host: the interpreter's floor."""
    times = []
    for _ in range(runs):
        t = Timed(lab, 0, [sys.executable, "-c", "pass"], REPO)
        t.join(30)
        assert t.exit is not None
        times.append(t.exit - t.spawn)
    return round(statistics.median(times), 4)


def _flat(run: dict[str, Any]) -> dict[str, float]:
    """sender.start, ..., receiver.end (the largest over receivers), ..., overhead."""
    flat = {f"sender.{k}": v for k, v in run["sender"].items()}
    for k in run["receivers"][0]:
        flat[f"receiver.{k}"] = max(r[k] for r in run["receivers"])
    flat["overhead"] = run["overhead"]
    return flat


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median of every part over the runs that finished (receivers: the slowest's)."""
    flats = [_flat(r) for r in runs if r["ok"] and "sender" in r]
    if not flats:
        return {}
    return {k: round(statistics.median(f[k] for f in flats), 4) for k in flats[0]}


def compiled_agents(baseline: Optional[str]) -> dict[str, Path]:
    """The agents a run times, by name: this checkout's ("this") and, given, another's
    ("baseline"); each byte-compiled first, as pip installs it, so that no start compiles."""
    agents = {"this": REPO} | ({"baseline": Path(baseline).resolve()} if baseline else {})
    for root in agents.values():
        compileall.compile_dir(str(root / "hostagent"), quiet=1)
    return agents


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="modelcast-bench-fixed-", dir=args.work))
    size = int(args.size_mb * 1024 * 1024)
    path = make_model_dir(work / "model", seed=21, files=40, big=3, big_size=size // 3) if args.dir \
        else make_model(work / "model.bin", size, seed=7).path
    key = make_key_file(work / "session.key")
    agents = compiled_agents(args.baseline)
    lab = BridgeLab(args.receivers + 1, mtu=args.mtu)
    lab.start()
    runs: list[dict[str, Any]] = []
    try:
        ref = floor(lab, 5)
        for i in range(args.runs):
            order = list(agents) if i % 2 == 0 else list(reversed(agents))
            for name in order:
                outs = [work / f"rx{h}-{i}-{name}" for h in range(1, args.receivers + 1)]
                res = {"agent": name, **one(lab, path, outs, key, args.rate, args.timeout, agents[name])}
                runs.append(res)
                print(json.dumps(res), file=sys.stderr)
                for out in outs:
                    subprocess.run(["rm", "-rf", str(out)], check=False)
    finally:
        lab.stop()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    med = {name: medians([r for r in runs if r["agent"] == name]) for name in agents}
    result: dict[str, Any] = {
        "machine": describe(machine()), "kind": "directory" if args.dir else "file", "size_mb": args.size_mb,
        "rate_mbit": args.rate, "receivers": args.receivers, "mtu": args.mtu, "python_floor_s": ref,
        "runs": runs, "medians": med, "ok": all(r["ok"] for r in runs)}
    if args.baseline and med.get("this") and med.get("baseline"):
        result["this_minus_baseline"] = {k: round(med["this"][k] - med["baseline"][k], 4) for k in med["this"]}
    return result


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fixedcost", description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=4)
    ap.add_argument("--rate", type=float, default=200, help="the sender's --rate, Mbit/s")
    ap.add_argument("--receivers", type=int, default=3)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=5, help="transfers per agent")
    ap.add_argument("--dir", action="store_true", help="a 40-file model directory instead of one file")
    ap.add_argument("--baseline", default=None, help="another checkout whose agent runs in turn with this one")
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--work", default=None, help="where the model and copies go (default: $TMPDIR)")
    ap.add_argument("--smoke", action="store_true", help="1 MB, 2 receivers, 2 runs (what CI runs)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.size_mb, args.receivers, args.runs = 1, 2, 2
    if os.geteuid() != 0:
        print("error: the benchmark builds network namespaces: run it as root", file=sys.stderr)
        return 1
    result = run(args)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
