"""Socket and file glue for the sans-IO state machines (the only module with real I/O).

One small loop drives either endpoint: send what ``datagrams_to_send`` releases (the
sender's token bucket already paces it), sleep until the next datagram or
``get_timer()``, feed what arrives, fire the timer. Mirrors aioquic's asyncio protocol.

Per-byte cost is per-syscall and per-Python-object cost, so both directions batch: a GSO
sender wakes once per ~120 KB of tokens and hands the kernel those datagrams in two
``sendmsg`` calls (segmented on the wire, so a receiver's GRO gets each back as one
super-packet); a receiver reads a GRO super-packet into one reused buffer and hands it
whole to ``Receiver.receive_batch``, which writes its payloads with one ``pwritev``.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Union

import hostagent.native as native
from .common import GROUP
from .wire import MAX_DATAGRAM
from .sender import Sender

if TYPE_CHECKING:
    from .receiver import Receiver  # (not loaded by a send: an endpoint that is no Sender is a Receiver)

IP_ADD_SOURCE_MEMBERSHIP = getattr(socket, "IP_ADD_SOURCE_MEMBERSHIP", 39)  # Linux value
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)
SOCKET_BUFFER = 8 * 1024 * 1024
# A receiver's sockets hold more (the kernel counts it twice: 32 MiB): the hold between its
# reads (``rx_hold``) is a share of it, and longer holds are fewer wake-ups and longer runs.
RECEIVE_BUFFER = 16 * 1024 * 1024
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


# ----------------------------------------------------------------------------- this host's address

ANY = "0.0.0.0"
PROBE_GROUP = "232.0.1.1"  # any SSM address: the route the multicast fabric's datagrams take
_SIOCGIFFLAGS, _SIOCGIFADDR = 0x8913, 0x8915  # linux/sockios.h
_IFF_UP, _IFF_LOOPBACK = 0x1, 0x8


class AddressUnknown(ValueError):
    """This host's address on the fabric cannot be told; ``str()`` names the candidates."""


def route_source(dest: str) -> str:
    """The local address the kernel would send to ``dest`` from (a UDP connect sends
    nothing; it only consults the routing table). OSError names ``dest``."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((dest, 9))
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, f"route to {dest}") from None
        return probe.getsockname()[0]


def local_addresses() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of every interface that is up, loopback included
    (its primary address, as ``SIOCGIFADDR`` reports it)."""
    import fcntl

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            req = struct.pack("16s16x", name.encode()[:15])
            try:
                flags = struct.unpack_from("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req), 16)[0]
                if not flags & _IFF_UP:
                    continue
                addr = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, req)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            found.append((name, addr))
    return found


def own_address(interface: str = ANY, toward: Optional[str] = None, *,
                route: Callable[[str], str] = route_source,
                addresses: Callable[[], list[tuple[str, str]]] = local_addresses) -> str:
    """This host's IPv4 address on the multicast fabric, the one the controller knows it
    by: ``interface`` when given; else the source address of the route towards
    ``toward`` (a receiver's sender) or, failing that, of the multicast route (the
    fabric's, as the routing table says); else the only address this host has. Never a
    loopback address, and never the address the controller happens to be reached from
    (a management network is not the fabric). AddressUnknown, naming the candidates
    and ``--ip``, when it cannot tell."""
    if interface != ANY:
        return interface
    tried = []
    for dest in ([toward] if toward else []) + [PROBE_GROUP]:
        try:
            addr = route(dest)
        except OSError as exc:
            tried.append(f"no route to {dest} ({exc.strerror})")
            continue
        if not ipaddress.IPv4Address(addr).is_loopback:
            return addr
        tried.append(f"the route to {dest} leaves from {addr}")
    candidates = [(name, addr) for name, addr in addresses() if not ipaddress.IPv4Address(addr).is_loopback]
    if len(candidates) == 1:
        return candidates[0][1]
    named = ", ".join(f"{addr} ({name})" for name, addr in candidates) or "none (no interface with IPv4 is up)"
    raise AddressUnknown(f"cannot tell this host's address on the multicast fabric: {'; '.join(tried)}; "
                         f"candidates: {named}; give --ip ADDR (this host's address on the fabric, as the "
                         "controller knows it)")


