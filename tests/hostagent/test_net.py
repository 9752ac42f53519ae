"""The socket layer and CLI on loopback only (interface 127.0.0.1, TTL 0)."""

from __future__ import annotations

import errno
import json
import os
import random
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hostagent import native
from hostagent.cli import main
import socket

from hostagent.cli import build_parser
from hostagent.common import MemorySink, MemorySource
from hostagent.net import (
    GSO_BATCH_BYTES, GSO_BURST_BYTES, GSO_MAX_WAIT, JOIN_BYTES, RECEIVE_BUFFER, RX_HOLD, DatagramReader, DatagramWriter, FileSink,
    FileSource, LoopStats, batch_interval, gso_burst_bytes, parse_group, rx_hold,
)
from hostagent.receiver import Receiver, ReceiverConfig
from hostagent.sender import Sender, SenderConfig
from lab.models import make_model
from tests.support.agents import LOOPBACK, cli, loopback_group


def test_send_and_receive_over_loopback_multicast(tmp_path) -> None:
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 1_500_000, seed=4)
    addr = f"{group}:{port}"
    key = tmp_path / "session.key"
    key.write_text("a shared secret for this test\n")
    common = ["--group", addr, "--interface", LOOPBACK, "--json", "--key-file", str(key)]
    # One output in /dev/shm (tmpfs, where a loader would mmap it from) when present.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    outs = [Path(shm) / f"modelcast-test-{os.getpid()}-{random.getrandbits(32):08x}.bin", tmp_path / "out1.bin"]
    marker = tmp_path / "loaded.txt"
    hook = f"{sys.executable} -c \"import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(str(pathlib.Path(sys.argv[2]).stat().st_size))\" {marker}"
    receivers = [
        cli("recv", *common, "--source", LOOPBACK, "--out", str(outs[i]), "--timeout", "20",
            *(["--on-complete", hook] if i == 0 else []))
        for i in range(2)
    ]
    try:
        time.sleep(0.5)  # let the receivers join before the stream starts (not a pass/fail timing)
        sender = cli("send", str(model.path), *common, "--ttl", "0", "--receivers", "2", "--rate", "200",
                     "--chunk-size", "65536", "--timeout", "20")
        out, err = sender.communicate(timeout=60)
        results = [json.loads(r.communicate(timeout=60)[0]) for r in receivers]
        assert sender.returncode == 0, err
        summary = json.loads(out)
        assert summary["ok"] and [r["ok"] for r in summary["receivers"]] == [True, True]
        assert summary["authenticated"] and all(r["authenticated"] for r in results)
        assert summary["file_digest"] == model.digest
        assert summary["bytes"] == 1_500_000 and summary["goodput_mbit"] > 0
        for key in ("seconds", "datagrams_sent", "repair_bytes", "nacks"):
            assert key in summary
        for i, (proc, result) in enumerate(zip(receivers, results)):
            assert proc.returncode == 0
            assert result["ok"] and result["digest_ok"] and result["file_digest"] == summary["file_digest"]
            assert outs[i].read_bytes() == model.path.read_bytes()
            assert not Path(str(outs[i]) + ".modelcast-state").exists()
        assert results[0]["on_complete"]["exit_status"] == 0 and results[1]["on_complete"] is None
        assert marker.read_text() == "1500000"  # the hook ran on the finished, full-size file
    finally:
        for proc in receivers:
            if proc.poll() is None:
                proc.kill()
        outs[0].unlink(missing_ok=True)


