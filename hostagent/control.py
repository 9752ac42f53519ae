"""Client for the modelcast controller's REST API (``/v1/groups``).

The controller owns the multicast tree: it hands out the group address/port and the
session MAC key, and installs flows as receivers join. The host agent only needs five
calls (create-or-get, get, join, leave, rekey; and the offers ``modelcast serve`` and
``fetch`` use) and one wait loop, so this is a thin layer over
``requests`` whose job is to turn every failure into one clear ``ControllerError`` line.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Optional
from urllib.parse import urlencode

from .wire import KEY_LEN, derive_key

if TYPE_CHECKING:
    import requests  # imported where used: it is half the CLI's start-up, and most runs need no controller

TOKEN_ENV = "MODELCAST_TOKEN"
UNHELD_PAUSE_S = 0.5  # after a GET the controller answered at once although asked to wait (watch_group)


class ControllerError(Exception):
    """Anything that stops us using the controller; ``str()`` is one printable line."""


class _Unavailable(ControllerError):
    """This instance could not take the call (unreachable, or 503: no leader right now)
    and did nothing: another instance, or a retry, may serve it."""


def controller_urls(text: str) -> list[str]:
    """``URL[,URL...]``: every instance of a controller run as several (any may be asked;
    followers pass changes to their leader)."""
    urls = [u.strip().rstrip("/") for u in text.split(",") if u.strip()]
    if not urls:
        raise ControllerError(f"no controller URL in {text!r}")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ControllerError(f"controller URL must start with http:// or https://, got {u!r}")
    return urls


class ControllerClient:
    """A controller base URL (e.g. ``http://10.0.0.254:8080``), or several separated by
    commas (the instances of one controller), and an optional bearer token.

    With several URLs a call that finds an instance unreachable, or answering 503 (no
    leader elected at this moment), goes to the next, and keeps cycling through them for
    up to ``failover_s`` seconds (the controller elects a new leader within its lease
    TTL, ~2 s): a client configured with every instance keeps working when one dies. A
    call is never repeated after a request was sent and not answered (a timeout): it
    may have been served."""

    def __init__(
        self,
        base_url: str,
        token: Optional[str] = None,
        request_timeout: float = 10.0,
        session: Optional[requests.Session] = None,
        failover_s: float = 10.0,
    ) -> None:
        self.urls = controller_urls(base_url)
        self.base_url = self.urls[0]  # the instance that answered last
        self.failover_s = failover_s
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.request_timeout = request_timeout
        import requests

        self._http = session or requests.Session()

    # ------------------------------------------------------------------ calls

    def create_group(self, model: str, source: str, receivers: Optional[list[str]] = None) -> dict:
        """POST /v1/groups: create the group, or get the existing one for (model, source)."""
        body: dict[str, Any] = {"model": model, "source": source}
        if receivers:
            body["receivers"] = list(receivers)
        return self._call("POST", "/v1/groups", body)

    def get_group(self, group_id: int) -> dict:
        return self._call("GET", f"/v1/groups/{group_id}")

    def watch_group(self, group_id: int, etag: Optional[str] = None,
                    wait: float = 0.0) -> tuple[Optional[dict], Optional[str]]:
        """GET the group; given the ETag of the last answer, the controller holds the
        request until the group differs from it, at most ``wait`` s (capped below the
        request timeout). Returns (the group, or None when unchanged; its ETag, None
        from a controller that sends none: poll that one instead)."""
        extra = {}
        asked = 0.0  # the wait asked for (none without an ETag)
        if etag is not None:
            extra["If-None-Match"] = etag
            asked = min(wait, self.request_timeout / 2)
            if asked > 0:
                extra["Prefer"] = f"wait={asked:g}"
        reply: dict[str, Any] = {}
        start = time.monotonic()
        group = self._call("GET", f"/v1/groups/{group_id}", extra=extra, reply=reply)
        if reply.get("status") == 304:
            if asked > 0 and time.monotonic() - start < asked / 2:
                # not held: the controller holds as many as it may, or a proxy dropped the
                # Prefer header; asking again at once would be a busy loop
                time.sleep(min(UNHELD_PAUSE_S, asked))
            return None, reply.get("etag") or etag
        return group, reply.get("etag")

    def join(self, group_id: int, ip: str) -> dict:
        """PUT /v1/groups/{id}/receivers/{ip}: add ``ip`` to the tree; returns the group."""
        return self._call("PUT", f"/v1/groups/{group_id}/receivers/{ip}")

    def leave(self, group_id: int, ip: str) -> Optional[dict]:
        return self._call("DELETE", f"/v1/groups/{group_id}/receivers/{ip}")

    def rekey(self, group_id: int, session: Optional[str] = None, file_digest: Optional[str] = None) -> dict:
        """POST /v1/groups/{id}/rekey: a fresh session key, announced for the transfer
        ``session`` (16 hex digits) of the file ``file_digest`` (hex); with neither, the
        announcement is cleared and the old key retired."""
        body = {k: v for k, v in (("session", session), ("file_digest", file_digest)) if v is not None}
        return self._call("POST", f"/v1/groups/{group_id}/rekey", body or None)

    def list_groups(self) -> list[dict]:
        return self._call("GET", "/v1/groups") or []

    def delete_group(self, group_id: int) -> None:
        self._call("DELETE", f"/v1/groups/{group_id}")

    def offer(self, model: str, source: str, name: str = "", size: int = 0, files: int = 0) -> dict:
        """POST /v1/offers: ``source`` serves ``model`` (modelcast serve); idempotent."""
        return self._call("POST", "/v1/offers", {"model": model, "source": source, "name": name[:256],
                                                 "size": size, "files": files})

    def offers(self, model: Optional[str] = None) -> list[dict]:
        """GET /v1/offers: who serves ``model`` (every offer without one)."""
        query = "?" + urlencode({"model": model}) if model is not None else ""
        return self._call("GET", "/v1/offers" + query) or []

    def withdraw(self, offer_id: int) -> None:
        self._call("DELETE", f"/v1/offers/{offer_id}")

    def topology(self) -> dict:
        return self._call("GET", "/v1/topology")

    def wait_until(
        self,
        fetch: Callable[[], Any],
        pred: Callable[[Any], bool],
        what: str,
        timeout: float = 30.0,
        poll: float = 0.5,
        unreachable_ok: bool = False,
        check: Optional[Callable[[], None]] = None,
        describe: Callable[[Any], str] = lambda last: f"last answer: {str(last)[:400]}",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Any:
        """Call ``fetch`` (e.g. ``lambda: client.get_group(7)``) every ``poll`` s until
        ``pred(answer)`` holds; return that answer.

        The one polling loop for everything that waits on the controller (the agent, the
        lab, tests). ``pred`` may raise to fail at once; ``check`` runs each round (e.g.
        "is the process I wait for still alive"); with ``unreachable_ok`` a controller
        that is (re)starting counts as "not yet". On timeout: ControllerError naming
        ``what`` and ``describe(last answer)``."""
        deadline = clock() + timeout
        last: Any = None
        while True:
            try:
                last = fetch()
            except ControllerError as exc:
                if not unreachable_ok:
                    raise
                last = f"(unreachable: {exc})"
            else:
                if pred(last):
                    return last
            if check is not None:
                check()
            if clock() >= deadline:
                raise ControllerError(f"timed out after {timeout:g}s waiting for {what} ({describe(last)})")
            sleep(poll)

    def wait_installed(
        self,
        group: dict,
        receivers: Optional[int] = None,
        timeout: float = 30.0,
        poll: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> dict:
        """Poll the group until its state is ``installed`` and, if ``receivers`` is set,
        at least that many receivers are ``installed``. Raises on ``error`` or timeout."""

        def ready(g: dict) -> bool:
            if g.get("state") == "error":
                errors = "; ".join(str(e) for e in g.get("errors") or []) or "no detail"
                raise ControllerError(f"controller reports group {g.get('id')} in error: {errors}")
            return g.get("state") == "installed" and (receivers is None or installed_receivers(g) >= receivers)

        def state(g: Any) -> str:
            if not isinstance(g, dict):
                return str(g)
            want = f", {installed_receivers(g)}/{receivers} receivers installed" if receivers is not None else ""
            return f"state {g.get('state')}{want}"

        if ready(group):
            return group
        gid = int(group["id"])
        return self.wait_until(lambda: self.get_group(gid), ready, f"group {gid} to be installed",
                               timeout, poll, describe=state, clock=clock, sleep=sleep)

    # ------------------------------------------------------------------ plumbing

    def _call(self, method: str, path: str, body: Optional[dict] = None,
              extra: Optional[dict] = None, reply: Optional[dict] = None) -> Any:
        """``extra``: more request headers; ``reply``, when given, gets the answer's
        ``status`` and ``etag``."""
        if len(self.urls) == 1:
            return self._call_one(self.base_url, method, path, body, extra, reply)
        deadline = time.monotonic() + self.failover_s
        while True:
            start = self.urls.index(self.base_url)
            for url in self.urls[start:] + self.urls[:start]:
                try:
                    out = self._call_one(url, method, path, body, extra, reply)
                except _Unavailable as exc:
                    last = exc
                    continue
                self.base_url = url
                return out
            if time.monotonic() >= deadline:
                raise ControllerError(f"no controller instance served {method} {path} within "
                                      f"{self.failover_s:g}s; last: {last}")
            time.sleep(0.2)

    def _call_one(self, base_url: str, method: str, path: str, body: Optional[dict],
                  extra: Optional[dict] = None, reply: Optional[dict] = None) -> Any:
        import requests

        headers = {"Accept": "application/json", **(extra or {})}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        url = base_url + path
        try:
            resp = self._http.request(method, url, json=body, headers=headers, timeout=self.request_timeout)
        except requests.ConnectTimeout as exc:  # nothing was sent: another instance may serve it
            raise _Unavailable(f"cannot reach controller at {base_url}: {_reason(exc)}") from None
        except requests.Timeout:
            raise ControllerError(f"controller at {base_url} did not answer {method} {path} "
                                  f"within {self.request_timeout:g}s") from None
        except requests.ConnectionError as exc:
            raise _Unavailable(f"cannot reach controller at {base_url}: {_reason(exc)}") from None
        except requests.RequestException as exc:
            raise ControllerError(f"cannot reach controller at {base_url}: {_reason(exc)}") from None
        if reply is not None:
            reply["status"], reply["etag"] = resp.status_code, resp.headers.get("ETag")
        if resp.status_code == 503:
            raise _Unavailable(f"controller refused {method} {path} (503): {_error_text(resp)}")
        if resp.status_code >= 400:
            raise ControllerError(f"controller refused {method} {path} ({resp.status_code}): {_error_text(resp)}")
        if resp.status_code in (204, 304) or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise ControllerError(f"controller sent non-JSON for {method} {path} ({resp.status_code})") from None


def _reason(exc: requests.RequestException) -> str:
    """The innermost OS-level cause ("Connection refused"), not urllib3's nested repr."""
    cause: Optional[BaseException] = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
        cause = cause.__cause__ or cause.__context__
    text = str(exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _error_text(resp: requests.Response) -> str:
    try:
        obj = resp.json()
    except ValueError:
        return (resp.text or resp.reason or "").strip().splitlines()[0][:200] if (resp.text or resp.reason) else "no detail"
    if isinstance(obj, dict) and obj.get("error"):
        return str(obj["error"]).splitlines()[0]
    return str(obj)[:200]


# ---------------------------------------------------------------------- group helpers


def installed_receivers(group: dict) -> int:
    return sum(1 for s in (group.get("receivers") or {}).values() if s == "installed")


def group_endpoint(group: dict) -> tuple[str, int]:
    """(address, port) of a group, validated: a bad controller answer is a clear error."""
    try:
        addr = ipaddress.IPv4Address(group["address"])
        port = int(group["port"])
    except (KeyError, TypeError, ValueError):
        raise ControllerError(f"controller returned a group without a valid address/port: {group!r:.200}") from None
    if not addr.is_multicast or not 0 < port < 65536:
        raise ControllerError(f"controller returned an unusable group {addr}:{port}")
    return str(addr), port


def session_key(group: dict) -> Optional[bytes]:
    """MAC key for the group: the controller's 32-byte hex ``key`` run through
    ``derive_key`` (sender and receiver both call this, so they agree). None when the
    answer carries no key: the controller shows it only to a caller with a token that
    covers the group (admin, or the host token of its source or of a receiver, which
    gets it in its own join's answer); anonymous answers never hold one."""
    text = group.get("key")
    if not text:
        return None
    try:
        raw = bytes.fromhex(text)
    except (TypeError, ValueError):
        raise ControllerError("controller returned a malformed group key") from None
    if len(raw) != KEY_LEN:
        raise ControllerError(f"controller group key is {len(raw)} bytes, expected {KEY_LEN}")
    return derive_key(raw)


def local_ip_towards(host: str, port: int = 9) -> str:
    """The local address the kernel would use to reach ``host`` (UDP connect sends
    nothing; it only consults the routing table)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
        except OSError as exc:
            raise ControllerError(f"no route to {host}: {exc.strerror}") from None
        return probe.getsockname()[0]
