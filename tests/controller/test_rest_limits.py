"""Hostile request bodies and methods cost the controller bounded, linear work: the body
cap, the nesting limit, linear validation, chunked bodies, and HTTP methods that cannot
become new Prometheus series. The timing test runs against a real ``modelcast-controller``
(its eventlet server, validation, core and state file), as a client would meet it."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

import controller.rest as rest
from lab.controller import Controller
from tests.support.controller_env import TOKEN, Api, S, make_env, real_controller

BUDGET_S = 0.100  # the bound for a hostile body, per request
JSON = {"Content-Type": "application/json"}


def create_body(size: int, last: str | None = None, model: str = "big") -> bytes:
    """A group create naming as many distinct receivers as fit in ``size`` bytes; ``last``
    replaces the final receiver (a duplicate or a bad address: found only at the end)."""
    receivers: list[str] = []
    total = len(json.dumps({"model": model, "source": S, "receivers": []}))
    while True:
        i = len(receivers)
        ip = f"10.{1 + i // 62500}.{(i // 250) % 250}.{1 + i % 250}"
        if total + len(ip) + 4 > size:
            break
        receivers.append(ip)
        total += len(ip) + 4
    if last is not None:
        receivers[-1] = last
    return json.dumps({"model": model, "source": S, "receivers": receivers}).encode()


def nested_body(size: int) -> bytes:
    n = (size - 60) // 2
    return b'{"model": "m", "source": "10.0.0.1", "x": ' + b"[" * n + b"]" * n + b"}"


# ---------------------------------------------------------------------- in process


@pytest.fixture
def api() -> Api:
    return Api(make_env(token=TOKEN))


def test_body_cap_is_sized_to_the_api(api):
    assert rest.MAX_BODY == 256 << 10
    biggest = create_body(rest.MAX_BODY)
    assert len(biggest) > rest.MAX_BODY - 20 and len(json.loads(biggest)["receivers"]) > 18_000
    assert api.call("POST", "/v1/groups", raw=biggest).status_code == 201
    err = api.json("POST", "/v1/groups", raw=b" " * (rest.MAX_BODY + 1), status=413)
    assert "larger than 262144 bytes" in err["error"]


@pytest.mark.parametrize("raw", [
    nested_body(200_000),  # beyond the JSON parser's own recursion limit
    b'{"model": "m", "source": "10.0.0.1", "x": ' + b"[" * 33 + b"]" * 33 + b"}",
    b'{"model": ' + b'{"a": ' * 40 + b"1" + b"}" * 40 + b', "source": "10.0.0.1"}',
])
def test_deep_nesting_is_a_400_not_a_500(api, raw):
    err = api.json("POST", "/v1/groups", raw=raw, status=400)
    assert err["error"] == "request body nests deeper than 32 levels"
    assert api.env.core.groups == {}


def test_nesting_within_the_limit_reaches_the_schema(api):
    raw = b'{"model": "m", "source": "10.0.0.1", "x": ' + b"[" * 30 + b"]" * 30 + b"}"
    assert "Additional properties" in api.json("POST", "/v1/groups", raw=raw, status=400)["error"]


def test_address_items_are_checked_in_one_pass_with_jsonschemas_words(api):
    """The receivers' items are checked by hand (linear), with the same answer the
    schema gives: path, message, and the schema path of the rule."""
    for bad, words in ((7, "7 is not of type 'string'"), ("10.0.0.256", "'10.0.0.256' is not a 'ipv4'"),
                       ("010.0.0.1", "is not a 'ipv4'")):
        err = api.json("POST", "/v1/groups", {"model": "m", "source": S, "receivers": ["10.0.0.3", bad]}, 400)
        assert err["detail"]["path"] == "/receivers/1" and words in err["detail"]["message"], err
        assert err["detail"]["schema_path"] == "properties/receivers/items"
        assert list(rest.validator("GroupCreate").iter_errors(
            {"model": "m", "source": S, "receivers": [bad]})), "the full schema agrees"
    assert "twice" in api.json("POST", "/v1/groups", {"model": "m", "source": S,
                                                       "receivers": ["10.0.0.3"] * 2}, 400)["error"]
    assert "uniqueItems" not in rest.openapi_bytes().decode()  # quadratic in jsonschema


def test_unknown_http_methods_share_one_metrics_label(api):
    for i in range(50):
        assert api.call(f"X{i}", "/v1/groups").status_code == 405
    text = api.call("GET", "/metrics").text
    methods = set(re.findall(r'modelcast_rest_requests_total\{method="([^"]*)"', text))
    assert methods == {"other"}, methods  # (this GET is counted after it answers)
    assert re.search(r'modelcast_rest_requests_total\{method="other",status="405"\} 50\.0', text)


# ---------------------------------------------------------------------- a real controller


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    with real_controller(Path(tmp_path_factory.mktemp("limits")), TOKEN) as ctl:
        yield ctl


def timed(ctl: Controller, make: Callable[[int], bytes], tries: int = 3) -> tuple[float, list[int]]:
    """The fastest of ``tries`` POSTs of ``make(try)`` (wall time at the client, on
    loopback: a slow outlier on a busy CI machine is not the controller's work) and the
    statuses."""
    best, statuses = float("inf"), []
    for i in range(tries):
        raw = make(i)
        t0 = time.perf_counter()
        resp = ctl.api("POST", "/v1/groups", data=raw, headers=dict(JSON))
        best = min(best, time.perf_counter() - t0)
        statuses.append(resp.status_code)
    return best, statuses


@pytest.mark.parametrize("size", [25_000, 256 << 10], ids=["25KB", "256KB"])
@pytest.mark.parametrize("kind, status", [("valid", 201), ("duplicate-last", 400),
                                          ("bad-address-last", 400), ("nested", 400)])
def test_a_hostile_body_is_answered_within_100_ms(controller, size, kind, status):
    """The issue's timing bound. Before: a 25 KB create with ``uniqueItems`` held the hub
    (REST and OpenFlow) for 10 s. "valid" creates a new group each time (~1,800 or
    ~18,000 receivers, saved to the state file before the answer)."""
    controller.api("GET", "/v1/health")  # warm: the validators are built on first use
    make = {"valid": lambda i: create_body(size, model=f"{size}-{i}"),
            "duplicate-last": lambda i: create_body(size, last="10.1.0.1"),
            "bad-address-last": lambda i: create_body(size, last="10.0.0.999"),
            "nested": lambda i: nested_body(size)}[kind]
    assert size - 60 <= len(make(0)) <= size
    tries = 5 if kind == "valid" else 3  # (the fastest of five: one slow outlier on a busy CI machine is noise)
    took, statuses = timed(controller, make, tries)
    assert statuses == [status] * tries
    budget = BUDGET_S
    if kind == "valid":
        # A valid create does real work (a tree to ~18,000 receivers, the state saved;
        # parsing and validating the 256 KB body, answering with every receiver). The
        # bound is then three times the same request through the same REST app
        # in-process, timed in this run: what must not happen is the hub held beyond the
        # work (the quadratic validator held it 10 s).
        budget = max(BUDGET_S, 3 * in_process_create(json.loads(make(0))))
    print(f"{kind} {len(make(0))} bytes: {took * 1000:.1f} ms (bound {budget * 1000:.0f} ms)")
    assert took < budget, f"{kind} body of {len(make(0))} bytes took {took * 1000:.0f} ms"


def in_process_create(body: dict) -> float:
    """The fastest of three creates of ``body`` (renamed each time) through the same REST
    app in this process: the controller's own work for that request (decoding,
    validating, creating, answering), without the socket. (The service call alone left
    out the body's decoding and validation and the answer's encoding, ~2/3 of a 256 KB
    create's time: when the core got faster the bound fell to 100 ms while those did not,
    and a busy machine's request took 100.2 ms.)"""
    api, best = Api(make_env(token=TOKEN)), float("inf")
    for i in range(3):
        raw = json.dumps(dict(body, model=f"{body['model']}-ref{i}")).encode()
        t0 = time.perf_counter()
        resp = api.call("POST", "/v1/groups", raw=raw)
        best = min(best, time.perf_counter() - t0)
        assert resp.status_code == 201, resp.body[:200]
    return best


def test_chunked_bodies_are_read(controller):
    body = json.dumps({"model": "chunked", "source": S, "receivers": ["10.0.0.3"]}).encode()
    resp = controller.api("POST", "/v1/groups", data=iter([body[:10], body[10:]]), headers=dict(JSON))
    assert resp.request.headers.get("Transfer-Encoding") == "chunked"
    assert resp.status_code == 201, resp.text
    assert resp.json()["receivers"] == {"10.0.0.3": "pending"}
    huge = controller.api("POST", "/v1/groups", data=iter([b" " * 65536] * 5), headers=dict(JSON))
    assert huge.status_code == 413 and "larger than" in huge.json()["error"]


def test_an_oversized_body_is_refused_before_it_is_read(controller):
    t0 = time.perf_counter()
    resp = controller.api("POST", "/v1/groups", data=b"[" * (8 << 20), headers=dict(JSON))
    assert resp.status_code == 413 and time.perf_counter() - t0 < 2
    assert controller.api("GET", "/v1/health").status_code == 200