def test_cli_errors_are_one_line_and_nonzero(tmp_path, capsys) -> None:
    assert main(["send", str(tmp_path / "missing.bin"), "--group", "239.1.2.3:5000"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err

    model = tmp_path / "m.bin"
    model.write_bytes(b"x" * 10)
    for bad in ("10.0.0.1:5000", "239.1.2.3", "239.1.2.3:99999", "nonsense:5000"):
        assert main(["send", str(model), "--group", bad]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("modelcast: error:")

    assert main(["recv", "--group", "239.1.2.3:5000", "--source", "127.0.0.1",
                 "--out", str(tmp_path / "no" / "such" / "dir" / "out.bin")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err
    assert main(["recv", "--group", "239.1.2.3:5000", "--source", "not-an-ip", "--out", str(tmp_path / "o")]) == 1


def test_without_a_key_the_agent_refuses_unless_insecure(tmp_path, capsys) -> None:
    model = tmp_path / "m.bin"
    model.write_bytes(b"x" * 10)
    for argv in (["send", str(model), "--group", "239.1.2.3:5000"],
                 ["recv", "--group", "239.1.2.3:5000", "--source", "127.0.0.1", "--out", str(tmp_path / "o")]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--group without --key-file" in err and "--insecure" in err, err


def test_insecure_runs_unauthenticated_and_says_so(tmp_path) -> None:
    group, port = loopback_group()
    model = make_model(tmp_path / "model.bin", 200_000, seed=5)
    common = ["--group", f"{group}:{port}", "--interface", LOOPBACK, "--json", "--insecure"]
    receiver = cli("recv", *common, "--source", LOOPBACK, "--out", str(tmp_path / "out.bin"), "--timeout", "20")
    try:
        time.sleep(0.5)  # let the receiver join before the stream starts (not a pass/fail timing)
        sender = cli("send", str(model.path), *common, "--ttl", "0", "--receivers", "1", "--rate", "100",
                     "--chunk-size", "65536", "--timeout", "20")
        out, err = sender.communicate(timeout=60)
        r_out, r_err = receiver.communicate(timeout=60)
        assert sender.returncode == 0 and receiver.returncode == 0, (err, r_err)
        for summary, stderr in ((json.loads(out), err), (json.loads(r_out), r_err)):
            assert summary["ok"] and summary["authenticated"] is False
            assert "warning: --insecure" in stderr and "no MAC" in stderr, stderr
        assert (tmp_path / "out.bin").read_bytes() == model.path.read_bytes()
    finally:
        if receiver.poll() is None:
            receiver.kill()


def test_parse_group_accepts_only_multicast() -> None:
    assert parse_group("232.1.2.3:7000") == ("232.1.2.3", 7000)
    with pytest.raises(ValueError):
        parse_group("127.0.0.1:7000")


@pytest.mark.parametrize("base", [0, 1000])
def test_file_source_reads_what_the_file_holds_whatever_the_order(tmp_path, monkeypatch, base) -> None:
    """The stream's read-ahead block is an optimisation only: a stream of small reads front
    to back, repairs anywhere between them, whole-chunk reads and reads past the end all
    return the file's bytes, as one positional read would (a lane's slice too); and the
    stream costs one read per block, not one per datagram."""
    monkeypatch.setattr(FileSource, "READ_AHEAD", 4096)
    data = random.Random(base).randbytes(20_000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    src = FileSource(str(path), offset=base)
    calls = []
    for name in ("pread", "preadv"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    rng, pos, want = random.Random(7), 0, data[base:]
    while pos < len(want):
        size = rng.choice([300, 300, 300, 257])
        assert src.read(pos, size) == want[pos : pos + size]
        pos += size
        if rng.random() < 0.2:  # a repair somewhere
            at = rng.randrange(len(want))
            assert src.read(at, 300) == want[at : at + 300]
    assert src.read(4096, 4096) == want[4096:8192]  # a manifest's whole-chunk read
    assert src.read(len(want) - 5, 300) == want[-5:] and src.read(len(want) + 10, 300) == b""
    assert calls.count("preadv") <= len(want) // 4096 + 2
    src.close()


def test_file_source_and_sink_positional_io(tmp_path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 4)
    src = FileSource(str(path))
    assert src.size == 1024 and src.read(250, 10) == bytes(range(250, 256)) + bytes(range(4))
    src.close()
    sink = FileSink(str(tmp_path / "o.bin"))
    sink.write(10, b"late")
    sink.write(0, b"early")
    parts = memoryview(b"ABCDEFGH")
    sink.write_many(20, [parts[:3], parts[3:4], parts[4:]])  # one pwritev, consecutive
    sink.save_state(b"state")
    assert sink.load_state() == b"state"
    assert sink.read(0, 5) == b"early" and sink.read(10, 4) == b"late" and sink.read(20, 8) == b"ABCDEFGH"
    sink.finish(14)
    assert sink.load_state() is None
    sink.close()
    assert (tmp_path / "o.bin").stat().st_size == 14


def test_gso_is_on_by_default_and_can_be_turned_off() -> None:
    parser = build_parser()
    assert parser.parse_args(["send", "f", "--group", "232.1.1.1:5000"]).gso is True
    assert parser.parse_args(["send", "f", "--group", "232.1.1.1:5000", "--no-gso"]).gso is False


def test_gso_sender_waits_for_a_batch_of_tokens() -> None:
    """Each wake-up of a GSO sender should find ~120 KB of tokens (two sendmsg); at low
    rates the wait is capped, so batches shrink instead of bursts growing."""
    fast = Sender(MemorySource(bytes(10_000)), SenderConfig(rate_bps=1e9, max_datagram=8972,
                                                            payload_size=8000), 0.0)
    assert batch_interval(fast, gso=True) == pytest.approx(GSO_BATCH_BYTES * 8 / fast.rate)
    assert batch_interval(fast, gso=True) < 0.002
    # the bucket (hostagent.api gives a GSO sender GSO_BURST_BYTES) must hold what it waits for
    assert GSO_BATCH_BYTES + 9000 <= GSO_BURST_BYTES
    assert batch_interval(fast, gso=False) == 0.0
    slow = Sender(MemorySource(bytes(10_000)), SenderConfig(rate_bps=10e6), 0.0)
    assert batch_interval(slow, gso=True) == GSO_MAX_WAIT
    rx = Receiver(MemorySink(), ReceiverConfig(), 0.0)
    assert batch_interval(rx, gso=True) == 0.0


@pytest.mark.parametrize("mbit", [10, 50, 100, 200, 480, 1000, 10_000])
def test_a_gso_senders_bucket_holds_two_of_its_batches_within_the_burst_bound(mbit: float) -> None:
    """Whatever the cap, the token bucket holds what a wake-up waits for twice over (a
    wake-up a little late loses no tokens, so the rate holds), and never more than
    GSO_BURST_BYTES (what a switch with small queues forwards at once)."""
    cap = mbit * 1e6
    sender = Sender(MemorySource(bytes(10_000)), SenderConfig(rate_bps=cap), 0.0)
    assert sender.rate <= cap
    waited_for = batch_interval(sender, gso=True) * sender.rate / 8  # tokens gathered per wake-up
    at_cap = min(GSO_MAX_WAIT, GSO_BATCH_BYTES * 8 / cap) * cap / 8  # the same, once ramped up to the cap
    assert 2 * max(waited_for, at_cap) <= gso_burst_bytes(cap) + 1 <= GSO_BURST_BYTES + 1
    assert gso_burst_bytes(cap) >= 64 * 1024


def test_a_receivers_hold_fills_at_most_a_64th_of_its_buffer() -> None:
    buf = 2 * RECEIVE_BUFFER  # what a root receiver's SO_RCVBUF reports
    assert rx_hold(100e6 / 8, buf) == RX_HOLD  # 100 Mbit/s: 250 KB in the longest hold
    assert rx_hold(1e9 / 8, buf) * 1e9 / 8 == pytest.approx(buf / 64)  # 1 Gbit/s: ~4 ms, bounded by the buffer
    assert rx_hold(1e9 / 8, 425_984) * 1e9 / 8 <= 425_984 / 64  # a non-root socket's default buffer
    assert rx_hold(0.0, buf) == 0.0


def test_a_receiver_expects_no_more_first_pass_bytes_once_the_last_seq_came() -> None:
    """What a receiver's hold is capped by (``Receiver.bytes_to_come``): everything before
    the manifest, then the first pass's bytes beyond the highest seq seen, then none --
    repairs then come as they come, and the last bytes do not wait out a hold."""
    from hostagent import wire

    data = bytes(range(256)) * 40  # 10 KiB: 10 datagrams of 1 KiB
    sender = Sender(MemorySource(data), SenderConfig(chunk_size=4096, payload_size=1024), 0.0)
    out, now = [], 0.0
    while sender.stream_position < sender.layout.total_seq:
        now += 0.001
        out.extend(raw for raw, _ in sender.datagrams_to_send(now))
    rx = Receiver(MemorySink(), ReceiverConfig(), 0.0)
    assert rx.bytes_to_come >= 1 << 40
    pages = [raw for raw in out if wire.peek_type(raw) == wire.T_MANIFEST]
    data_out = [raw for raw in out if wire.peek_type(raw) == wire.T_DATA]
    rx.receive_datagram(pages[0], ("10.0.0.1", 1), 0.1)
    assert rx.bytes_to_come == 10 * 1024
    for raw in data_out[:4]:
        rx.receive_datagram(raw, ("10.0.0.1", 1), 0.2)
    assert rx.bytes_to_come == 6 * 1024
    rx.receive_datagram(data_out[-1], ("10.0.0.1", 1), 0.3)  # the last seq (five lost before it)
    assert rx.bytes_to_come == 0


def test_gso_writer_and_gro_reader_move_datagrams_intact_over_loopback() -> None:
    """What the writer sends as GSO batches the reader hands on as the same datagrams,
    in order (as GRO super-packets where the kernel coalesces, else one by one)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind((LOOPBACK, 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        rx.setblocking(False)
        stats = LoopStats()
        reader = DatagramReader(rx, True, stats)
        writer = DatagramWriter(tx, ("232.1.1.1", 1), True, stats)
        datagrams = [bytes([i % 251]) * (1200 if i % 50 != 49 else 700) for i in range(200)]
        writer.send([(d, rx.getsockname()) for d in datagrams])
        assert stats.gso_sends + stats.plain_sends > 0 and stats.send_drops == 0
        if stats.gso:  # the kernel took GSO: far fewer sends than datagrams
            assert stats.gso_sends + stats.plain_sends < len(datagrams) / 10
        got: list[bytes] = []

        def deliver(view: memoryview, seg: int, addr: object, now: float) -> None:
            step = seg or len(view)
            got.extend(bytes(view[i : i + step]) for i in range(0, len(view), step))

        while len(got) < len(datagrams):
            assert reader.read(64, deliver, lambda: 0.0) > 0
        assert got == datagrams
    finally:
        rx.close()
        tx.close()


@pytest.mark.parametrize("read_in_c", [True, False], ids=["C", "Python"])
def test_the_receivers_reader_joins_queued_gro_super_packets_of_a_run(read_in_c: bool) -> None:
    """A receiver's reader hands on GSO batches queued one after another as one run
    while every datagram so far had the run's size: the datagrams arrive intact and in
    order, each delivery is GRO-shaped (all of its size but a shorter last one), a
    shorter datagram ends its delivery, and with GRO far fewer deliveries than reads."""
    rx, tx = _udp(), _udp(False)
    try:
        stats = LoopStats()
        reader = DatagramReader(rx, True, stats, coalesce=True, read_in_c=read_in_c)
        assert (reader._read_runs is not None) == (read_in_c and native.NATIVE)
        writer = DatagramWriter(tx, ("232.1.1.1", 1), True, stats)
        # runs of 40 full datagrams ended by a shorter one, as a chunk's last fragment is,
        # sent 10 at a time (as a paced sender's GSO sends)
        datagrams = [bytes([i % 251]) * (1200 if i % 41 != 40 else 700) for i in range(205)]
        for i in range(0, len(datagrams), 10):
            writer.send([(d, rx.getsockname()) for d in datagrams[i : i + 10]])
        got = _read_all(reader, len(datagrams))
        assert [d for ds, _, _ in got for d in ds] == datagrams
        for ds, seg, _ in got:
            assert all(len(d) == 1200 for d in ds[:-1]) and seg == (1200 if len(ds) > 1 else 0)
            assert sum(map(len, ds)) <= JOIN_BYTES
        # all was queued: one delivery per run, whether the kernel coalesced or not
        assert [len(ds) for ds, _, _ in got] == [41] * 5 and stats.coalesced == 5
    finally:
        rx.close()
        tx.close()


def _read_all(reader: DatagramReader, want: int) -> list[tuple[list[bytes], int, object]]:
    """Every delivery until ``want`` datagrams came: (its datagrams, its seg, its source)."""
    got: list[tuple[list[bytes], int, object]] = []

    def deliver(view: memoryview, seg: int, addr: object, now: float) -> None:
        step = seg or len(view)
        got.append(([bytes(view[i : i + step]) for i in range(0, len(view), step)] if step else [b""], seg, addr))

    deadline = time.monotonic() + 5
    while sum(len(d) for d, _, _ in got) < want and time.monotonic() < deadline:
        reader.read(64, deliver, lambda: 0.0)
    return got


def _udp(bound: bool = True) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((LOOPBACK, 0))
    if bound:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        sock.setblocking(False)
    return sock


@pytest.mark.parametrize("read_in_c", [True, False], ids=["C", "Python"])
def test_the_reader_joins_queued_datagrams_of_one_source_into_runs_as_gro_would(read_in_c: bool) -> None:
    """Without GRO, a receiver's reader hands on what is queued as GRO super-packets:
    equal-sized datagrams of one source back to back, a shorter one ending the run; a
    bigger one or another source starts a new delivery; nothing is lost, reordered or
    merged across sources."""
    rx, a, b = _udp(), _udp(False), _udp(False)
    try:
        dest = rx.getsockname()
        sent = ([(a, bytes([i]) * 1200) for i in range(5)] + [(a, b"s" * 700)] + [(a, b"t" * 1200)] * 3
                + [(a, b"B" * 1300)] + [(b, b"o" * 1200)] * 2 + [(a, b"x" * 1200)])
        for sock, data in sent:
            sock.sendto(data, dest)
        stats = LoopStats()
        got = _read_all(DatagramReader(rx, False, stats, coalesce=True, read_in_c=read_in_c), len(sent))
        assert [d for ds, _, _ in got for d in ds] == [d for _, d in sent]
        assert [(len(ds), seg) for ds, seg, _ in got] == [(6, 1200), (3, 1200), (1, 0), (2, 1200), (1, 0)]
        assert [src for _, _, src in got] == [a.getsockname()] * 3 + [b.getsockname(), a.getsockname()]
        assert stats.coalesced == 3 and stats.reads == len(sent)
    finally:
        for sock in (rx, a, b):
            sock.close()


@pytest.mark.parametrize("read_in_c", [True, False], ids=["C", "Python"])
def test_an_empty_datagram_is_handed_on_alone_and_dropped_not_fatal(read_in_c: bool) -> None:
    """Anyone on the network can send a receiver's port an empty UDP datagram: it used
    to stop the reader (ZeroDivisionError). It ends the run it arrives in, goes on alone,
    and the receiver counts it as a drop."""
    rx, a = _udp(), _udp(False)
    try:
        sent = [b"d" * 1200] * 3 + [b""] + [b"e" * 1200] * 2
        for data in sent:
            a.sendto(data, rx.getsockname())
        got = _read_all(DatagramReader(rx, False, LoopStats(), coalesce=True, read_in_c=read_in_c), len(sent))
        assert [ds for ds, _, _ in got] == [sent[:3], [b""], sent[4:]]
        receiver = Receiver(MemorySink(), ReceiverConfig(), 0.0)
        receiver.receive_batch(memoryview(b""), 0, a.getsockname(), 0.1)
        assert sum(receiver.stats.drops.values()) == 1
    finally:
        rx.close()
        a.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([0, 1, 700, 1200, 1200, 1200, 8952, 9000])),
                min_size=1, max_size=60), st.booleans())
def test_coalesced_deliveries_are_gro_shaped_and_lose_nothing(datagrams: list[tuple[bool, int]],
                                                              read_in_c: bool) -> None:
    """Any mix of sizes (an empty datagram too: a hostile one crashed the Python loop)
    and two sources, read by the C loop or the Python one: every delivery is one source's
    datagrams, all of the first's size but a shorter last one, and together they are
    exactly what was sent, in order; none longer than ``JOIN_BYTES``."""
    rx, a, b = _udp(), _udp(False), _udp(False)
    try:
        sent = [(a if first else b, bytes([i % 251]) * size) for i, (first, size) in enumerate(datagrams)]
        for sock, data in sent:
            sock.sendto(data, rx.getsockname())
        got = _read_all(DatagramReader(rx, False, LoopStats(), coalesce=True, read_in_c=read_in_c), len(sent))
        assert [d for ds, _, _ in got for d in ds] == [d for _, d in sent]
        i = 0
        for ds, seg, src in got:
            assert [s.getsockname() for s, _ in sent[i : i + len(ds)]] == [src] * len(ds)
            assert sum(map(len, ds)) <= JOIN_BYTES
            if len(ds) > 1:
                assert seg == len(ds[0]) and all(len(d) == seg for d in ds[:-1]) and len(ds[-1]) <= seg
            else:
                assert seg == 0
            i += len(ds)
    finally:
        for sock in (rx, a, b):
            sock.close()


class _FullQueue:
    """A socket whose queue is always full (ENOBUFS), or that refuses GSO (EIO)."""

    def __init__(self, gso_errno: int) -> None:
        self.gso_errno = gso_errno
        self.sent: list[bytes] = []

    def sendmsg(self, buffers, ancdata, flags, addr) -> int:
        raise OSError(self.gso_errno, os.strerror(self.gso_errno))

    def sendto(self, data: bytes, addr: object) -> int:
        if self.gso_errno == errno.ENOBUFS:
            raise OSError(errno.ENOBUFS, "full")
        self.sent.append(data)
        return len(data)


def test_a_full_queue_is_a_drop_but_a_refused_gso_falls_back_for_good() -> None:
    items = [(b"x" * 1000, ("10.0.0.2", 5000))] * 10
    stats = LoopStats()
    DatagramWriter(_FullQueue(errno.ENOBUFS), ("232.1.1.1", 1), True, stats).send(items)  # type: ignore[arg-type]
    assert stats.gso and stats.send_drops == 10  # counted (the sender hears of it), GSO kept
    stats = LoopStats()
    sock = _FullQueue(errno.EIO)
    DatagramWriter(sock, ("232.1.1.1", 1), True, stats).send(items)  # type: ignore[arg-type]
    assert not stats.gso and stats.send_drops == 0 and sock.sent == [d for d, _ in items]


def test_file_sink_syncs_the_data_before_the_record_that_claims_it(tmp_path, monkeypatch) -> None:
    """The record is written off the caller's thread: fdatasync of the data file, then a
    temporary record fsynced and renamed over the old one; a restart reads the newest."""
    import hostagent.net as net

    calls: list[str] = []
    real_fdatasync, real_replace = os.fdatasync, os.replace
    monkeypatch.setattr(net.os, "fdatasync", lambda fd: (calls.append("fdatasync"), real_fdatasync(fd))[1])
    monkeypatch.setattr(net.os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    sink = FileSink(str(tmp_path / "o.bin"))
    sink.write(0, b"data")
    sink.save_state(b"one")
    sink.save_state(b"two")
    assert sink.load_state() == b"two"
    sink.close()
    assert calls[:2] == ["fdatasync", "replace"] and calls.count("fdatasync") == calls.count("replace")
    assert not (tmp_path / "o.bin.modelcast-state.tmp").exists()


def test_file_sink_errors_name_the_path(tmp_path, monkeypatch) -> None:
    import hostagent.net as net

    sink = FileSink(str(tmp_path / "o.bin"))

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(net.os, "pwrite", full)
    with pytest.raises(OSError) as info:
        sink.write(0, b"x")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "o.bin")
    monkeypatch.undo()
    sink.close()


# --------------------------------------------------------------------------- this host's address


def _routes(table: dict[str, str]):
    """A routing table as ``own_address`` asks it: destination -> source address, or
    ENETUNREACH for a destination it has no route to."""

    def route(dest: str) -> str:
        if dest not in table:
            raise OSError(errno.ENETUNREACH, "Network is unreachable", f"route to {dest}")
        return table[dest]

    return route


DEMO_HOST = [("lo", "127.0.0.1"), ("eth0", "10.0.0.3"), ("mgmt0", "169.254.7.3")]


def test_own_address_is_the_multicast_routes_never_the_controllers() -> None:
    """The demo's host: the fabric on eth0 (the multicast route), the controller reached
    over a management network (or on this host's loopback): the fabric address."""
    from hostagent.net import PROBE_GROUP, own_address

    route = _routes({PROBE_GROUP: "10.0.0.3", "169.254.7.254": "169.254.7.3", "127.0.0.1": "127.0.0.1"})
    assert own_address(route=route, addresses=lambda: DEMO_HOST) == "10.0.0.3"
    # a receiver: the route towards its sender first
    assert own_address(toward="10.0.0.1", route=_routes({"10.0.0.1": "10.0.0.3"}), addresses=lambda: DEMO_HOST) \
        == "10.0.0.3"
    assert own_address("10.0.0.9", route=route, addresses=lambda: DEMO_HOST) == "10.0.0.9"  # --interface


def test_own_address_never_guesses_a_loopback_and_names_the_candidates() -> None:
    from hostagent.net import PROBE_GROUP, AddressUnknown, own_address

    loopback = _routes({PROBE_GROUP: "127.0.0.1", "127.0.0.1": "127.0.0.1"})
    # one address besides loopback: that one
    assert own_address(toward="127.0.0.1", route=loopback, addresses=lambda: DEMO_HOST[:2]) == "10.0.0.3"
    with pytest.raises(AddressUnknown) as err:
        own_address(route=_routes({}), addresses=lambda: DEMO_HOST)
    text = str(err.value)
    assert "no route to 232.0.1.1 (Network is unreachable)" in text
    assert "candidates: 10.0.0.3 (eth0), 169.254.7.3 (mgmt0)" in text and "--ip ADDR" in text
    assert "127.0.0.1" not in text.split("candidates:")[1]
    with pytest.raises(AddressUnknown, match="candidates: none"):
        own_address(route=loopback, addresses=lambda: DEMO_HOST[:1])


def test_local_addresses_lists_this_hosts_interfaces() -> None:
    from hostagent.net import local_addresses

    found = local_addresses()
    assert ("lo", "127.0.0.1") in found
    assert all(socket.inet_aton(addr) for _, addr in found)
