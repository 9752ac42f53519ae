"""The secret several controller instances share (``--cluster-secret-file``), and what
it protects once etcd is assumed readable, or writable, by someone who is not the admin:

* the leader record in etcd is signed (HMAC-SHA256), so a follower forwards mutations
  only to a leader whose record an instance wrote (and, with ``--peers``, only to one of
  the listed URLs): a planted leader key gets no request;
* a forwarded request carries an instance credential instead of the caller's token
  (``Authorization`` is never forwarded): an HMAC over the method, path, body, the caller
  the follower authenticated, a time and a nonce, which the leader checks (once, within
  ``WINDOW_S``) before acting as that caller;
* session keys are sealed (AES-256-GCM, the group id as associated data) before they are
  written to the store, so reading etcd, or a snapshot of it, yields no key.

Each use has its own key, derived from the secret with HKDF-SHA256 (``cryptography``);
nothing here is hand-made cryptography. Pure: no I/O but reading the secret file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path
from typing import Mapping

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from controller import settings
from controller.auth import ADMIN, Principal, Unauthorized
from controller.topoview import check_unicast

MIN_SECRET = 32  # bytes of the secret file (e.g. 44 characters of base64 of 32 random bytes)
WINDOW_S = 30.0  # a forwarded request older or newer than this is refused (clocks: NTP)
MAX_NONCES = 1 << 16  # nonces remembered at once (refused beyond: a flood of forwards)
SEALED = "aesgcm:"
CREDENTIAL = "X-Modelcast-Instance"  # milliseconds.nonce.hmac
PRINCIPAL = "X-Modelcast-Principal"  # admin | host 10.0.0.3 | anonymous


class SecretError(ValueError):
    """The secret file cannot be used; one sentence for the start-up error."""


def read_secret(path: Path) -> bytes:
    """The secret: the file's bytes without surrounding whitespace, at least 32."""
    try:
        data = Path(path).read_bytes().strip()
    except OSError as exc:
        raise SecretError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) < MIN_SECRET:
        raise SecretError(f"{path} holds {len(data)} bytes; the cluster secret needs at least "
                          f"{MIN_SECRET} (e.g. head -c 32 /dev/urandom | base64 > {path})")
    return data


def _derive(secret: bytes, label: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label).derive(secret)


def principal_text(who: Principal | None) -> str:
    return "anonymous" if who is None else ("admin" if who.admin else f"host {who.ip}")


def principal_of(text: str) -> Principal | None:
    """The inverse of ``principal_text``; ValueError for anything else."""
    if text == "anonymous":
        return None
    if text == "admin":
        return ADMIN
    kind, _, ip = text.partition(" ")
    if kind != "host" or check_unicast(ip, "host") != ip:
        raise ValueError(f"{text!r:.60} names no caller")
    return Principal(ip=ip)


class Cluster:
    """The shared secret's keys, the allowed peers and the nonces already used."""

    def __init__(self, secret: bytes, peers: tuple[str, ...] = ()) -> None:
        if len(secret) < MIN_SECRET:
            raise SecretError(f"the cluster secret needs at least {MIN_SECRET} bytes")
        self._record_key = _derive(secret, b"modelcast leader record v1")
        self._request_key = _derive(secret, b"modelcast forwarded request v1")
        self._aead = AESGCM(_derive(secret, b"modelcast session keys v1"))
        self.peers = tuple(p.rstrip("/") for p in peers)
        self._nonces: dict[str, float] = {}  # nonce -> wall time it may be forgotten at

    # -- the leader record ---------------------------------------------------------------
    def sign(self, record: bytes) -> str:
        return hmac.new(self._record_key, record, hashlib.sha256).hexdigest()

    def verify(self, record: bytes, signature: str) -> bool:
        return isinstance(signature, str) and hmac.compare_digest(self.sign(record), signature)

    def allowed(self, url: str) -> bool:
        """A leader URL a follower may forward to (any, without ``--peers``)."""
        return not self.peers or url.rstrip("/") in self.peers

    # -- session keys in the store ---------------------------------------------------------
    def seal(self, key_hex: str, gid: int) -> str:
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, bytes.fromhex(key_hex), f"group {gid}".encode())
        return SEALED + base64.b64encode(nonce + sealed).decode()

    def unseal(self, text: str, gid: int) -> str:
        """The hex key; ValueError when it is not sealed with this secret for this group."""
        if not text.startswith(SEALED):
            raise ValueError("not sealed")
        try:
            raw = base64.b64decode(text[len(SEALED):], validate=True)
            return self._aead.decrypt(raw[:12], raw[12:], f"group {gid}".encode()).hex()
        except Exception:  # (InvalidTag, binascii.Error, short input): one answer for all
            raise ValueError("cannot be opened with this cluster secret") from None

    # -- forwarded requests --------------------------------------------------------------------
    def _mac(self, method: str, path: str, body: bytes, who: str, stamp: str, nonce: str) -> str:
        text = "\n".join((method.upper(), path, who, stamp, nonce, hashlib.sha256(body).hexdigest()))
        return hmac.new(self._request_key, text.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()

    def credential(self, method: str, path: str, body: bytes, who: Principal | None,
                   now: float | None = None) -> dict[str, str]:
        """The headers a follower sends with a forwarded request instead of the caller's
        token: the caller it authenticated and this instance's proof."""
        stamp = str(int((time.time() if now is None else now) * 1000))  # (ms: no "." in the header)
        nonce = secrets.token_hex(12)
        text = principal_text(who)
        return {PRINCIPAL: text, CREDENTIAL: f"{stamp}.{nonce}.{self._mac(method, path, body, text, stamp, nonce)}"}

    def check(self, method: str, path: str, body: bytes, headers: Mapping[str, str],
              now: float | None = None) -> Principal | None:
        """The caller a forwarded request acts for, after checking the forwarding
        instance's proof (fresh, used once); Unauthorized otherwise."""
        now = time.time() if now is None else now
        who_text = headers.get(PRINCIPAL) or ""
        stamp, _, rest = (headers.get(CREDENTIAL) or "").partition(".")
        nonce, _, mac = rest.partition(".")
        try:
            when = int(stamp) / 1000
            who = principal_of(who_text)
        except ValueError:
            raise Unauthorized("a forwarded request without a valid instance credential") from None
        if not hmac.compare_digest(self._mac(method, path, body, who_text, stamp, nonce), mac):
            raise Unauthorized("a forwarded request without a valid instance credential")
        if abs(now - when) > WINDOW_S:
            raise Unauthorized(f"a forwarded request stamped {now - when:+.0f} s from now (more than "
                               f"{WINDOW_S:g} s: are the instances' clocks set?)")
        for n, until in list(self._nonces.items())[:64]:  # (oldest first: expire a few each time)
            if until < now:
                del self._nonces[n]
        if nonce in self._nonces or len(self._nonces) >= MAX_NONCES:
            raise Unauthorized("a forwarded request seen before")
        self._nonces[nonce] = when + WINDOW_S
        return who


def from_settings(conf: settings.Settings) -> Cluster | None:
    """The cluster of ``--cluster-secret-file`` and ``--peers`` (None: no secret given)."""
    return Cluster(conf.cluster_secret, conf.peers) if conf.cluster_secret else None
