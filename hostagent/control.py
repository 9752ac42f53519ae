"""Client for the modelcast controller's REST API (``/v1/groups``).

The controller owns the multicast tree: it hands out the group address/port and the
session MAC key, and installs flows as receivers join. The host agent only needs five
calls (create-or-get, get, join, leave, rekey; and the offers ``modelcast serve`` and
``fetch`` use) and one wait loop, so this is a thin layer over
``requests`` whose job is to turn every failure into one clear ``ControllerError`` line.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from .wire import KEY_LEN, derive_key

if TYPE_CHECKING:
    import requests  # imported where used: it is half the CLI's start-up, and most runs need no controller

TOKEN_ENV = "MODELCAST_TOKEN"
UNHELD_PAUSE_S = 0.5  # after a GET the controller answered at once although asked to wait (watch_group)
# A group this client made (or was handed by create_group) may be unknown for a moment to
# an instance that mirrors the leader's state: its 404 within this long is "not yet".
MIRROR_GRACE_S = 5.0
BACKOFF_FIRST_S = 0.1  # the first pause before asking again; doubled up to BACKOFF_MAX_S
BACKOFF_MAX_S = 1.0
_UNAVAILABLE = (502, 503, 504)  # the instance (or a proxy before it) could not serve the call: did nothing
_KEY_FIELDS = ("key",)  # members of a controller answer that hold key material


class ControllerError(Exception):
    """Anything that stops us using the controller; ``str()`` is one printable line.

    ``status`` is the HTTP status when the controller answered (None: no answer).
    ``transient`` says whether the same call may succeed later: unreachable, a 5xx, or a
    404 for a group this client just got (an instance still mirroring the leader). A
    refusal (4xx) is not transient: asking again gets the same answer."""

    def __init__(self, message: str, *, status: Optional[int] = None, transient: bool = False,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(message)
        self.status = status
        self.transient = transient
        self.retry_after = retry_after  # seconds, from a Retry-After header


class _Unavailable(ControllerError):
    """This instance could not take the call (unreachable, or 502/503/504: no leader
    right now) and did nothing: another instance, or a retry, may serve it."""

    def __init__(self, message: str, *, status: Optional[int] = None, retry_after: Optional[float] = None) -> None:
        super().__init__(message, status=status, transient=True, retry_after=retry_after)


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
    leader elected at this moment), goes to the next, and keeps cycling through them,
    pausing with back-off (``BACKOFF_FIRST_S`` doubling to ``BACKOFF_MAX_S``, or the
    answer's Retry-After) for up to ``failover_s`` seconds (the controller elects a new
    leader within its lease TTL, ~2 s): a client configured with every instance keeps
    working when one dies. One URL answering 503 is asked again the same way; one that
    cannot be reached fails at once (there is nothing else to ask).

    Reads are served by any instance from its mirror of the leader's state, which can
    lag the leader by a moment: a 404 for a group this client was handed within
    ``MIRROR_GRACE_S`` is asked of the other instances, then again after a pause, until
    the grace ends; with several URLs a read's 404 counts only once every instance
    answered it. A call is never repeated after a request was sent and not answered (a
    timeout): it may have been served."""

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
        self._handed: dict[int, float] = {}  # group id -> when an answer handed it to us (MIRROR_GRACE_S)
        import requests

        self._http = session or requests.Session()

    # ------------------------------------------------------------------ calls

    def create_group(self, model: str, source: str, receivers: Optional[list[str]] = None) -> dict:
        """POST /v1/groups: create the group, or get the existing one for (model, source)."""
        body: dict[str, Any] = {"model": model, "source": source}
        if receivers:
            body["receivers"] = list(receivers)
        group = self._call("POST", "/v1/groups", body)
        if isinstance(group, dict) and isinstance(group.get("id"), int):
            self._handed[group["id"]] = time.monotonic()
        return group

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

    def list_groups(self, model: Optional[str] = None, source: Optional[str] = None) -> list[dict]:
        """GET /v1/groups: every group, or those of ``model`` and/or ``source``."""
        query = {k: v for k, v in (("model", model), ("source", source)) if v is not None}
        return self._call("GET", "/v1/groups" + _query(query)) or []

    def delete_group(self, group_id: int) -> None:
        self._call("DELETE", f"/v1/groups/{group_id}")

    def offer(self, model: str, source: str, name: str = "", size: int = 0, files: int = 0,
              hf: Optional[dict] = None) -> dict:
        """POST /v1/offers: ``source`` serves ``model`` (modelcast serve); idempotent.
        ``hf``: a Hugging Face snapshot's commit, refs and LFS files (hostagent.hf)."""
        body: dict[str, Any] = {"model": model, "source": source, "name": name[:256], "size": size, "files": files}
        if hf is not None:
            body["hf"] = hf
        return self._call("POST", "/v1/offers", body)

    def offers(self, model: Optional[str] = None, name: Optional[str] = None,
               revision: Optional[str] = None) -> list[dict]:
        """GET /v1/offers: who serves ``model``, or the model named ``name`` (at
        ``revision``: a commit or a branch the server holds); every offer without these."""
        query = {k: v for k, v in (("model", model), ("name", name), ("revision", revision)) if v is not None}
        return self._call("GET", "/v1/offers" + _query(query)) or []

    def withdraw(self, offer_id: int) -> None:
        self._call("DELETE", f"/v1/offers/{offer_id}")

    def trace(self, group_id: int, receiver: Optional[str] = None) -> dict:
        """GET /v1/groups/{id}/trace: the tree hop by hop with live counters."""
        query = f"?receiver={receiver}" if receiver else ""
        return self._call("GET", f"/v1/groups/{group_id}/trace{query}")

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
        describe: Callable[[Any], str] = lambda last: f"last answer: {describe_answer(last)}",
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
        ``status`` and ``etag``. Instances are asked in turn, the one that answered last
        first; what is asked again, and for how long, is the class docstring's."""
        deadline = time.monotonic() + self.failover_s
        pause = BACKOFF_FIRST_S
        while True:
            start = self.urls.index(self.base_url)
            not_found = 0  # instances that answered this read with a 404 in this pass
            last: Optional[ControllerError] = None
            for url in self.urls[start:] + self.urls[:start]:
                try:
                    out = self._call_one(url, method, path, body, extra, reply)
                except ControllerError as exc:
                    if not self._ask_again(exc, method, path):
                        raise
                    last = exc
                    not_found += exc.status == 404
                    continue
                self.base_url = url
                return out
            assert last is not None
            now = time.monotonic()
            if not_found == len(self.urls) and not last.transient:
                raise last  # every instance has no such thing: it is not a mirror's lag
            if now >= deadline:
                if len(self.urls) == 1:
                    raise last
                raise ControllerError(f"no controller instance served {method} {path} within "
                                      f"{self.failover_s:g}s; last: {last}", status=last.status,
                                      transient=True) from None
            wait = last.retry_after if last.retry_after is not None else pause
            time.sleep(max(0.0, min(wait, deadline - now)))
            pause = min(pause * 2, BACKOFF_MAX_S)

    def _ask_again(self, exc: ControllerError, method: str, path: str) -> bool:
        """Whether ``exc`` may be answered differently by another instance or a moment
        later: an instance that could not take the call (several URLs: also unreachable),
        a 404 for a group handed to us within the grace (marked transient here), or, with
        several URLs, a read's 404 (another instance may be the leader)."""
        if isinstance(exc, _Unavailable):
            return exc.status is not None or len(self.urls) > 1
        if exc.status != 404:
            return False
        gid = _group_id(path)
        if gid is not None and time.monotonic() - self._handed.get(gid, -1e18) < MIRROR_GRACE_S:
            exc.transient = True
            return True
        return method == "GET" and len(self.urls) > 1

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
                                  f"within {self.request_timeout:g}s", transient=True) from None
        except requests.ConnectionError as exc:
            raise _Unavailable(f"cannot reach controller at {base_url}: {_reason(exc)}") from None
        except requests.RequestException as exc:
            raise ControllerError(f"cannot reach controller at {base_url}: {_reason(exc)}") from None
        if reply is not None:
            reply["status"], reply["etag"] = resp.status_code, resp.headers.get("ETag")
        status = resp.status_code
        if status in _UNAVAILABLE:
            raise _Unavailable(f"controller at {base_url} refused {method} {path} ({status}): {_error_text(resp)}",
                               status=status, retry_after=_retry_after(resp))
        if status >= 400:
            raise ControllerError(f"controller refused {method} {path} ({status}): {_error_text(resp)}",
                                  status=status, transient=status >= 500)
        if status in (204, 304) or not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise ControllerError(f"controller sent non-JSON for {method} {path} ({status})") from None


