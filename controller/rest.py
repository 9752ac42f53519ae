"""The REST API: a thin Ryu WSGI controller over ``controller.service.Service``.

Registered by the app: ``wsgi.register(RestApi, {"service": service})`` (optionally with
``"barrier_timeout": seconds`` for DELETE). ``controller/openapi.json`` is the one source
of truth for request bodies: they are validated against its component schemas
(``controller.schema``, which checks loaded state the same way). Every answer is JSON
(except /metrics); every error is ``{"error": sentence, "detail": any}`` with its status,
never a traceback, also for JSON the parser refuses. A mutation that a follower forwards
carries the follower's instance credential, checked here, instead of the caller's token.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import socket
import re
import time
from typing import Any, Callable
from urllib.parse import urlsplit

from ryu.app.wsgi import ControllerBase, Response, route
from ryu.lib import hub

from controller.auth import Principal
from controller.core import MAX_GID
from controller import settings
from controller.counters import Counters
from controller.errors import CoreError
from controller.events import sse
from controller.schema import OPENAPI_PATH, SchemaError, check, loads, openapi, openapi_bytes, validator
from controller.service import Service
from controller.topoview import check_unicast

log = logging.getLogger("modelcast.rest")
# (the schema's names are controller.schema's, read here by the docs and tests as before)
__all__ = ["OPENAPI_PATH", "ApiError", "RestApi", "forward_to", "openapi", "openapi_bytes", "routes",
           "validate", "validator"]

DEFAULT_BARRIER_TIMEOUT = 10.0
# The largest legitimate body is a create naming ~18,000 receivers (~14 bytes each):
# 256 KiB. Anything bigger is refused before it is read.
MAX_BODY = 256 << 10
MAX_DEPTH = 32  # our bodies nest 2 deep; deeper JSON is refused before validation
_METHODS = ("GET", "POST", "PUT", "DELETE")
# methods counted under their own name in metrics; any other string is "other", so a
# client cannot create one Prometheus series per made-up method
METRIC_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"))
_MUTATING = frozenset(("POST", "PUT", "DELETE"))
# Content-Types meaning "the client named no type": none at all, or the form type that
# curl -d (and other clients) add when the user gave no -H 'Content-Type: ...'.
UNTYPED_BODY = frozenset(("", "application/x-www-form-urlencoded"))


class ApiError(Exception):
    """An HTTP-level error (bad JSON, bad path parameter, timeout) with its status."""

    def __init__(self, status: int, message: str, detail: Any = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = detail
        self.headers = headers or {}


# -- the OpenAPI document and its schemas (controller.schema: shared with loaded state) ---
def validate(schema: str, instance: Any) -> None:
    """Raise a 400 ApiError naming the first (most relevant) violation and where it is
    (``controller.schema.check``: the same checks a loaded state's entries pass)."""
    try:
        check(schema, instance)
    except SchemaError as exc:
        raise ApiError(400, f"request body {exc}", exc.detail) from None


# -- helpers -----------------------------------------------------------------------------
def json_bytes(body: Any) -> bytes:
    return json.dumps(body, sort_keys=False).encode() + b"\n"


def json_response(status: int, body: Any, headers: dict[str, str] | None = None,
                  raw: bytes | None = None) -> Response:
    """``raw``: ``body`` already serialised (``json_bytes``)."""
    resp = Response(status=status, content_type="application/json",
                    body=raw if raw is not None else json_bytes(body))
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def error_response(status: int, message: str, detail: Any = None,
                   headers: dict[str, str] | None = None) -> Response:
    return json_response(status, {"error": message, "detail": detail}, headers)


def read_body(req: Any) -> bytes:
    """At most ``MAX_BODY`` bytes of body, with a Content-Length or chunked (eventlet's
    server decodes the chunks; webob alone would read a body without a length as empty).
    A body that does not arrive in time (``--rest-idle``, ``controller.webserver``) is
    a 408, the client's doing, not a 500."""
    try:
        if req.content_length is not None:
            if req.content_length > MAX_BODY:
                raise ApiError(413, f"request body larger than {MAX_BODY} bytes")
            return req.body
        if "chunked" not in req.headers.get("Transfer-Encoding", "").lower():
            return b""
        raw = req.body_file_raw.read(MAX_BODY + 1)
    except (TimeoutError, socket.timeout):
        raise ApiError(408, "the request did not arrive whole within "
                       f"{settings.current.rest_idle_s:g} s of its first byte (--rest-idle)",
                       headers={"Connection": "close"}) from None
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"request body larger than {MAX_BODY} bytes")
    return raw


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists/objects more than ``limit`` deep (iterative, linear:
    validators and encoders recurse, so depth is checked before they run)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children: Any = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def parse_gid(text: str, what: str = "group") -> int:
    if not re.fullmatch(r"[0-9]{1,10}", text or "") or not 1 <= int(text) <= MAX_GID:
        raise ApiError(400, f"{what} id {text!r} is not a positive integer")
    return int(text)


