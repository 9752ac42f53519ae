"""Who is calling, and what each caller may do and see (pure: no I/O but reading the
host-token file at start).

The credential model (docs/rest.md):

* the **admin token** (``--token``) may do everything and sees every group's key;
* a **host token** (``--host-tokens FILE``, a JSON object ``{"10.0.0.3": "<token>"}``)
  speaks for that one host address: it may create-or-look-up groups (only naming itself
  as a receiver, unless it is the group's source), join and leave *itself*, delete or
  rekey the groups it is the source of, and it sees the key only of groups it is the
  source or a receiver of -- so a receiver gets its key in its own join's response;
* a call **without a token** is anonymous: it reads groups and topology, never a key,
  and changes nothing -- unless no token at all is configured, which the entry point
  allows only with REST on loopback (then local callers may change groups, and still
  see no key: there is no credential to hand one to).

Tokens are compared by SHA-256 digest (a dict lookup on the digest reveals nothing useful
through timing about the token) and the admin token in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from controller.errors import CoreError

MIN_TOKEN_LEN = 16  # host tokens: long enough not to be guessed over REST


class Unauthorized(CoreError):
    """No valid bearer token where one is needed, or a token that is not valid."""

    status = 401


class Forbidden(CoreError):
    """A valid token that does not cover this call (a host token acting for another)."""

    status = 403


class CredentialsError(ValueError):
    """The host-token file cannot be used; one sentence for the start-up error."""


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: the admin, or the host whose token it presented."""

    admin: bool = False
    ip: str | None = None

    def __str__(self) -> str:
        return "admin" if self.admin else f"host {self.ip}"


ADMIN = Principal(admin=True)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


class Credentials:
    """The admin token and the host tokens; ``authenticate`` turns an Authorization
    header into a Principal (None: anonymous)."""

    def __init__(self, admin_token: str | None = None, host_tokens: dict[str, str] | None = None) -> None:
        self.admin_token = admin_token or None
        self._hosts: dict[bytes, str] = {}
        for ip, token in (host_tokens or {}).items():
            self._hosts[_digest(token)] = ip

    @property
    def open(self) -> bool:
        """No credential configured: anonymous callers may change groups (loopback only,
        enforced by the entry point)."""
        return self.admin_token is None and not self._hosts

    def hosts(self) -> list[str]:
        return sorted(self._hosts.values(), key=lambda ip: ipaddress.IPv4Address(ip))

    def authenticate(self, header: str | None) -> Principal | None:
        """None for no header; Unauthorized for a header that is not ``Bearer <a known
        token>`` (a wrong token is an error on every call, so a client learns at once)."""
        if not header:
            return None
        scheme, _, given = header.strip().partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            raise Unauthorized("the Authorization header must be 'Bearer <token>'")
        raw = given.encode("utf-8", "surrogateescape")
        if self.admin_token is not None and hmac.compare_digest(raw, self.admin_token.encode("utf-8")):
            return ADMIN
        ip = self._hosts.get(_digest(given))
        if ip is not None:
            return Principal(ip=ip)
        raise Unauthorized("the bearer token is not valid")

    def require(self, who: Principal | None) -> Principal | None:
        """A mutating call: a principal, or anonymous only when nothing is configured."""
        if who is None and not self.open:
            raise Unauthorized("this call needs an 'Authorization: Bearer <token>' header")
        return who


# -- what a principal may do ---------------------------------------------------------------
def may_see_key(who: Principal | None, source: str, receivers: Iterable[str]) -> bool:
    """The admin, the group's source and its receivers; never an anonymous caller."""
    if who is None:
        return False
    return who.admin or who.ip == source or who.ip in set(receivers)


def check_create(who: Principal | None, source: str, receivers: Iterable[str]) -> None:
    """A host may create-or-look-up any (model, source) group -- a receiver starting
    before its sender does -- but name only itself as a receiver unless it is the source."""
    if who is None or who.admin or who.ip == source:
        return
    others = sorted(set(receivers) - {who.ip})
    if others:
        raise Forbidden(f"a host token for {who.ip} cannot add other receivers ({others[0]})")


def check_self(who: Principal | None, ip: str) -> None:
    """Join and leave: a host acts only for itself."""
    if who is not None and not who.admin and who.ip != ip:
        raise Forbidden(f"a host token for {who.ip} cannot join or leave {ip}")


def check_source(who: Principal | None, source: str, what: str) -> None:
    """Delete and rekey: the admin or the group's source."""
    if who is not None and not who.admin and who.ip != source:
        raise Forbidden(f"only the admin or the group's source ({source}) may {what}")


def check_admin(who: Principal | None, what: str) -> None:
    if who is not None and not who.admin:
        raise Forbidden(f"only the admin token may {what}")


def load_host_tokens(path: Path, admin_token: str | None = None) -> dict[str, str]:
    """``{"ip": "token", ...}`` from a JSON file; every problem is one sentence."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CredentialsError(f"cannot read host-token file {path}: {exc.strerror}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CredentialsError(f"host-token file {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CredentialsError(f"host-token file {path} must hold an object {{\"10.0.0.3\": \"<token>\"}}")
    out: dict[str, str] = {}
    seen: set[str] = set()
    for ip, token in data.items():
        try:
            addr = ipaddress.IPv4Address(ip)
        except ValueError:
            raise CredentialsError(f"host-token file {path}: {ip!r} is not an IPv4 address") from None
        if addr.is_multicast or addr.is_unspecified or addr.is_loopback:
            raise CredentialsError(f"host-token file {path}: {ip} is not a host address")
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LEN or token != token.strip():
            raise CredentialsError(f"host-token file {path}: the token of {ip} must be a string of at "
                                   f"least {MIN_TOKEN_LEN} characters without surrounding spaces")
        if token in seen or token == admin_token:
            raise CredentialsError(f"host-token file {path}: the token of {ip} is not unique")
        seen.add(token)
        out[str(addr)] = token
    return out