# ----------------------------------------------------------------------------- files


class FileSource:
    """ChunkSource over a file, or over ``length`` bytes of it from ``offset`` (a lane's
    slice): positional reads, never the whole file in memory.

    The stream reads a datagram's payload at a time, front to back: a read that starts
    where the block read last ended (and is small) reads ``READ_AHEAD`` bytes into one reused buffer,
    and the datagrams after it are sliced from there (one ``preadv`` per ~1 MB instead
    of one ``pread`` per datagram). Any other read (a repair) is read on its own."""

    READ_AHEAD = 1024 * 1024

    def __init__(self, path: str, offset: int = 0, length: Optional[int] = None) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._base = offset
        whole = os.fstat(self._fd).st_size
        self._size = max(0, whole - offset) if length is None else min(length, max(0, whole - offset))
        self._block = memoryview(bytearray(self.READ_AHEAD))
        self._block_at = 0  # the block holds [_block_at, _block_at + _block_len)
        self._block_len = 0

    @property
    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        length = max(0, min(length, self._size - offset))
        at = offset - self._block_at
        if at < 0 or at + length > self._block_len:
            if offset != self._block_at + self._block_len or length * 8 > self.READ_AHEAD:  # (manifest: whole chunks)
                return os.pread(self._fd, length, self._base + offset)
            want = min(self.READ_AHEAD, self._size - offset)
            self._block_at, at = offset, 0
            self._block_len = os.preadv(self._fd, [self._block[:want]], self._base + offset)
            if length > self._block_len:  # the file shrank under us: what is there
                return bytes(self._block[: self._block_len])
        return bytes(self._block[at : at + length])

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "FileSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RecordWriter:
    """Makes resume records durable off the receive loop: for the latest record handed
    over, ``fdatasync`` the data file (everything the record claims was written before it
    was handed over), then write the record to a temporary file, fsync it, rename it over
    the old one and fsync the directory. A crash at any point leaves the old record or
    the new one, each claiming only data already on disk. Records handed over while one
    is being written collapse into the newest."""

    def __init__(self, data_fd: int, data_path: str, path: str,
                 sync: Optional[Callable[[], None]] = None) -> None:
        self._fd = data_fd
        self._sync = sync  # makes the data durable instead of fdatasync(data_fd) (a directory's files)
        self._data_path = data_path
        self._path = path
        self._pending: Optional[bytes] = None
        self._busy = False
        self._closed = False
        self._cond = threading.Condition()
        self.error: Optional[OSError] = None  # the first failure, with the path it hit
        self.saves = 0
        self.sync_s = 0.0  # time spent making records durable (in this thread)
        self._thread = threading.Thread(target=self._run, name="modelcast-record", daemon=True)
        self._thread.start()

    def submit(self, state: bytes) -> None:
        with self._cond:
            self._pending = state
            self._cond.notify()

    def flush(self) -> None:
        """Wait until every record handed over is written (or failed)."""
        with self._cond:
            while self._pending is not None or self._busy:
                self._cond.wait()

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                state, self._pending, self._busy = self._pending, None, True
            started = time.perf_counter()
            try:
                self._write(state)
            except OSError as exc:
                if self.error is None:
                    self.error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self.saves += 1
                    self.sync_s += time.perf_counter() - started
                    self._cond.notify_all()

    def _write(self, state: bytes) -> None:
        try:
            if self._sync is not None:
                self._sync()
            else:
                os.fdatasync(self._fd)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self._data_path) from None
        # A temporary of its own name, created O_EXCL|O_NOFOLLOW: nothing planted beside
        # the record (a symlink, another user's file) is followed, truncated or reused.
        tmp = f"{self._path}.{os.urandom(6).hex()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, state)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self._path)
            dirfd = os.open(os.path.dirname(os.path.abspath(self._path)), os.O_RDONLY)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)
        except OSError as exc:
            try:
                os.unlink(tmp)  # a half-written temporary (disk full) only takes space
            except OSError:
                pass
            raise OSError(exc.errno, exc.strerror, self._path) from None


