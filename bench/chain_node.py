"""One node of the pipelined-chain baseline (Kascade-style; NCCL's ring broadcast on GPUs):
each receiver takes the file from the node before it over plain TCP, forwards every block
to the next node the moment it arrives, and writes it to disk.

    chain_node.py recv PORT OUT [NEXT_IP:PORT]   # prints "ready", at the end the BLAKE3 hex
    chain_node.py send FILE NEXT_IP:PORT         # the head: the model server

Run by path inside a host namespace (standard library and blake3 only). Start the tail
first: a node connects to its successor before it reports "ready".
"""

from __future__ import annotations

import socket
import sys

import blake3

BLOCK = 1 << 20  # at most this much per receive; whatever arrived is forwarded at once


def _connect(target: str) -> socket.socket:
    host, port = target.rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def relay(src: socket.socket, out_path: str, nxt: socket.socket | None) -> str:
    """Copy ``src`` to ``nxt`` (if any) and to ``out_path`` block by block; the BLAKE3
    hex digest of everything received."""
    h = blake3.blake3()
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    with open(out_path, "wb") as f:
        while True:
            n = src.recv_into(buf)
            if not n:
                break
            if nxt is not None:
                nxt.sendall(view[:n])
            f.write(view[:n])
            h.update(view[:n])
    if nxt is not None:
        nxt.close()  # queued data still goes out, then EOF ends the successor's copy
    return h.hexdigest()


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "send":
        with _connect(argv[2]) as s, open(argv[1], "rb") as f:
            s.sendfile(f)
        return 0
    if len(argv) in (3, 4) and argv[0] == "recv":
        srv = socket.create_server(("0.0.0.0", int(argv[1])))
        nxt = _connect(argv[3]) if len(argv) == 4 else None
        print("ready", flush=True)
        conn, _ = srv.accept()
        srv.close()
        with conn:
            digest = relay(conn, argv[2], nxt)
        print(digest, flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