def parse_dpid(text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,20}", text or "") or not 1 <= int(text) < 1 << 64:
        raise ApiError(400, f"switch id {text!r} is not a datapath id (1..2^64-1)")
    return int(text)


def parse_ip(text: str, what: str = "host") -> str:
    return check_unicast(text, what)  # InvalidAddress -> 400


WAIT_MAX_S = 20.0  # the longest ``Prefer: wait`` a GET of a group (or of events) is held for
STREAM_S = 300.0  # an event stream ends after this (the client reconnects with Last-Event-ID)
KEEPALIVE_S = 15.0  # an idle event stream sends a comment this often (proxies close silent ones)
EVENTS_MAX = 1000  # events in one answer at most
MAX_FILTER = 256  # an offer list's name or revision filter (openapi.json's maxLength)
RECHECK_S = 1.0  # a held GET looks at its group again at least this often


def _only(req: Any, *names: str) -> None:
    """A 400 for a query parameter the route does not take (a typo must not be ignored)."""
    unknown = sorted(set(req.GET) - set(names))
    if unknown:
        raise ApiError(400, f"unknown query parameter {unknown[0]!r}; this route takes "
                       f"{', '.join(names) or 'none'}", {"unknown": unknown})


def _int_text(text: str, what: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d{1,19}", text or "") or not low <= int(text) <= high:
        raise ApiError(400, f"{what} {text[:40]!r} is not an integer in {low}..{high}")
    return int(text)


def _int(req: Any, name: str, default: int, low: int, high: int) -> int:
    text = req.GET.get(name)
    return default if text is None else _int_text(text, name, low, high)


def _since(req: Any) -> int:
    return _int(req, "since", 0, 0, 2 ** 63)


def _group_filter(req: Any) -> int | None:
    text = req.GET.get("group")
    return parse_gid(text) if text is not None else None


def _flag(req: Any, name: str, default: bool) -> bool:
    text = req.GET.get(name)
    if text is None:
        return default
    if text.lower() not in ("0", "1", "true", "false"):
        raise ApiError(400, f"{name} must be 0, 1, true or false, not {text[:20]!r}")
    return text.lower() in ("1", "true")


def etag(raw: bytes) -> str:
    """A strong ETag of an answer's bytes (as this caller sees it: keys shown or not)."""
    return '"' + hashlib.blake2b(raw, digest_size=12).hexdigest() + '"'


def if_none_match(req: Any) -> set[str]:
    return {t.strip() for t in (req.headers.get("If-None-Match") or "").split(",") if t.strip()}


def prefer_wait(req: Any) -> float:
    """``Prefer: wait=N`` (RFC 7240) in seconds, capped at WAIT_MAX_S; 0 without one."""
    m = re.search(r"(?:^|[,;\s])wait\s*=\s*(\d+(?:\.\d+)?)", req.headers.get("Prefer") or "")
    return min(float(m.group(1)), WAIT_MAX_S) if m else 0.0


def endpoint(mutating: bool = False) -> Callable[[Callable[..., Response]], Callable[..., Response]]:
    """Wrap a handler: the caller authenticated first (passed as ``who``; a token is
    required for mutating calls, so no body is read for an anonymous change), errors as
    JSON with their status, a 500 with a log line (not a traceback) for bugs, and the
    request counted in metrics under a method from a fixed set."""

    def wrap(func: Callable[..., Response]) -> Callable[..., Response]:
        @functools.wraps(func)
        def handler(self: "RestApi", req: Any, **kwargs: Any) -> Response:
            forwarded = None
            try:
                if mutating and req.headers.get(FORWARDED) and self.service.cluster is not None:
                    # from a follower: its instance credential names the caller it authenticated
                    who = forwarded_principal(self.service, req)
                else:
                    # every call: a wrong token is a 401 even on a read (the client learns it
                    # at once), and reads show keys only to a caller allowed to see them
                    who = self.service.authenticate(req.headers.get("Authorization"), mutating)
                req.environ[PRINCIPAL_KEY] = who
                forwarded = self.forward(req) if mutating and self.forward is not None else None
                if forwarded is not None:  # a follower: the leader served it
                    resp = forwarded
                else:
                    resp = func(self, req, who=who, **kwargs)
                    if mutating:  # (readers waiting for a group to change look again)
                        self.service.changes.notify()
            except ApiError as exc:
                resp = error_response(exc.status, exc.message, exc.detail, exc.headers)
            except SchemaError as exc:  # (the service checks what in-process callers send too)
                resp = error_response(400, f"request body {exc}", exc.detail)
            except CoreError as exc:
                status = getattr(exc, "status", 400)
                headers = {}
                if status == 401:
                    invalid = ', error="invalid_token"' if req.headers.get("Authorization") else ""
                    headers["WWW-Authenticate"] = f'Bearer realm="modelcast"{invalid}'
                resp = error_response(status, str(exc), getattr(exc, "detail", None), headers)
            except Exception:  # a bug: log it, tell the client one sentence
                log.exception("%s %s failed", req.method, req.path_qs)
                resp = error_response(500, "internal error; the controller log has the details")
            status = resp.status_code
            self.service.count_request(req.method if req.method in METRIC_METHODS else "other", status)
            if mutating and forwarded is None and 400 <= status < 500:  # (a leader tells its own)
                self.service.events.emit("refused", method=req.method, path=req.path[:200], status=status,
                                         error=_error_of(resp))
            level = logging.WARNING if status >= 500 else (
                logging.INFO if req.method in _MUTATING else logging.DEBUG)
            log.log(level, "%s %s -> %d", req.method, req.path_qs, status)
            return resp

        return handler

    return wrap


def _error_of(resp: Response) -> str:
    """An error answer's sentence (for the "refused" event)."""
    try:
        return str(json.loads(resp.body).get("error", ""))[:300]
    except (ValueError, AttributeError):
        return ""


FORWARDED = "X-Modelcast-Forwarded"  # set on a mutation a follower passed to the leader
PRINCIPAL_KEY = "modelcast.principal"  # (WSGI environ) the caller the REST layer authenticated
_PASSED = ("Content-Type",)  # never Authorization: the leader gets an instance credential


def forwarded_principal(service: Service, req: Any) -> Principal | None:
    """The caller a forwarded mutation acts for: the follower's instance credential
    checked (``controller.cluster``: the body, path and caller it signed, fresh, used
    once); a 401 otherwise. An anonymous caller only where no token is configured."""
    assert service.cluster is not None
    who = service.cluster.check(req.method, req.path_qs, read_body(req), req.headers)
    return service.credentials.require(who)


def _model_source(req: Any, also: tuple[str, ...] = ()) -> tuple[str | None, str | None]:
    """The ``model`` and ``source`` filters of a list request (groups, offers; ``also``:
    its other filters); any other query parameter is a 400, not silently ignored."""
    _only(req, "model", "source", *also)
    source = req.GET.get("source")
    return req.GET.get("model"), parse_ip(source, "source") if source is not None else None


def _from_leader(req: Any, leader_url: str, timeout: Any, header: str, stream: bool = False) -> Any:
    """A read only the leader can answer (its events), asked of it as is: the caller's
    ``header`` passed on, never its token (events carry no secret)."""
    import requests  # green under the controller's eventlet monkey-patching

    headers = {FORWARDED: "1"}
    if req.headers.get(header):
        headers[header] = req.headers[header]
    try:
        return requests.get(leader_url.rstrip("/") + req.path_qs, headers=headers, timeout=timeout,
                            stream=stream)
    except requests.RequestException as exc:
        raise ApiError(503, f"the leader at {leader_url[:200]} did not answer ({type(exc).__name__}); "
                       "retry shortly", None, {"Retry-After": "1"}) from None


def forward_to(req: Any, leader_url: str | None, timeout: float,
               sign: Callable[[str, str, bytes], dict[str, str]]) -> Response:
    """Send a mutation on to the leader and answer with its response (status, body,
    Location) as is, so a client configured with any instance is served. ``sign`` gives
    the instance credential's headers for (method, path, body): the caller's own token
    is never sent on. A 503 with Retry-After while no leader is known, when the leader
    does not answer (it may have just died: an election follows within the lease TTL), or
    when the request was already forwarded once (two instances each believing the other
    leads)."""
    import requests  # green under the controller's eventlet monkey-patching

    if req.headers.get(FORWARDED) or not leader_url:
        raise ApiError(503, "no leader elected right now; retry shortly", None, {"Retry-After": "1"})
    body = read_body(req)
    headers = {k: req.headers[k] for k in _PASSED if k in req.headers}
    headers[FORWARDED] = "1"
    headers.update(sign(req.method, req.path_qs, body))
    try:
        answer = requests.request(req.method, leader_url.rstrip("/") + req.path_qs,
                                  data=body, headers=headers, timeout=timeout)
    except requests.RequestException as exc:
        raise ApiError(503, f"the leader at {leader_url} did not answer ({type(exc).__name__}); "
                       "retry shortly", None, {"Retry-After": "1"}) from None
    resp = Response(status=answer.status_code, body=answer.content,
                    content_type=answer.headers.get("Content-Type", "application/json").split(";")[0])
    for k in ("Location", "Retry-After", "WWW-Authenticate"):
        if k in answer.headers:
            resp.headers[k] = answer.headers[k]
    if "Location" in answer.headers:  # on this instance, not the leader (which may go away)
        loc = urlsplit(answer.headers["Location"])
        resp.headers["Location"] = loc.path + (f"?{loc.query}" if loc.query else "")
    return resp


class RestApi(ControllerBase):
    """Routes under /v1 (plus /metrics). Route methods are matched by the mapper; a
    wrong method or unknown path under /v1 reaches the fallbacks, which answer JSON
    405/404 (they are named ``zz_*`` so ``wsgi.register`` connects them last)."""

    def __init__(self, req: Any, link: Any, data: dict[str, Any], **config: Any) -> None:
        super().__init__(req, link, data, **config)
        self.service: Service = data["service"]
        self.barrier_timeout = float(data.get("barrier_timeout", DEFAULT_BARRIER_TIMEOUT))
        # several instances: (req) -> the leader's answer, or None when this one leads
        self.forward: Callable[[Any], Response | None] | None = data.get("forward")
        # live counters for traces (controller.counters; None: the tree alone)
        self.counters: Counters | None = data.get("counters")
        # several instances: () -> the leader's URL while this one follows (its event
        # history is the leader's: a follower relays it), else None
        self.leader: Callable[[], str | None] | None = data.get("leader")

    # -- body ------------------------------------------------------------------------
    def _body(self, req: Any, schema: str, optional: bool = False) -> dict[str, Any]:
        """The request's JSON body, validated against ``schema`` (``optional``: an empty
        body is ``{}``). A body whose sender named no type -- no Content-Type, or the form
        type ``curl -d`` adds by default -- is parsed as JSON (a body that parses is JSON;
        one that does not is a 400). Any other explicit non-JSON type is a 415: the client
        said it sends something else."""
        ctype = (req.content_type or "").lower()
        typed = ctype not in UNTYPED_BODY and ctype != "application/json" and not ctype.endswith("+json")
        if typed and not optional:
            raise ApiError(415, f"request body must be application/json, not {ctype}")
        raw = read_body(req)
        if not raw.strip():
            if optional:
                return {}
            raise ApiError(400, "request body is empty; send a JSON object")
        if typed:
            raise ApiError(415, f"request body must be application/json, not {ctype}")
        try:
            data = loads(raw)
        except UnicodeDecodeError as exc:
            raise ApiError(400, "request body is not UTF-8 JSON", str(exc)) from None
        except json.JSONDecodeError as exc:
            raise ApiError(400, "request body is not valid JSON",
                           {"message": exc.msg, "line": exc.lineno, "column": exc.colno}) from None
        except RecursionError:  # the parser's own limit (~1000 levels)
            raise ApiError(400, f"request body nests deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:  # NaN, Infinity, an integer of more than 4,300 digits
            raise ApiError(400, "request body is not valid JSON", {"message": str(exc)[:200]}) from None
        if too_deep(data, MAX_DEPTH):
            raise ApiError(400, f"request body nests deeper than {MAX_DEPTH} levels")
        validate(schema, data)
        return data

    # -- groups ----------------------------------------------------------------------
    @route("modelcast_groups_list", "/v1/groups", methods=["GET"])
    @endpoint()
    def list_groups(self, req: Any, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.list_groups(*_model_source(req), who))

    @route("modelcast_groups_create", "/v1/groups", methods=["POST"])
    @endpoint(mutating=True)
    def create_group(self, req: Any, who: Principal | None, **_: Any) -> Response:
        group, created = self.service.create_group(self._body(req, "GroupCreate"), who)
        return json_response(201 if created else 200, group,
                             {"Location": f"/v1/groups/{group['id']}"})

    @route("modelcast_group_get", "/v1/groups/{id}", methods=["GET"])
    @endpoint()
    def get_group(self, req: Any, id: str, who: Principal | None, **_: Any) -> Response:
        """With ``If-None-Match`` (the ETag of an earlier answer) and ``Prefer: wait=N``,
        answer once the group differs from that answer, or 304 after N s (at most
        WAIT_MAX_S): a host agent waiting for a transfer asks once per change. Past the
        most that are held at once (``Changes.limit``, 3/4 of the server's connections)
        it is answered at once: the other calls keep their connections."""
        gid = parse_gid(id)
        raw = json_bytes(self.service.get_group(gid, who))  # (once: the body and its ETag)
        tag = etag(raw)
        known = if_none_match(req)
        if tag in known:
            changes = self.service.changes
            with changes.hold() as held:  # (past the limit: answered at once)
                deadline = time.monotonic() + (prefer_wait(req) if held else 0.0)
                while tag in known and (left := deadline - time.monotonic()) > 0:
                    # a change notifies at once; the recheck bounds what none announces
                    # (a follower's state arriving from the store)
                    changes.wait(min(left, RECHECK_S))
                    raw = json_bytes(self.service.get_group(gid, who))  # (404 once it is deleted)
                    tag = etag(raw)
            if tag in known:
                resp = Response(status=304)
                resp.headers["ETag"] = tag
                return resp
        return json_response(200, None, {"ETag": tag}, raw=raw)

    @route("modelcast_group_trace", "/v1/groups/{id}/trace", methods=["GET"])
    @endpoint()
    def trace(self, req: Any, id: str, **_: Any) -> Response:
        """Each receiver's hops with live counters (``?receiver=IP``: one; ``?counters=0``:
        the tree alone, no switch asked)."""
        _only(req, "receiver", "counters")
        gid = parse_gid(id)
        receiver = req.GET.get("receiver")
        live = _flag(req, "counters", True) and self.counters is not None
        read = self.counters.read if live and self.counters is not None else None
        return json_response(200, self.service.trace(gid, receiver, read))

    @route("modelcast_group_rekey", "/v1/groups/{id}/rekey", methods=["POST"])
    @endpoint(mutating=True)
    def rekey(self, req: Any, id: str, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.rekey(parse_gid(id), who, self._body(req, "Rekey", optional=True)))

    @route("modelcast_group_pin", "/v1/groups/{id}/pin", methods=["PUT"])
    @endpoint(mutating=True)
    def pin(self, req: Any, id: str, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.pin(parse_gid(id), True, who))

    @route("modelcast_group_unpin", "/v1/groups/{id}/pin", methods=["DELETE"])
    @endpoint(mutating=True)
    def unpin(self, req: Any, id: str, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.pin(parse_gid(id), False, who))

    @route("modelcast_group_delete", "/v1/groups/{id}", methods=["DELETE"])
    @endpoint(mutating=True)
    def delete_group(self, req: Any, id: str, who: Principal | None, **_: Any) -> Response:
        """Answers once the switches confirmed the removal: the handler's green thread
        waits on an event the installer's done callback sets (at once in tests)."""
        gid = parse_gid(id)
        confirmed = hub.Event()
        self.service.delete_group(gid, done=confirmed.set, who=who)
        if not confirmed.wait(timeout=self.barrier_timeout):
            raise ApiError(504, f"group {gid} was deleted but the switches did not confirm "
                                f"the removal within {self.barrier_timeout:g} s",
                           {"id": gid, "timeout_s": self.barrier_timeout})
        return Response(status=204)

    @route("modelcast_receiver_join", "/v1/groups/{id}/receivers/{ip}", methods=["PUT"])
    @endpoint(mutating=True)
    def join(self, req: Any, id: str, ip: str, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.join(parse_gid(id), parse_ip(ip, "receiver"), who))

    @route("modelcast_receiver_leave", "/v1/groups/{id}/receivers/{ip}", methods=["DELETE"])
    @endpoint(mutating=True)
    def leave(self, req: Any, id: str, ip: str, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.leave(parse_gid(id), parse_ip(ip, "receiver"), who))

    # -- offers: what `modelcast serve` publishes ---------------------------------------
    @route("modelcast_offers_list", "/v1/offers", methods=["GET"])
    @endpoint()
    def list_offers(self, req: Any, **_: Any) -> Response:
        by = {k: req.GET[k] for k in ("name", "revision") if k in req.GET}
        for k, v in by.items():  # (the schema's maxLength: a longer one names no offer)
            if len(v) > MAX_FILTER:
                raise ApiError(400, f"{k} is longer than {MAX_FILTER} characters")
        return json_response(200, self.service.list_offers(*_model_source(req, ("name", "revision")), **by))

    @route("modelcast_offers_create", "/v1/offers", methods=["POST"])
    @endpoint(mutating=True)
    def create_offer(self, req: Any, who: Principal | None, **_: Any) -> Response:
        offer, created = self.service.create_offer(self._body(req, "OfferCreate"), who)
        return json_response(201 if created else 200, offer, {"Location": f"/v1/offers/{offer['id']}"})

    @route("modelcast_offer_get", "/v1/offers/{id}", methods=["GET"])
    @endpoint()
    def get_offer(self, req: Any, id: str, **_: Any) -> Response:
        return json_response(200, self.service.get_offer(parse_gid(id, "offer")))

    @route("modelcast_offer_delete", "/v1/offers/{id}", methods=["DELETE"])
    @endpoint(mutating=True)
    def delete_offer(self, req: Any, id: str, who: Principal | None, **_: Any) -> Response:
        self.service.delete_offer(parse_gid(id, "offer"), who)
        return Response(status=204)

    # -- the ACL: who may offer and join which model ------------------------------------
    @route("modelcast_acl_list", "/v1/acl", methods=["GET"])
    @endpoint()
    def list_acl(self, req: Any, **_: Any) -> Response:
        return json_response(200, self.service.list_rules())

    @route("modelcast_acl_put", "/v1/acl", methods=["POST"])
    @endpoint(mutating=True)
    def put_acl_rule(self, req: Any, who: Principal | None, **_: Any) -> Response:
        rule, created = self.service.put_rule(self._body(req, "AclRule"), who)
        return json_response(201 if created else 200, rule, {"Location": f"/v1/acl/{rule['id']}"})

    @route("modelcast_acl_get", "/v1/acl/{id}", methods=["GET"])
    @endpoint()
    def get_acl_rule(self, req: Any, id: str, **_: Any) -> Response:
        return json_response(200, self.service.get_rule(parse_gid(id, "rule")))

    @route("modelcast_acl_delete", "/v1/acl/{id}", methods=["DELETE"])
    @endpoint(mutating=True)
    def delete_acl_rule(self, req: Any, id: str, who: Principal | None, **_: Any) -> Response:
        self.service.delete_rule(parse_gid(id, "rule"), who)
        return Response(status=204)

    # -- hosts, topology, health -----------------------------------------------------
    @route("modelcast_hosts_declare", "/v1/hosts", methods=["POST"])
    @endpoint(mutating=True)
    def declare_host(self, req: Any, who: Principal | None, **_: Any) -> Response:
        b = self._body(req, "HostDeclare")
        return json_response(201, self.service.declare_host(b["ip"], b["mac"], b["dpid"], b["port"],
                                                            who))

    @route("modelcast_host_remove", "/v1/hosts/{ip}", methods=["DELETE"])
    @endpoint(mutating=True)
    def remove_host(self, req: Any, ip: str, who: Principal | None, **_: Any) -> Response:
        self.service.remove_host(parse_ip(ip), who)
        return Response(status=204)

    # -- drains: links and switches held out of every tree for maintenance -------------
    @route("modelcast_drains_list", "/v1/drains", methods=["GET"])
    @endpoint()
    def list_drains(self, req: Any, **_: Any) -> Response:
        return json_response(200, self.service.drains())

    @route("modelcast_drain_switch", "/v1/drains/switch/{dpid}", methods=["PUT", "DELETE"])
    @endpoint(mutating=True)
    def drain_switch(self, req: Any, dpid: str, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.drain(parse_dpid(dpid), None, req.method == "PUT", who))

    @route("modelcast_drain_link", "/v1/drains/link/{a}/{b}", methods=["PUT", "DELETE"])
    @endpoint(mutating=True)
    def drain_link(self, req: Any, a: str, b: str, who: Principal | None, **_: Any) -> Response:
        return json_response(200, self.service.drain(parse_dpid(a), parse_dpid(b), req.method == "PUT", who))

    # -- events (controller.events) ------------------------------------------------------
    @route("modelcast_events", "/v1/events", methods=["GET"])
    @endpoint()
    def events(self, req: Any, **_: Any) -> Response:
        """Events after ``since`` (oldest first), optionally of one ``group``; with
        ``Prefer: wait=N`` held until there is one (or N s)."""
        _only(req, "since", "group", "limit")
        since, group = _since(req), _group_filter(req)
        limit = _int(req, "limit", EVENTS_MAX, 1, EVENTS_MAX)
        leader = self._leader(req)
        if leader is not None:
            upstream = _from_leader(req, leader, WAIT_MAX_S + 5, "Prefer")
            with upstream:
                return json_response(upstream.status_code, None, raw=upstream.content)
        log_ = self.service.events
        found = log_.since(since, group, limit)
        wait = prefer_wait(req)
        if not found and wait > 0:
            with self.service.changes.hold() as held:
                deadline = time.monotonic() + (wait if held else 0.0)
                while not found and (left := deadline - time.monotonic()) > 0:
                    log_.wait(max(since, log_.last), min(left, RECHECK_S))
                    found = log_.since(since, group, limit)
        return json_response(200, {"events": found, "first": log_.first, "last": log_.last,
                                    "missed": since + 1 < log_.first})

    @route("modelcast_events_stream", "/v1/events/stream", methods=["GET"])
    @endpoint()
    def events_stream(self, req: Any, **_: Any) -> Response:
        """Server-Sent Events: each event as it happens (after ``since``, or the
        ``Last-Event-ID`` a reconnecting client sends), a comment every KEEPALIVE_S, and
        the end after STREAM_S (clients reconnect). Holds one of the held slots."""
        _only(req, "since", "group")
        last_id = req.headers.get("Last-Event-ID")
        since = _since(req) if last_id is None else _int_text(last_id, "Last-Event-ID", 0, 2 ** 63)
        group = _group_filter(req)
        service = self.service
        if service.changes.held >= service.changes.limit:
            raise ApiError(503, "too many held requests and event streams right now; retry shortly",
                           None, {"Retry-After": "5"})
        leader = self._leader(req)
        # (eventlet's server holds a response's chunks until 4 KB by default: each event
        # must leave when it happens)
        req.environ["eventlet.minimum_write_chunk_size"] = 0
        if leader is not None:
            upstream = _from_leader(req, leader, (3.0, KEEPALIVE_S + 10), "Last-Event-ID", stream=True)
            if upstream.status_code != 200:
                with upstream:
                    return json_response(upstream.status_code, None, raw=upstream.content)

            def relay() -> Any:
                with service.changes.hold(), upstream:
                    try:  # (whatever has arrived, as it arrives: chunked from eventlet or not)
                        while data := upstream.raw.read1(1 << 16):
                            yield data
                    except OSError:  # (urllib3's errors too: the leader went, the client reconnects)
                        return

            resp = Response(status=200, app_iter=relay(), content_type="text/event-stream")
            resp.headers["Cache-Control"] = "no-cache"
            return resp

        def stream() -> Any:
            log_ = service.events
            with service.changes.hold():
                after = since
                yield b": modelcast events\nretry: 1000\n\n"
                end = time.monotonic() + STREAM_S
                while (left := end - time.monotonic()) > 0:
                    top = log_.last  # (before yielding: events may arrive while it writes)
                    found = log_.since(after, group, EVENTS_MAX)
                    after = found[-1]["id"] if len(found) == EVENTS_MAX else top
                    for ev in found:
                        yield sse(ev, json_bytes(ev))
                    if not found and not log_.wait(after, min(left, KEEPALIVE_S)):
                        yield b": keepalive\n\n"

        resp = Response(status=200, app_iter=stream(), content_type="text/event-stream")
        resp.headers["Cache-Control"] = "no-cache"
        resp.headers["X-Accel-Buffering"] = "no"
        return resp

    def _leader(self, req: Any) -> str | None:
        """The leader's URL when this instance follows one and the request did not come
        from another instance already (never relayed twice)."""
        if self.leader is None or req.headers.get(FORWARDED):
            return None
        return self.leader()

    @route("modelcast_topology", "/v1/topology", methods=["GET"])
    @endpoint()
    def topology(self, req: Any, **_: Any) -> Response:
        return json_response(200, self.service.topology())

    @route("modelcast_health", "/v1/health", methods=["GET"])
    @endpoint()
    def health(self, req: Any, **_: Any) -> Response:
        return json_response(200, self.service.health())

    @route("modelcast_metrics", "/metrics", methods=["GET"])
    @endpoint()
    def metrics(self, req: Any, **_: Any) -> Response:
        resp = Response(status=200, body=self.service.metrics_text())
        resp.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
        return resp

    @route("modelcast_openapi", "/v1/openapi.json", methods=["GET"])
    @endpoint()
    def openapi_doc(self, req: Any, **_: Any) -> Response:
        return Response(status=200, content_type="application/json", body=openapi_bytes())

    # -- fallbacks: connected last (register() sorts handlers by name) -----------------
    @route("modelcast_fallback_v1", "/v1/{rest:.*}")
    @endpoint()
    def zz_fallback_v1(self, req: Any, **_: Any) -> Response:
        return self._no_route(req)

    @route("modelcast_fallback_metrics", "/metrics")
    @endpoint()
    def zz_fallback_metrics(self, req: Any, **_: Any) -> Response:
        return self._no_route(req)

    def _no_route(self, req: Any) -> Response:
        allowed = []
        for method in _METHODS:
            env = dict(req.environ, REQUEST_METHOD=method)
            match = self.parent.mapper.match(environ=env) if self.parent is not None else None
            if match and not str(match.get("action", "")).startswith("zz_"):
                allowed.append(method)
        if allowed:
            raise ApiError(405, f"{req.method} is not allowed on {req.path}; use {', '.join(allowed)}",
                           {"allowed": allowed}, {"Allow": ", ".join(allowed)})
        raise ApiError(404, f"no such route: {req.method} {req.path}")


def routes() -> list[tuple[str, str]]:
    """(METHOD, path) of every API route, for the docs test and the app's log line."""
    out = []
    for name in sorted(vars(RestApi)):
        info = getattr(getattr(RestApi, name), "routing_info", None)
        if info and info.get("methods") and not name.startswith("zz_"):
            out += [(m, info["path"]) for m in info["methods"]]
    return out
