"""Signed LLDP: links are learned only from discovery frames this controller sent.

Ryu's link discovery trusts any LLDP frame with its format ("dpid:..." chassis, a port
number). Every host sees those frames (they go out of every switch port), so a host
could forge one claiming to be, say, spine 1's port 1: the controller then dropped the
real link from that port and believed one into the host's port, and every group through
it was rerouted (measured on the lab: one forged frame from h1 was enough; sent again
every second it flaps the link for as long as it likes).

Each frame now carries a keyed MAC (an organizationally specific TLV: a 64-bit time in
ms and 16 bytes of HMAC-SHA256 over the switch, the port and that time) made with a key
only this process knows, and a frame is accepted only if the MAC checks and the time is
at most ``max_age_s`` old. A host can still replay a genuine frame from its own port
back into that port (the controller ignores a link from a switch to itself), and two
colluding hosts could relay one between them within ``max_age_s`` (a wormhole: no
signature stops it; the window bounds it).

Pure: bytes and ``now`` in, bytes or (switch, port) out; ``install`` (the shell) puts it
into Ryu's ``ryu.topology.switches``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import struct
import time
from typing import Any, Callable

log = logging.getLogger("modelcast.lldp")

LLDP_MAC = bytes.fromhex("0180c200000e")  # nearest bridge: switches do not forward it
ETH_LLDP = 0x88CC
OUI = b"MC\x01"  # the TLV's organisation id: modelcast's own (frames stay in one fabric)
SUBTYPE = 1
CHASSIS_PREFIX = b"dpid:"
MAC_LEN = 16
MAX_AGE_S = 5.0  # Ryu sends each port's frame about every 0.9 s; links expire after 10 s
WARN_EVERY_S = 60.0


class NotOurs(ValueError):
    """Not a discovery frame in our format (another LLDP speaker, or not LLDP at all)."""


class Forged(NotOurs):
    """Our format, but the MAC does not check or the frame is too old."""


def _tlv(kind: int, value: bytes) -> bytes:
    return struct.pack("!H", (kind << 9) | len(value)) + value


class LldpSigner:
    """Makes and checks discovery frames with one key (``key``: 32 random bytes, never
    shown to anyone)."""

    def __init__(self, key: bytes, max_age_s: float = MAX_AGE_S) -> None:
        if len(key) < 16:
            raise ValueError("an LLDP key needs at least 16 bytes")
        self._key = key
        self.max_age_s = max_age_s
        self.forged = 0  # frames refused since start (/metrics)
        self._warned = float("-inf")

    def _mac(self, dpid: int, port: int, ms: int) -> bytes:
        msg = struct.pack("!QIQ", dpid, port, ms)
        return hmac.new(self._key, b"modelcast-lldp" + msg, hashlib.sha256).digest()[:MAC_LEN]

    def frame(self, dpid: int, port: int, src_mac: bytes, now: float) -> bytes:
        """A discovery frame for ``dpid``:``port`` made at ``now`` (seconds)."""
        ms = int(now * 1000)
        chassis = _tlv(1, b"\x07" + CHASSIS_PREFIX + b"%016x" % dpid)  # locally assigned
        port_id = _tlv(2, b"\x02" + struct.pack("!I", port))  # port component
        ttl = _tlv(3, struct.pack("!H", 120))
        sig = _tlv(127, OUI + bytes([SUBTYPE]) + struct.pack("!Q", ms) + self._mac(dpid, port, ms))
        return LLDP_MAC + src_mac + struct.pack("!H", ETH_LLDP) + chassis + port_id + ttl + sig + _tlv(0, b"")

    def parse(self, data: bytes, now: float) -> tuple[int, int]:
        """(switch, port) a frame of ours says it left; ``NotOurs`` for anything else,
        ``Forged`` (counted) for our format without a valid, fresh MAC."""
        if len(data) < 14 or struct.unpack_from("!H", data, 12)[0] != ETH_LLDP:
            raise NotOurs("not LLDP")
        tlvs: dict[int, bytes] = {}
        sig: bytes | None = None
        i = 14
        while i + 2 <= len(data):
            head = struct.unpack_from("!H", data, i)[0]
            kind, size = head >> 9, head & 0x1FF
            value = data[i + 2:i + 2 + size]
            if len(value) < size:
                raise NotOurs("truncated TLV")
            i += 2 + size
            if kind == 0:
                break
            if kind == 127 and value[:4] == OUI + bytes([SUBTYPE]):
                sig = value[4:]
            else:
                tlvs.setdefault(kind, value)
        chassis, port_id = tlvs.get(1, b""), tlvs.get(2, b"")
        if chassis[:1] != b"\x07" or not chassis[1:].startswith(CHASSIS_PREFIX):
            raise NotOurs("not a discovery frame of ours (chassis id)")
        if port_id[:1] != b"\x02" or len(port_id) != 5:
            raise NotOurs("not a discovery frame of ours (port id)")
        try:
            dpid = int(chassis[1 + len(CHASSIS_PREFIX):], 16)
        except ValueError:
            raise NotOurs("chassis id is no switch number") from None
        port = struct.unpack("!I", port_id[1:])[0]
        why = self._refusal(dpid, port, sig, now)
        if why is not None:
            self.forged += 1
            if now - self._warned >= WARN_EVERY_S:
                self._warned = now
                log.warning("refused a discovery frame claiming switch %#x port %d: %s (%d refused "
                            "so far; a host forging LLDP?)", dpid, port, why, self.forged)
            raise Forged(why)
        return dpid, port

    def _refusal(self, dpid: int, port: int, sig: bytes | None, now: float) -> str | None:
        """Why a frame of our format is refused, or None."""
        if sig is None:
            return "no signature"
        if len(sig) != 8 + MAC_LEN:
            return "malformed signature"
        ms = struct.unpack("!Q", sig[:8])[0]
        if not hmac.compare_digest(sig[8:], self._mac(dpid, port, ms)):
            return "bad signature"
        age = now - ms / 1000
        if age > self.max_age_s or age < -1.0:
            return f"sent {age:.1f} s ago (at most {self.max_age_s:g} s)"
        return None


SIGNER: LldpSigner | None = None  # the running controller's (install)


RYU_PAUSE: float | None = None  # Ryu's own pause between two re-probe frames, once ``install`` replaced it


def reprobe_pause(rate: float) -> float:
    """The pause after each discovery frame when Ryu probes the ports again (one by one),
    for at most ``rate`` frames a second: Ryu's own 0.05 s made a round over a
    1,445-switch fabric's 49,130 ports 41 minutes, and a link that stops carrying the
    frames while its ports stay up is dropped only after several rounds."""
    if not rate > 0:
        raise ValueError(f"an LLDP rate must be > 0 frames/s, not {rate}")
    return 1.0 / rate


def install(rate: float = 1000.0, clock: Callable[[], float] = time.monotonic) -> LldpSigner:
    """Sign Ryu's discovery frames and check the ones that come back: Ryu's
    ``LLDPPacket`` builds and parses through ``SIGNER``, and each port's frame is made
    again (with the current time) each time Ryu sends it; its probing paced to ``rate``
    frames a second (``reprobe_pause``). Before any switch connects."""
    global SIGNER, RYU_PAUSE
    from ryu.lib import addrconv
    from ryu.topology import switches

    if RYU_PAUSE is None:  # (Ryu's own, before the first install replaces it)
        RYU_PAUSE = switches.Switches.LLDP_SEND_GUARD
    switches.Switches.LLDP_SEND_GUARD = reprobe_pause(rate)
    signer = SIGNER = LldpSigner(os.urandom(32))

    def lldp_packet(dpid: int, port_no: int, dl_addr: Any, ttl: int) -> bytes:
        return signer.frame(dpid, port_no, addrconv.mac.text_to_bin(dl_addr), clock())

    def lldp_parse(data: bytes) -> tuple[int, int]:
        try:
            return signer.parse(bytes(data), clock())
        except NotOurs as exc:  # Ryu ignores this exception silently
            raise switches.LLDPPacket.LLDPUnknownFormat(msg=str(exc)) from None

    switches.LLDPPacket.lldp_packet = staticmethod(lldp_packet)
    switches.LLDPPacket.lldp_parse = staticmethod(lldp_parse)
    # the packet-in flow for LLDP sends this many bytes of each frame to the controller
    switches.Switches.LLDP_PACKET_LEN = len(lldp_packet(0, 0, switches.DONTCARE_STR, 0))
    if not hasattr(switches.Switches.send_lldp_packet, "ryu_send"):
        def send_lldp_packet(self: Any, port: Any) -> None:
            data = self.ports.get(port)
            if data is not None:  # a fresh time in every frame sent (by the latest install)
                data.lldp_data = switches.LLDPPacket.lldp_packet(port.dpid, port.port_no, port.hw_addr, 0)
            send_lldp_packet.ryu_send(self, port)  # type: ignore[attr-defined]

        send_lldp_packet.ryu_send = switches.Switches.send_lldp_packet  # type: ignore[attr-defined]
        switches.Switches.send_lldp_packet = send_lldp_packet
    return signer