def pwritev_all(fd: int, parts: list[memoryview], offset: int, path: str) -> None:
    """Consecutive pieces at ``offset`` in one ``pwritev``, finishing a short write (disk
    full then shows as an error on the retry); errors name ``path``."""
    want = sum(map(len, parts))
    try:
        done = os.pwritev(fd, parts, offset)
        if done < want:
            blob = b"".join(parts)
            while done < want:
                done += os.pwrite(fd, blob[done:], offset + done)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, path) from None


class FileSink:
    """ChunkSink over a file plus a resume record next to it (``PATH.modelcast-state``),
    made durable after the data it claims (``_RecordWriter``). I/O errors name the path.

    A lane of a striped transfer (``hostagent.lanes``) writes its slice: offsets are
    relative to ``base`` (set from the lane's manifest), the resume record is the lane's
    own, and ``finish`` leaves trimming the file to whoever knows its whole size."""

    def __init__(self, path: str, state_path: Optional[str] = None, trim: bool = True) -> None:
        self.path = path
        self.state_path = state_path or path + STATE_SUFFIX
        self.base = 0
        self._trim = trim
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._records = _RecordWriter(self._fd, path, self.state_path)
        self._buf = bytearray()  # read_view's

    def set_base(self, base: int) -> None:
        self.base = base

    def write(self, offset: int, data: bytes | memoryview) -> None:
        try:
            os.pwrite(self._fd, data, self.base + offset)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, self.path) from None

    def write_many(self, offset: int, parts: list[memoryview]) -> None:
        """Consecutive pieces (a GRO batch's payloads) in one ``pwritev``."""
        pwritev_all(self._fd, parts, self.base + offset, self.path)

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, self.base + offset)

    def read_view(self, offset: int, length: int) -> memoryview:
        """Like ``read``, into one reused buffer: valid until the next call."""
        if len(self._buf) < length:
            self._buf = bytearray(length)
        got = os.preadv(self._fd, [memoryview(self._buf)[:length]], self.base + offset)
        return memoryview(self._buf)[:got]

    def save_state(self, state: bytes) -> None:
        """Hand the record to the writer thread; a failure it hit (ENOSPC writing the
        record) is raised here, with its path."""
        if self._records.error is not None:
            raise self._records.error
        self._records.submit(state)

    @property
    def record_stats(self) -> tuple[int, float]:
        """(records written, seconds spent making them durable, off the receive loop)."""
        return self._records.saves, self._records.sync_s

    def load_state(self) -> Optional[bytes]:
        self._records.flush()  # what was handed over is what a restart would read
        try:
            with open(self.state_path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def finish(self, size: int) -> None:
        """Trim stale bytes from an older, longer file (not a lane's: the file is not
        all its own) and drop the resume record."""
        self._records.close()
        if self._trim:
            os.ftruncate(self._fd, self.base + size)
        os.fsync(self._fd)
        try:
            os.unlink(self.state_path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Write the last record handed over (a failure now keeps the previous one)."""
        self._records.close()
        os.close(self._fd)


# ----------------------------------------------------------------------------- sockets


def _grow_buffer(sock: socket.socket, force: int, normal: int, size: int = SOCKET_BUFFER) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)  # root: beyond rmem_max
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, normal, size)


IP_MTU = 14  # Linux getsockopt: the path MTU of a connected socket's route


def path_mtu(group: str, port: int, interface: str = "0.0.0.0") -> int:
    """MTU of the route the group's datagrams take (the interface's, for multicast), so a
    datagram fills a frame: 1500 gives ~1.4 KB payloads, a 9000-byte jumbo fabric ~8.9 KB,
    and six times fewer packets for every switch and receiver to handle."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            if interface != "0.0.0.0":
                s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
            s.connect((group, port))
        except OSError as exc:  # ENETUNREACH: no multicast route (and no default one)
            hint = " (no multicast route: add one, e.g. ip route add 224.0.0.0/4 dev IFACE, or give --interface)"
            raise OSError(exc.errno, exc.strerror, _via(f"route to {group}", interface)
                          + (hint if exc.errno == errno.ENETUNREACH else "")) from None
        try:
            return int(s.getsockopt(socket.IPPROTO_IP, IP_MTU))
        except OSError:
            return 1500


def sender_socket(interface: str = "0.0.0.0", ttl: int = 1) -> socket.socket:
    """Unicast-bound socket that also sends to the group (NACKs come back to it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    _grow_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF)
    _grow_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
    try:
        if interface != "0.0.0.0":
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(interface))
        sock.bind((interface, 0))
    except OSError as exc:  # EADDRNOTAVAIL: not an address of this host
        sock.close()
        raise OSError(exc.errno, exc.strerror, f"sending from {interface}") from None
    sock.setblocking(False)
    return sock


def receiver_sockets(group: str, port: int, source: str, interface: str = "0.0.0.0") -> tuple[socket.socket, socket.socket]:
    """(group socket joined with SSM to ``source``, unicast socket for NACKs/repairs)."""
    mc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    uc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    step = f"listening on {group}:{port}"
    try:
        mc.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _grow_buffer(mc, SO_RCVBUFFORCE, socket.SO_RCVBUF, RECEIVE_BUFFER)
        mc.bind((group, port))
        # struct ip_mreq_source: group, interface, source
        step = _via(f"joining {group} from source {source}", interface)  # ENODEV: no multicast route
        mreq = struct.pack("4s4s4s", socket.inet_aton(group), socket.inet_aton(interface), socket.inet_aton(source))
        mc.setsockopt(socket.IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP, mreq)
        mc.setblocking(False)
        step = f"receiving on {interface}"
        _grow_buffer(uc, SO_RCVBUFFORCE, socket.SO_RCVBUF, RECEIVE_BUFFER)
        uc.bind((interface, 0))
        uc.setblocking(False)
    except OSError as exc:
        mc.close()
        uc.close()
        raise OSError(exc.errno, exc.strerror, step) from None
    return mc, uc


def _via(what: str, interface: str) -> str:
    return what if interface == "0.0.0.0" else f"{what} via {interface}"


# ----------------------------------------------------------------------------- GSO / GRO

SOL_UDP = 17
UDP_SEGMENT = 103  # linux/udp.h: per-send segment size (GSO)
UDP_GRO = 104  # linux/udp.h: coalesce on receive, segment size in a cmsg
_MAX_READ = 65535  # the largest UDP datagram, and GRO super-packet, one read returns
# The most a receiver's reader joins into one run (``DatagramReader``): a 1 MiB chunk's
# datagrams; a run never crosses a chunk's end anyway (its last datagram is shorter).
JOIN_BYTES = 1 << 20
GSO_MAX_SEGMENTS = 64  # kernel limit is 64 (older) or 128; stay at the lower
_GRO_CMSG = struct.Struct("=i")
_GSO_CMSG = struct.Struct("=H")


def enable_gro(sock: socket.socket) -> bool:
    """Ask the kernel to coalesce same-flow datagrams; False where unsupported."""
    try:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        return True
    except OSError:
        return False


@dataclass
class LoopStats:
    """What the socket layer did (for the benchmark and the JSON summary)."""

    gso: bool = False
    gso_sends: int = 0  # sendmsg calls that carried more than one datagram
    gso_datagrams: int = 0
    plain_sends: int = 0
    send_drops: int = 0  # kernel send buffer full
    gro: bool = False
    gro_batches: int = 0  # reads that returned more than one datagram
    coalesced: int = 0  # runs joined from more than one read, handed on as one (DatagramReader)
    reads: int = 0
    read_bytes: int = 0


class DatagramWriter:
    """Send a batch of (datagram, dest): with GSO, runs of equal-sized datagrams to the
    same destination go out in one ``sendmsg`` (the kernel or NIC segments them), which
    cuts the per-datagram syscall cost that bounds a Python sender. Falls back to one
    ``sendto`` per datagram, for good, the first time the kernel refuses GSO."""

    def __init__(self, sock: socket.socket, group: tuple[str, int], gso: bool, stats: LoopStats) -> None:
        self._sock = sock
        self._group = group
        self._stats = stats
        stats.gso = gso

    def send(self, items: list[tuple[bytes, object]]) -> None:
        stats, i, n = self._stats, 0, len(items)
        while i < n:
            data, dest = items[i]
            addr = self._group if dest == GROUP else dest
            j = i + 1
            if stats.gso:
                size, total = len(data), len(data)
                while j < n and j - i < GSO_MAX_SEGMENTS:
                    nxt, nxt_dest = items[j]
                    if (self._group if nxt_dest == GROUP else nxt_dest) != addr or len(nxt) > size:
                        break
                    if total + len(nxt) > MAX_DATAGRAM:
                        break
                    total += len(nxt)
                    j += 1
                    if len(nxt) < size:  # only the last segment may be shorter
                        break
            if j - i > 1 and self._send_gso([d for d, _ in items[i:j]], len(data), addr):
                i = j
                continue
            for k in range(i, j):
                self._send_one(items[k][0], addr)
            i = j

    def _send_gso(self, chunk: list[bytes], size: int, addr: object) -> bool:
        try:
            self._sock.sendmsg([b"".join(chunk)], [(SOL_UDP, UDP_SEGMENT, _GSO_CMSG.pack(size))], 0, addr)
        except (BlockingIOError, InterruptedError):
            self._stats.send_drops += len(chunk)
            return True
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:  # a full queue, not a missing feature
                self._stats.send_drops += len(chunk)
                return True
            self._stats.gso = False  # EIO/EINVAL/ENOPROTOOPT: no GSO on this path
            return False
        self._stats.gso_sends += 1
        self._stats.gso_datagrams += len(chunk)
        return True

    def _send_one(self, data: bytes, addr: object) -> None:
        try:
            self._sock.sendto(data, addr)
            self._stats.plain_sends += 1
        except (BlockingIOError, InterruptedError):
            self._stats.send_drops += 1  # same as a lost datagram: repair covers it
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:  # ENETUNREACH, EHOSTUNREACH...: name where it went
                host, port = addr  # type: ignore[misc]
                raise OSError(exc.errno, exc.strerror, f"sending to {host}:{port}") from None
            self._stats.send_drops += 1


class DatagramReader:
    """Drain a non-blocking socket into one reused buffer; with GRO, one read returns a
    super-packet of several datagrams, split here by the segment size from the control
    message. Each datagram reaches the endpoint as a view into the buffer (no bytes
    object per datagram), delivered before the next read overwrites it.

    With ``coalesce`` (the receiver), what is already queued is joined into runs before
    it is handed on: reads from one source whose datagrams have the run's size --
    datagrams read one by one (no GRO, as behind userspace Open vSwitch, which segments
    every GSO batch) or whole GRO super-packets -- are put back to back in the buffer
    while every datagram so far had that size (a shorter one ends the run, as in GRO)
    and handed on as one super-packet of up to ``JOIN_BYTES``. The receiver's run path
    (one tag loop, one vectored write, one digest update, one range insert) then costs
    its Python once per run of a chunk instead of once per 64 KB read. Only datagrams
    already queued are joined (a read that would block ends the run), so nothing waits."""

    def __init__(self, sock: socket.socket, gro: bool, stats: LoopStats, coalesce: bool = False,
                 read_in_c: bool = True) -> None:
        self.sock = sock
        self.gro = gro and enable_gro(sock)
        stats.gro = stats.gro or self.gro
        self._stats = stats
        self._coalesce = coalesce
        self._buf = bytearray(JOIN_BYTES + _MAX_READ if coalesce else _MAX_READ)
        self._view = memoryview(self._buf)
        self._anc = socket.CMSG_SPACE(_GRO_CMSG.size)
        # the coalescing loop in C (the same runs, no Python per read) for IPv4 sockets
        self._read_runs = (native.module.read_runs if coalesce and native.NATIVE and read_in_c
                           and sock.family == socket.AF_INET else None)

    def read(self, limit: int, deliver: Callable[[memoryview, int, object, float], None],
             clock: Callable[[], float]) -> int:
        """Up to ``limit`` reads, each handed to ``deliver(view, seg, addr, now)``: a
        super-packet of ``seg``-byte datagrams, or one datagram (``seg`` 0); returns
        the number of reads (0: nothing was waiting)."""
        if self._read_runs is not None:
            return self._read_c(limit, deliver, clock)
        sock, view, stats, coalesce = self.sock, self._view, self._stats, self._coalesce
        reads = 0
        # The run being joined: view[start:end], ``count`` datagrams of ``size`` bytes
        # (the last may be shorter, which closes it) from ``src``, taken in ``joined`` reads.
        start = end = size = count = joined = 0
        src: object = None
        now = 0.0
        while reads < limit:
            if end + _MAX_READ > len(view):  # (coalescing only) no room for one more read
                if count:
                    self._flush(view, start, end, size, count, joined, src, now, deliver)
                start = end = count = 0
            try:
                if self.gro:
                    nbytes, anc, _flags, addr = sock.recvmsg_into([view[end:]], self._anc)
                else:
                    nbytes, addr = sock.recvfrom_into(view[end:])
                    anc = ()
            except (BlockingIOError, InterruptedError):
                break
            reads += 1
            now = clock()
            stats.reads += 1
            stats.read_bytes += nbytes
            seg = 0
            for level, kind, value in anc:
                if level == SOL_UDP and kind == UDP_GRO and len(value) >= _GRO_CMSG.size:
                    seg = _GRO_CMSG.unpack_from(value)[0]
            if seg <= 0 or seg >= nbytes:
                seg = 0
            else:
                stats.gro_batches += 1
            if not coalesce:
                deliver(view[:nbytes], seg, addr, now)
                continue
            if not nbytes:  # nothing to join: the run first, then the empty datagram alone
                if count:
                    self._flush(view, start, end, size, count, joined, src, now, deliver)
                    start, count = end, 0
                deliver(view[end:end], 0, addr, now)
                continue
            # this read: datagrams of ``width`` bytes, all of them that size (``whole``) or not
            width = seg or nbytes
            whole = nbytes % width == 0
            if (count and addr == src and end + nbytes - start <= JOIN_BYTES
                    and (width == size if seg else nbytes <= size)):
                end += nbytes
                count += -(-nbytes // width)
                joined += 1
                if not whole or nbytes < size:  # a shorter datagram ends the run, as in GRO
                    self._flush(view, start, end, size, count, joined, src, now, deliver)
                    start, count = end, 0
                continue
            if count:  # this one does not extend the run: the run first, in arrival order
                self._flush(view, start, end, size, count, joined, src, now, deliver)
            start, size, count, joined, src = end, width, -(-nbytes // width), 1, addr
            end += nbytes
            if not whole:  # (a super-packet ending in a shorter datagram: complete already)
                self._flush(view, start, end, size, count, joined, src, now, deliver)
                start, count = end, 0
        if count:
            self._flush(view, start, end, size, count, joined, src, now, deliver)
        return reads

    def _read_c(self, limit: int, deliver: Callable[[memoryview, int, object, float], None],
                clock: Callable[[], float]) -> int:
        """``read`` with the loop in C (``_fastrun.read_runs``): up to a buffer's worth of
        reads at a time, its runs handed on before the buffer is reused."""
        view, stats, fd, buf, gro = self._view, self._stats, self.sock.fileno(), self._buf, self.gro
        reads = 0
        while reads < limit:
            runs, n, nbytes, batches, coalesced, drained = self._read_runs(fd, buf, limit - reads, JOIN_BYTES, gro)
            reads += n
            stats.reads += n
            stats.read_bytes += nbytes
            stats.gro_batches += batches
            stats.coalesced += coalesced
            now = clock()
            for start, end, seg, src in runs:
                deliver(view[start:end], seg, src, now)
            if drained or not n:
                break
        return reads

    def _flush(self, view: memoryview, start: int, end: int, size: int, count: int, joined: int, src: object,
               now: float, deliver: Callable[[memoryview, int, object, float], None]) -> None:
        if joined > 1:
            self._stats.coalesced += 1
        deliver(view[start:end], size if count > 1 else 0, src, now)


# ----------------------------------------------------------------------------- loop

Endpoint = Union[Sender, "Receiver"]

# epoll's timeout has millisecond resolution (Python rounds up): shorter waits sleep
# with nanosleep instead, or a sub-millisecond pacing interval would stretch to 1 ms.
_EPOLL_RESOLUTION = 0.002
# The tokens a GSO sender waits for between wake-ups -- two full GSO sends back to back,
# which receivers mostly take in one wake-up too: half the wake-ups (CPU) of one send per
# wake-up -- and its token bucket depth (hostagent.api sets the sender's burst_bytes to
# it), with room for a wake-up ~1 ms late at 1 Gbit/s without losing tokens. Measured on
# the 1 Gbit/s jumbo lab: 60 KB per wake-up cost senders and receivers ~15% more CPU per
# GB. Bursts of this size are nothing to an 8 MB receive buffer or a switch port.
GSO_BURST_BYTES = 256 * 1024
GSO_BATCH_BYTES = 120_000
# The bucket holds at most this long of sending at the cap: a sender woken late (CPU
# contention) then bursts no more than a switch with small queues forwards at once
# (userspace OVS at 200 Mbit/s dropped 256 KB bursts; 2 ms is what the 1 Gbit/s case needs).
GSO_BURST_SECONDS = 0.002
# Never hold sends back longer than this to fill a batch. Below ~200 Mbit/s this, not
# GSO_BATCH_BYTES, sets how often a sender wakes up, and on a VM each wake-up costs
# ~0.3 ms of CPU (35-55 us in the kernel before any Python): 32 MB at 100 Mbit/s cost a
# sender 0.60-0.66 CPU-s at 2 ms (~500 wake-ups a second), 0.40-0.46 at 5 ms.
GSO_MAX_WAIT = 0.005


def gso_segments(max_datagram: int) -> int:
    """Datagrams of ``max_datagram`` bytes one GSO send carries (``DatagramWriter``)."""
    return max(1, min(GSO_MAX_SEGMENTS, MAX_DATAGRAM // max_datagram))


def gso_burst_bytes(cap_bps: float, floor: int = 64 * 1024) -> int:
    """Token bucket depth for a GSO sender capped at ``cap_bps``: ``GSO_BURST_SECONDS``
    of sending and two of the batches it waits for (``batch_interval``: a wake-up a little
    late then loses no tokens), at least ``floor`` (the non-GSO default) and at most
    ``GSO_BURST_BYTES``."""
    batch = min(GSO_BATCH_BYTES, cap_bps * GSO_MAX_WAIT / 8)
    return int(max(floor, min(GSO_BURST_BYTES, max(cap_bps * GSO_BURST_SECONDS / 8, 2 * batch))))


# After a read that found data, a receiver sleeps up to this long before it reads again
# (its timers still fire on time), so that a wake-up takes what arrived meanwhile in a few
# runs: on a VM each wake-up costs ~0.3 ms of CPU, and a receiver behind a link that
# paces the stream (100 Mbit/s) woke every ~3 datagrams -- 32 MB cost it 0.60-0.68
# CPU-s, 0.41-0.44 with the hold, in the same time. The hold is bounded so that what
# arrives meanwhile fills at most 1/64 of the socket's receive buffer at the rate seen
# (with an eighth of a 16 MiB buffer, 16 ms, four receivers on 2 cores overflowed their
# queues once in three runs: a 17 s transfer with 65% repairs): at 1 Gbit/s, 4 ms of a
# root receiver's 32 MiB (``RECEIVE_BUFFER``). Measured on the agent bench's lab (N = 4,
# 256 MB, alternated, 6 runs each): 2 ms (8 MiB) 2.34 s and 2.51 CPU-s/GB per receiver,
# 4 ms 2.33 s and 2.28, 8 ms 2.36-2.39 s and 2.14-2.23 -- there the four receivers' larger
# bursts start to take the CPU from the sender they share it with. A non-root receiver,
# whose buffer is small, barely holds. Nor does a receiver hold past the end of the
# stream it expects (``Receiver.bytes_to_come``): the last bytes are not left waiting.
RX_HOLD = 0.02
RX_HOLD_BUFFER_SHARE = 1 / 64


def rx_hold(rate_bytes_s: float, rcvbuf: int) -> float:
    """How long a receiver may let its socket queue fill at ``rate_bytes_s``."""
    if rate_bytes_s <= 0:
        return 0.0
    return min(RX_HOLD, rcvbuf * RX_HOLD_BUFFER_SHARE / rate_bytes_s)


def batch_interval(endpoint: Endpoint, gso: bool) -> float:
    """How long a GSO sender lets its token bucket fill between wake-ups: about
    ``GSO_BATCH_BYTES`` at the current rate, so each wake-up sends a few ``sendmsg`` of
    many datagrams instead of one datagram per wake-up. The bucket's depth (the
    sender's ``burst_bytes``) still bounds every burst, which is what keeps receivers'
    socket buffers and switch queues from overrunning; at low rates the wait is capped
    and batches get smaller."""
    if not gso or not isinstance(endpoint, Sender):
        return 0.0
    return min(GSO_MAX_WAIT, GSO_BATCH_BYTES * 8 / endpoint.rate)


def _per_datagram(receive: Callable[[memoryview, object, float], None]
                  ) -> Callable[[memoryview, int, object, float], None]:
    """A reader's delivery for endpoints without a batch path: one call per datagram."""

    def deliver(view: memoryview, seg: int, addr: object, now: float) -> None:
        if seg <= 0:
            receive(view, addr, now)
            return
        for off in range(0, len(view), seg):
            receive(view[off : off + seg], addr, now)

    return deliver


def run(
    endpoint: Endpoint,
    send_sock: socket.socket,
    recv_socks: list[socket.socket],
    group: tuple[str, int],
    on_event: Callable[[object], None],
    should_stop: Callable[[], bool],
    clock: Callable[[], float] = time.monotonic,
    gso: bool = True,
    gro: bool = True,
) -> LoopStats:
    """Drive ``endpoint`` until ``should_stop()``; all protocol decisions stay in it."""
    stats = LoopStats()
    writer = DatagramWriter(send_sock, group, gso, stats)
    selector = selectors.DefaultSelector()
    holds = not isinstance(endpoint, Sender)  # (a receiver coalesces its reads and holds between them)
    for sock in recv_socks:
        selector.register(sock, selectors.EVENT_READ, DatagramReader(sock, gro, stats, coalesce=holds))
    # The receiver takes a GRO super-packet whole (its batch path); the sender gets the
    # few datagrams receivers send it one by one.
    deliver = _per_datagram(endpoint.receive_datagram) if isinstance(endpoint, Sender) else endpoint.receive_batch
    last_send = -1e18
    # A receiver's hold (RX_HOLD) runs from its last read with data, at the arrival rate
    # seen -- a decaying maximum, so that a pause in the stream does not lengthen the
    # hold the moment it resumes; unknown at first: assumed fast, the hold short.
    rcvbuf = min((s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for s in recv_socks), default=0) if holds else 0
    read_at, read_bytes, arrival, hold = -1e18, 0, 10e9 / 8, 0.0
    try:
        while True:
            now = clock()
            out = endpoint.datagrams_to_send(now)
            if out:
                drops = stats.send_drops
                writer.send(out)
                last_send = now
                if stats.send_drops > drops and isinstance(endpoint, Sender):
                    endpoint.send_dropped(stats.send_drops - drops, now)  # its own link is full
            while (event := endpoint.next_event()) is not None:
                on_event(event)
            if should_stop():
                return stats
            timer = endpoint.get_timer()
            now = clock()
            wait = 0.5 if timer is None else min(0.5, max(0.0, timer - now))
            if wait < 0.5:
                wait = max(wait, last_send + batch_interval(endpoint, stats.gso) - now)
            held = min(wait, read_at + hold - now)
            if held > 0:  # a receiver lets the stream queue up (its timers are not held)
                time.sleep(held)
                wait -= held
            if wait >= _EPOLL_RESOLUTION:
                ready = selector.select(wait)
            else:  # sub-millisecond: nanosleep, then poll
                if wait > 0:
                    time.sleep(wait)
                ready = selector.select(0)
            for key, _ in ready:
                key.data.read(256, deliver, clock)
            if holds and stats.read_bytes > read_bytes:
                now = clock()
                arrival = max((stats.read_bytes - read_bytes) / max(now - read_at, 1e-4), 0.9 * arrival)
                read_at, read_bytes = now, stats.read_bytes
                hold = min(rx_hold(arrival, rcvbuf), endpoint.bytes_to_come / arrival)  # type: ignore[union-attr]
            timer = endpoint.get_timer()
            now = clock()
            if timer is not None and now >= timer:
                endpoint.handle_timer(now)
    finally:
        selector.close()
