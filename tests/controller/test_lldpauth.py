"""Signed discovery frames (``controller.lldpauth``): a link is learned only from an LLDP
frame this controller made. A host forging Ryu's plain format could make the controller
drop a real link and believe one into the host's port (the lab test in
``tests/lab/test_controller_lldp.py`` replays that attack)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

import controller.compat  # noqa: F401  (Ryu importable)
from controller.lldpauth import Forged, LldpSigner, NotOurs

KEY = bytes(range(32))
SRC = bytes.fromhex("020000000001")


def _plain(dpid: int, port: int) -> bytes:
    def tlv(t: int, v: bytes) -> bytes:
        return struct.pack("!H", (t << 9) | len(v)) + v
    return (bytes.fromhex("0180c200000e") + SRC + b"\x88\xcc" + tlv(1, b"\x07dpid:%016x" % dpid)
            + tlv(2, b"\x02" + struct.pack("!I", port)) + tlv(3, b"\x00\x78") + tlv(0, b""))


def test_a_frame_we_made_names_its_switch_and_port():
    s = LldpSigner(KEY)
    assert s.parse(s.frame(0x1, 3, SRC, now=100.0), now=100.5) == (1, 3)
    assert s.parse(s.frame(2**64 - 1, 2**32 - 1, SRC, now=0.0), now=4.9) == (2**64 - 1, 2**32 - 1)
    assert s.forged == 0


def test_the_plain_format_a_host_can_forge_is_refused_and_counted():
    s = LldpSigner(KEY)
    with pytest.raises(Forged, match="no signature"):
        s.parse(_plain(1, 1), now=100.0)
    assert s.forged == 1


def test_a_frame_signed_with_another_key_or_altered_is_refused():
    mine, theirs = LldpSigner(KEY), LldpSigner(bytes(32))
    with pytest.raises(Forged, match="bad signature"):
        mine.parse(theirs.frame(1, 1, SRC, now=100.0), now=100.0)
    frame = bytearray(mine.frame(1, 1, SRC, now=100.0))
    at = frame.index(b"\x02\x00\x00\x00\x01")  # the port id TLV's value: port 1 -> 2
    frame[at + 4] = 2
    with pytest.raises(Forged, match="bad signature"):
        mine.parse(bytes(frame), now=100.0)
    assert mine.forged == 2


def test_a_replayed_frame_is_refused_once_older_than_max_age():
    s = LldpSigner(KEY, max_age_s=5)
    frame = s.frame(1, 1, SRC, now=100.0)
    assert s.parse(frame, now=104.9) == (1, 1)
    with pytest.raises(Forged, match="ago"):
        s.parse(frame, now=105.1)
    with pytest.raises(Forged, match="ago"):  # from the future (a clock it cannot know)
        s.parse(s.frame(1, 1, SRC, now=110.0), now=100.0)


def test_other_lldp_speakers_and_other_frames_are_not_ours_and_not_counted():
    s = LldpSigner(KEY)
    def tlv(t: int, v: bytes) -> bytes:
        return struct.pack("!H", (t << 9) | len(v)) + v
    lldpd = (bytes.fromhex("0180c200000e") + SRC + b"\x88\xcc" + tlv(1, b"\x04" + SRC)
             + tlv(2, b"\x05eth0") + tlv(3, b"\x00\x78") + tlv(0, b""))
    for frame in (lldpd, b"", SRC * 3, bytes.fromhex("ffffffffffff") + SRC + b"\x08\x00" + b"\x45" * 20):
        with pytest.raises(NotOurs) as info:
            s.parse(frame, now=1.0)
        assert not isinstance(info.value, Forged)
    assert s.forged == 0


def test_a_short_key_is_refused():
    with pytest.raises(ValueError, match="16 bytes"):
        LldpSigner(b"short")


@given(st.binary(max_size=200))
def test_any_bytes_parse_to_not_ours_or_forged_never_a_crash(data):
    s = LldpSigner(KEY)
    with pytest.raises(NotOurs):
        s.parse(data, now=1.0)


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1), st.integers(14, 80), st.integers(1, 255))
def test_no_single_byte_change_of_a_frame_is_accepted_as_another_port(dpid, port, at, delta):
    """Change any one byte after the Ethernet header: the frame is refused, or (a byte
    nothing reads, e.g. the TTL) still names the same switch and port."""
    s = LldpSigner(KEY)
    frame = bytearray(s.frame(dpid, port, SRC, now=50.0))
    at = min(at, len(frame) - 1)
    frame[at] = (frame[at] + delta) % 256
    try:
        got = s.parse(bytes(frame), now=50.0)
    except NotOurs:
        return
    assert got == (dpid, port)


def test_ryu_discovery_builds_and_checks_signed_frames_after_install():
    """The shell: Ryu's LLDPPacket makes our frames and turns a forged one into the
    LLDPUnknownFormat its packet-in handler ignores; its LLDP packet-in flow asks for
    the whole signed frame."""
    from controller import lldpauth
    from ryu.topology import switches

    now = [1000.0]
    signer = lldpauth.install(clock=lambda: now[0])
    try:
        _check_installed(signer, now)
    finally:
        lldpauth.install()  # the real clock again for whatever runs next in this process


def _check_installed(signer, now: list[float]) -> None:
    from controller import lldpauth
    from ryu.topology import switches

    frame = switches.LLDPPacket.lldp_packet(0x5, 2, "02:00:00:00:00:05", 120)
    assert switches.LLDPPacket.lldp_parse(frame) == (5, 2)
    assert switches.Switches.LLDP_PACKET_LEN == len(frame)
    with pytest.raises(switches.LLDPPacket.LLDPUnknownFormat):
        switches.LLDPPacket.lldp_parse(_plain(5, 2))
    now[0] += 10  # stale
    with pytest.raises(switches.LLDPPacket.LLDPUnknownFormat):
        switches.LLDPPacket.lldp_parse(frame)
    assert signer.forged == 2 and lldpauth.SIGNER is signer
    send = switches.Switches.send_lldp_packet
    again = lldpauth.install(clock=lambda: now[0])  # (app.py installs too): one wrapper,
    assert switches.Switches.send_lldp_packet is send and again is not signer
    sent: list[bytes] = []  # and each frame it sends is made anew by the latest install

    port = type("Port", (), {"dpid": 7, "port_no": 3, "hw_addr": "02:00:00:00:00:07"})()

    class Switch:  # what the wrapper reads of Ryu's Switches app
        ports = {port: switches.PortData(False, b"made once, when the port was added")}
    ryu_send, send.ryu_send = send.ryu_send, lambda self, p: sent.append(self.ports[p].lldp_data)
    try:
        send(Switch(), port)
        now[0] += 3
        send(Switch(), port)
    finally:
        send.ryu_send = ryu_send
    assert [again.parse(frame, now[0]) for frame in sent] == [(7, 3), (7, 3)]
    assert sent[0] != sent[1]  # a fresh time each


def test_ryus_probe_round_over_many_ports_is_paced_by_the_rate_not_ryus_pause():
    """Ryu's own re-probe loop after ``install(rate)``: 400 ports due at once are probed
    in about 0.4 s at 1000 frames/s (Ryu's own 0.05 s pause: 20 s; over fat-tree:34's
    49,130 ports 41 minutes, and a link that stops carrying the frames is dropped only
    after several rounds)."""
    import time

    from controller import lldpauth
    from ryu.topology import switches

    lldpauth.install(1000)
    assert switches.Switches.LLDP_SEND_GUARD == 0.001
    sent: list[int] = []

    class Loop:  # what Ryu's lldp_loop reads of its Switches app
        is_active = True
        LLDP_SEND_GUARD = switches.Switches.LLDP_SEND_GUARD
        LLDP_SEND_PERIOD_PER_PORT = switches.Switches.LLDP_SEND_PERIOD_PER_PORT
        lldp_event = type("Event", (), {"clear": lambda self: None, "wait": lambda self, timeout=None: None})()

        def __init__(self) -> None:
            self.ports = {}
            for i in range(400):
                data = switches.PortData(False, b"")
                data.timestamp = time.time() - 10  # every port due again
                self.ports[i] = data

        def send_lldp_packet(self, port: int) -> None:
            sent.append(port)
            if len(sent) == len(self.ports):
                self.is_active = False

    start = time.monotonic()
    switches.Switches.lldp_loop(Loop())
    took = time.monotonic() - start
    assert sorted(sent) == list(range(400))
    assert took < 4.0, f"a round over 400 ports took {took:.1f} s"
    with pytest.raises(ValueError, match="LLDP rate"):
        lldpauth.reprobe_pause(0)
