"""``python -m bench.hotpath`` measures what it says: the recorded stream is a complete
transfer cut into GRO super-packets the way the kernel hands them over, the receiver it
times ends with the verified file (the bench refuses to report otherwise), and both
ends are timed with and without the MAC."""

import argparse

import pytest

from bench import hotpath
from hostagent import wire
from hostagent.common import Layout


@pytest.mark.parametrize("keyed", [True, False])
def test_hotpath_bench_times_a_complete_transfer(keyed) -> None:
    key = wire.derive_key(b"t") if keyed else None
    data = bytes(range(256)) * (3 * 4096 + 7)  # three chunks and a bit
    stream = hotpath.record_stream(data, key)
    packets = hotpath.super_packets(stream)
    assert b"".join(blob for blob, _ in packets) == b"".join(stream)
    assert max(len(blob) // seg for blob, seg in packets if seg) == hotpath.GRO_SEGMENTS
    total = Layout(len(data), hotpath.CHUNK, hotpath.PAYLOAD).total_seq  # every fragment once
    assert sum(1 for raw in stream if wire.peek_type(raw) == wire.T_DATA) == total
    result = hotpath.run(argparse.Namespace(size_mb=2, runs=1, no_key=not keyed, json=True))
    cpu = result["cpu_s_per_gb"]
    assert result["keyed"] is keyed and cpu["receiver"] > 0 and cpu["receiver_python"] > 0 and cpu["sender"] > 0
    assert ("mac_floor" in cpu) is keyed


def test_hotpath_receiver_refuses_to_report_an_incomplete_stream(tmp_path) -> None:
    data = bytes(3 * hotpath.CHUNK)
    stream = hotpath.record_stream(data, None)
    datas = [i for i, raw in enumerate(stream) if wire.peek_type(raw) == wire.T_DATA]
    del stream[datas[5]]  # one datagram lost: no repair in a recorded stream
    with pytest.raises(RuntimeError, match="did not complete"):
        hotpath.receive_cpu(hotpath.super_packets(stream), None, len(data), str(tmp_path))