def _group_id(path: str) -> Optional[int]:
    """The group a ``/v1/groups/{id}...`` path names (None: another path)."""
    parts = path.split("?")[0].strip("/").split("/")
    return int(parts[2]) if len(parts) >= 3 and parts[:2] == ["v1", "groups"] and parts[2].isdigit() else None


def _retry_after(resp: requests.Response) -> Optional[float]:
    """Retry-After in seconds (the delay form; an HTTP date is ignored), within BACKOFF_MAX_S."""
    text = resp.headers.get("Retry-After", "")
    try:
        return min(max(0.0, float(text)), BACKOFF_MAX_S) if text else None
    except ValueError:
        return None


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
    return describe_answer(obj, 200)


# ---------------------------------------------------------------------- group helpers


def without_keys(answer: Any) -> Any:
    """A controller answer with every key member (``_KEY_FIELDS``, at any depth) shown as
    ``"<hidden>"``: what may go into a message, a log line or a summary."""
    if isinstance(answer, dict):
        return {k: "<hidden>" if k in _KEY_FIELDS else without_keys(v) for k, v in answer.items()}
    if isinstance(answer, list):
        return [without_keys(v) for v in answer]
    return answer


def describe_answer(answer: Any, limit: int = 400) -> str:
    """A controller answer in one line for an error message: a group as its id, model,
    state, receivers and announced session; anything else as JSON, keys hidden."""
    if isinstance(answer, dict) and {"id", "state"} <= set(answer):
        members = answer.get("receivers") or {}
        receivers = ", ".join(f"{ip} {state}" for ip, state in sorted(members.items())) if isinstance(
            members, dict) else ", ".join(map(str, members))
        session = f", announced session {answer['session']}" if answer.get("session") else ", nothing announced"
        text = (f"group {answer['id']} ({answer.get('model')}) {answer['state']}, "
                f"receivers: {receivers or 'none'}{session}")
    elif isinstance(answer, (dict, list)):
        text = json.dumps(without_keys(answer), sort_keys=True, default=str)
    else:
        text = str(answer)
    return text if len(text) <= limit else text[: limit - 3] + "..."



def _query(params: dict[str, str]) -> str:
    """``?k=v&...`` for a URL, empty without parameters (urllib.parse loads here: a send
    or recv without a controller never needs it)."""
    if not params:
        return ""
    from urllib.parse import urlencode

    return "?" + urlencode(params)


def installed_receivers(group: dict) -> int:
    return sum(1 for s in (group.get("receivers") or {}).values() if s == "installed")


def group_endpoint(group: dict) -> tuple[str, int]:
    """(address, port) of a group, validated: a bad controller answer is a clear error."""
    try:
        addr = ipaddress.IPv4Address(group["address"])
        port = int(group["port"])
    except (KeyError, TypeError, ValueError):
        raise ControllerError("controller returned a group without a valid address/port: "
                              f"{describe_answer(group)}") from None
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
