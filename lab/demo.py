"""``make demo``: one real model distribution on an Open vSwitch lab, start to finish.

Starts ``modelcast-controller``, builds a leaf-spine fabric (OVS bridges + one network
namespace per host), generates a test "model", has receivers join its group over REST,
sends it once by multicast through the tree the controller built, verifies every copy's
digest, prints a summary and tears everything down -- also on Ctrl-C or failure.

    sudo .venv/bin/python -m lab.demo --size-mb 64 --rate 150
    make demo DEMO_ARGS="--size-mb 256 --loss"
    make demo DEMO_ARGS="--moe"   # selective: 8 experts, each receiver asks for 2
    make demo DEMO_ARGS="--autoscale"   # modelcast serve; receivers fetch at random moments

With ``--moe`` the model is a Mixture-of-Experts directory published in parts (one per
expert, config and dense weights parts of their own): each receiver asks for the shared
parts and two experts, every part travels on its own group, and the summary shows each
part's tree and the bytes on every receiver's and the sender's link.

With ``--autoscale`` the sender runs ``modelcast serve`` and every other host (but the
first, which times one fetch alone) starts ``modelcast fetch MODEL_ID`` at a random
moment over twice that time, as replicas of an autoscaling fleet do: the summary shows
the rounds, each receiver's time and the bytes saved against unicast (``lab.autoscale``).

Exit status: 0 all receivers verified; 1 failure (one line says why); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional, Sequence

if __package__ in (None, ""):  # `python lab/demo.py` rather than `-m lab.demo`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lab.autoscale import Autoscale, AutoscaleReport
from lab.controller import stamp_printer
from lab.fabric import Fabric
from lab.models import make_model, make_model_dir, make_moe_dir, model_of
from lab.selective import Selective, SelectiveReport
from lab.sh import LabError, leftovers, require
from lab.transfer import Transfer, TransferReport
from topologies.spec import Topology, TopologyError, parse

DEFAULT_TOPOLOGY = "leaf-spine:2,4,2"  # 2 spines, 4 leaves, 8 hosts


class DemoError(Exception):
    """Printed as ``demo: error: ...`` and exit 1."""


def pick_roles(topo: Topology, sender: str, receivers: Optional[str]) -> tuple[str, list[str], list[str]]:
    """(sender, receivers, non-receivers). By default every host but the sender is a
    receiver except two left out on purpose -- one next to the sender, one on another
    switch -- so the summary shows the tree skipping them."""
    try:
        src = topo.host(sender).name
    except KeyError as exc:
        raise DemoError(exc.args[0]) from None
    others = [h.name for h in topo.hosts if h.name != src]
    if receivers:
        chosen = []
        for r in receivers.split(","):
            try:
                chosen.append(topo.host(r.strip()).name)
            except KeyError as exc:
                raise DemoError(exc.args[0]) from None
        if src in chosen:
            raise DemoError(f"{src} is the sender; it cannot also be a receiver")
    else:
        left_out = {others[0], others[-3]} if len(others) >= 5 else set()
        chosen = [h for h in others if h not in left_out]
    if not chosen:
        raise DemoError("no receivers")
    return src, chosen, [h for h in others if h not in chosen]


def run(args: argparse.Namespace) -> int:
    say = stamp_printer()
    try:
        topo = parse(args.topology)
    except TopologyError as exc:
        raise DemoError(f"bad --topology {args.topology!r}: {exc}") from None
    sender, receivers, bystanders = pick_roles(topo, args.sender, args.receivers)
    size = int(args.size_mb * 1024 * 1024)
    if size < 1:
        raise DemoError("--size-mb must be positive")
    if args.moe and (args.loss or args.files != 8):
        raise DemoError("--moe makes its own model and injects no loss: not with --loss or --files")
    if args.autoscale and (args.loss or args.moe):
        raise DemoError("--autoscale injects no loss and serves a whole model: not with --loss or --moe")
    base_dir = Path(args.workdir) if args.workdir else (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    work = Path(tempfile.mkdtemp(prefix="modelcast-demo-", dir=base_dir))
    say(f"modelcast demo: {topo.name} ({len(topo.switches)} switches, {len(topo.hosts)} hosts), "
        f"{args.size_mb:g} MB model, sender {sender}, receivers {' '.join(receivers)}, "
        f"rate cap {args.rate:g} Mbit/s; work dir {work}")
    fabric = Fabric(topo, work, algorithm=args.algorithm, say=say)
    report = None
    base = ""
    interrupted = False
    try:
        fabric.start(ping_hosts=False)  # (real clusters' hosts do not ping first)
        assert fabric.lab is not None
        base = fabric.lab.base
        if args.moe:
            report = _moe(args, fabric, work, sender, receivers, size, say)
        elif args.autoscale:
            report = _autoscale(args, fabric, work, sender, receivers + bystanders, size, say)
        else:
            report = _whole(args, fabric, work, sender, receivers, bystanders, size, say)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        # Tear down whatever happened; a second Ctrl-C must not cut the cleanup short.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            fabric.stop()
            left = leftovers(base) if base else []
            if left:
                print(f"demo: error: left behind: {' '.join(left)}", file=sys.stderr)
            else:
                say("cleanup: controller stopped, no namespaces, bridges or processes left")
            if args.keep:
                say(f"work dir kept: {work}")
            elif interrupted or (report is not None and report.ok):
                shutil.rmtree(work, ignore_errors=True)
            else:  # failed: keep logs and summaries for a post-mortem, drop the big files
                for p in work.rglob("*.bin"):
                    p.unlink(missing_ok=True)
                for p in [work / "model", *work.rglob("*-model")]:
                    shutil.rmtree(p, ignore_errors=True)
                say(f"logs kept in {work}")
        finally:
            signal.signal(signal.SIGINT, old)
    assert report is not None
    print()
    print(report.format())
    print()
    if isinstance(report, SelectiveReport):
        return _moe_verdict(report)
    if isinstance(report, AutoscaleReport):
        return _autoscale_verdict(report)
    if not report.ok:
        bad = [r.host for r in report.receivers if not r.ok]
        first = report.errors[0] if report.errors else "see the summary above"
        raise DemoError(f"{len(bad)} of {len(report.receivers)} receivers did not verify the file "
                        f"({first}); logs in {work}")
    print(f"demo OK: {len(report.receivers)} receivers verified {args.size_mb:g} MB in "
          f"{report.seconds:.1f} s; the sender's link carried "
          f"{report.sender_link.rx_bytes / max(1, report.size):.2f} x the file (unicast would "
          f"need {len(report.receivers)} x)")
    return 0


def _whole(args: argparse.Namespace, fabric: Fabric, work: Path, sender: str, receivers: list[str],
           bystanders: list[str], size: int, say: Any) -> TransferReport:
    """The whole model (a directory in one session, or one file) to every receiver."""
    if args.files > 1:  # a model directory: shards plus small config/tokenizer files, one session
        shards = max(1, min(4, args.files // 2))
        say(f"generating a {args.size_mb:g} MB test model directory of {args.files} files, {shards} shards "
            f"({work / 'model'})")
        model = model_of(make_model_dir(work / "model", seed=args.seed, files=args.files, big=shards,
                                        big_size=max(1, size // shards)))
    else:
        say(f"generating a {args.size_mb:g} MB test model ({work / 'model.bin'})")
        model = make_model(work / "model.bin", size, seed=args.seed)
    say(f"model blake3 {model.digest}")
    with Transfer(fabric, model, sender, receivers, rate=args.rate, name="demo",
                  model_name=args.model, workdir=work / "transfer",
                  receiver_timeout=60, sender_timeout=120) as t:
        if args.loss:
            t.add_loss(receivers[0], "random")
            t.add_loss(receivers[-1], "bursty")
        if bystanders:
            t.start_probes(bystanders)
        say(f"receivers join group of model {t.model_name!r} over REST "
            f"(POST /v1/groups, PUT /v1/groups/ID/receivers/IP)")
        t.start_receivers()
        t.start_sender()
        step = 0.25
        deadline = time.monotonic() + args.timeout
        while t.sender is not None and t.sender.alive() and time.monotonic() < deadline:
            # progress as the wire sees it: bytes on the sender's switch port
            frac = t.sent_fraction()
            if frac >= step and step <= 1.0:
                say(f"sender link carried {min(frac, 9.99):.0%} of the file")
                while step <= frac:
                    step += 0.25
            time.sleep(0.05)
        return t.finish(timeout=max(1.0, deadline - time.monotonic()))


EXPERTS = 8


def _moe(args: argparse.Namespace, fabric: Fabric, work: Path, sender: str, receivers: list[str], size: int,
         say: Any) -> SelectiveReport:
    """Selective distribution: an 8-expert model in parts, each receiver asks for the
    shared parts and 2 experts (the 5th receiver's overlap the 1st's and 2nd's)."""
    expert = max(1, size // (EXPERTS + 1))
    say(f"generating a {size / 2**20:.0f} MB Mixture-of-Experts test model: config.json, dense.safetensors and "
        f"{EXPERTS} experts of {expert / 1e6:.1f} MB ({work / 'model'})")
    model = make_moe_dir(work / "model", experts=EXPERTS, expert_size=expert, seed=args.seed)
    globs = [f"experts/expert-{i:02d}.*" for i in range(EXPERTS)]
    wants = {host: ["config.json", "dense.safetensors"] + [globs[(2 * i + i // 4 + k) % EXPERTS] for k in (0, 1)]
             for i, host in enumerate(receivers)}
    with Selective(fabric, model, sender, globs, wants, rate=args.rate, workdir=work / "selective",
                   timeout=60) as run:
        say(f"model id {run.model_id} (the digest of its catalog of {len(run.parts)} parts, each with its own id)")
        return run.run()


def _moe_verdict(report: SelectiveReport) -> int:
    if not report.ok:
        bad = [h for h, ok in report.verified.items() if not ok]
        raise DemoError(f"receivers {' '.join(bad)} did not get exactly their parts verified")
    sent = report.sent_parts()
    print(f"demo OK: {len(report.wanted)} receivers each verified exactly their parts in {report.seconds:.1f} s; "
          f"{len(sent)} of {len(report.parts)} parts sent, each once on its own group: the sender's link carried "
          f"{report.sender_ratio():.2f} x the distinct parts, each receiver's "
          f"{min(map(report.receiver_ratio, report.wanted)):.2f}-{max(map(report.receiver_ratio, report.wanted)):.2f} x "
          f"its own")
    return 0


def _autoscale(args: argparse.Namespace, fabric: Fabric, work: Path, sender: str, hosts: list[str], size: int,
               say: Any) -> AutoscaleReport:
    """``modelcast serve`` on the sender; the first other host times one fetch alone,
    then every other host fetches at a random moment over twice that time."""
    shards = max(1, min(4, args.files // 2))
    say(f"generating a {args.size_mb:g} MB test model directory of {args.files} files ({work / 'model'})")
    model = make_model_dir(work / "model", seed=args.seed, files=args.files, big=shards, big_size=max(1, size // shards))
    fleet = hosts[1:] if len(hosts) > 2 else hosts
    with Autoscale(fabric, model, sender, fleet, rate=args.rate, workdir=work / "autoscale",
                   reference_host=hosts[0], seed=args.seed + 16) as run:
        return run.run()


def _autoscale_verdict(report: AutoscaleReport) -> int:
    if not report.ok:
        bad = [a.host for a in report.arrivals if not a.verified]
        raise DemoError(f"receivers {' '.join(bad)} did not verify the model")
    print(f"demo OK: {len(report.arrivals)} receivers arriving over {max(a.start_s for a in report.arrivals):.1f} s "
          f"each verified the model within {report.worst_time_ratio():.2f} x one transfer, in {len(report.rounds)} "
          f"rounds; the server's link carried {report.sender_ratio:.2f} x what unicast would ({len(report.arrivals)} "
          f"copies)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.demo",
                                description="Distribute a test model over an OVS lab with modelcast.")
    p.add_argument("--size-mb", type=float, default=64, help="model size in MiB (default %(default)s)")
    p.add_argument("--rate", type=float, default=150,
                   help="sender rate cap, Mbit/s (default %(default)s: what userspace OVS carries)")
    p.add_argument("--topology", default=DEFAULT_TOPOLOGY,
                   help="lab topology, e.g. leaf-spine:2,4,2, fat-tree:4 (default %(default)s)")
    p.add_argument("--sender", default="h1", help="sending host (default %(default)s)")
    p.add_argument("--receivers", help="comma-separated receiving hosts (default: all but the "
                                       "sender and two bystanders)")
    p.add_argument("--loss", action="store_true",
                   help="inject 1%% random loss towards the first receiver, bursty towards the last")
    p.add_argument("--algorithm", default="spt", choices=("spt", "steiner"), help="tree algorithm")
    p.add_argument("--model", help="model name registered with the controller")
    p.add_argument("--seed", type=int, default=0, help="test model content seed")
    p.add_argument("--files", type=int, default=8,
                   help="files in the test model: a directory of shards and small config files sent in one "
                        "session (default %(default)s); 1: a single file")
    p.add_argument("--moe", action="store_true",
                   help="selective distribution: an 8-expert model in parts, each receiver asks for 2 experts")
    p.add_argument("--autoscale", action="store_true",
                   help="modelcast serve on the sender; every other host fetches the model at a random moment")
    p.add_argument("--timeout", type=float, default=300, help="give up after this many seconds")
    p.add_argument("--workdir", help="where to create the work dir (default /dev/shm)")
    p.add_argument("--keep", action="store_true", help="keep the work dir (model, copies, logs)")
    p.add_argument("-v", "--verbose", action="store_true", help="also log every lab command")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if os.geteuid() != 0:
        print("demo: error: must run as root (it creates OVS bridges and network namespaces): "
              "sudo make demo", file=sys.stderr)
        return 1
    try:
        require()
    except LabError as exc:
        print(f"demo: error: this machine cannot run the lab: {exc}", file=sys.stderr)
        return 1
    # Ctrl-C, `kill` and a closed terminal all unwind through the `finally` teardown.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("demo: interrupted; everything torn down", file=sys.stderr)
        return 130
    except (DemoError, LabError) as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 1
    except (AssertionError, RuntimeError, OSError) as exc:  # controller start, REST, files
        print(f"demo: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
