"""Socket and file glue for the sans-IO state machines (the only module with real I/O).

One small loop drives either endpoint: send what ``datagrams_to_send`` releases (the
sender's token bucket already paces it), sleep until the next datagram or
``get_timer()``, feed what arrives, fire the timer. Mirrors aioquic's asyncio protocol.
"""

from __future__ import annotations

import ipaddress
import os
import selectors
import socket
import struct
import time
from typing import Callable, Optional, Union

from .common import GROUP
from .receiver import Receiver
from .sender import Sender

IP_ADD_SOURCE_MEMBERSHIP = getattr(socket, "IP_ADD_SOURCE_MEMBERSHIP", 39)  # Linux value
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SOCKET_BUFFER = 8 * 1024 * 1024
STATE_SUFFIX = ".modelcast-state"


def parse_group(text: str) -> tuple[str, int]:
    """'ADDR:PORT' -> (addr, port); the address must be IPv4 multicast."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"expected ADDR:PORT, got {text!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {text!r}")
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"not an IPv4 address: {host!r}") from None
    if not addr.is_multicast:
        raise ValueError(f"{host} is not a multicast address")
    return str(addr), port


def parse_ipv4(text: str) -> str:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise ValueError(f"not an IPv4 address: {text!r}") from None


# ----------------------------------------------------------------------------- files


class FileSource:
    """ChunkSource over a file: positional reads, never the whole file in memory."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        os.close(self._fd)


class FileSink:
    """ChunkSink over a file plus a resume record next to it (``PATH.modelcast-state``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.state_path = path + STATE_SUFFIX
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def save_state(self, state: bytes) -> None:
        tmp = self.state_path + ".tmp"
        with open(tmp, "wb") as handle:
            handle.write(state)
        os.replace(tmp, self.state_path)

    def load_state(self) -> Optional[bytes]:
        try:
            with open(self.state_path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def finish(self, size: int) -> None:
        """Trim stale bytes from an older, longer file and drop the resume record."""
        os.ftruncate(self._fd, size)
        os.fsync(self._fd)
        try:
            os.unlink(self.state_path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        os.close(self._fd)


# ----------------------------------------------------------------------------- sockets


def _grow_buffer(sock: socket.socket, force: int, normal: int) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)  # root: beyond rmem_max
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, normal, SOCKET_BUFFER)


def sender_socket(interface: str = "0.0.0.0", ttl: int = 1) -> socket.socket:
    """Unicast-bound socket that also sends to the group (NACKs come back to it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _grow_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF)
    _grow_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    if interface != "0.0.0.0":
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
    sock.bind((interface, 0))
    sock.setblocking(False)
    return sock


def receiver_sockets(group: str, port: int, source: str, interface: str = "0.0.0.0") -> tuple[socket.socket, socket.socket]:
    """(group socket joined with SSM to ``source``, unicast socket for NACKs/repairs)."""
    mc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    mc.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _grow_buffer(mc, SO_RCVBUFFORCE, socket.SO_RCVBUF)
    mc.bind((group, port))
    # struct ip_mreq_source: group, interface, source
    mreq = struct.pack("4s4s4s", socket.inet_aton(group), socket.inet_aton(interface), socket.inet_aton(source))
    mc.setsockopt(socket.IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP, mreq)
    mc.setblocking(False)
    uc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _grow_buffer(uc, SO_RCVBUFFORCE, socket.SO_RCVBUF)
    uc.bind((interface, 0))
    uc.setblocking(False)
    return mc, uc


# ----------------------------------------------------------------------------- loop

Endpoint = Union[Sender, Receiver]


def run(
    endpoint: Endpoint,
    send_sock: socket.socket,
    recv_socks: list[socket.socket],
    group: tuple[str, int],
    on_event: Callable[[object], None],
    should_stop: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Drive ``endpoint`` until ``should_stop()``; all protocol decisions stay in it."""
    selector = selectors.DefaultSelector()
    for sock in recv_socks:
        selector.register(sock, selectors.EVENT_READ)
    try:
        while True:
            now = clock()
            for data, dest in endpoint.datagrams_to_send(now):
                try:
                    send_sock.sendto(data, group if dest == GROUP else dest)
                except (BlockingIOError, InterruptedError):
                    pass  # kernel buffer full: same as a lost datagram, repair covers it
            while (event := endpoint.next_event()) is not None:
                on_event(event)
            if should_stop():
                return
            timer = endpoint.get_timer()
            timeout = 0.5 if timer is None else min(0.5, max(0.0, timer - clock()))
            for key, _ in selector.select(timeout):
                sock = key.fileobj
                for _ in range(256):
                    try:
                        data, addr = sock.recvfrom(65535)  # type: ignore[union-attr]
                    except (BlockingIOError, InterruptedError):
                        break
                    endpoint.receive_datagram(data, addr, clock())
            timer = endpoint.get_timer()
            now = clock()
            if timer is not None and now >= timer:
                endpoint.handle_timer(now)
    finally:
        selector.close()
