"""The REST server does not keep what its connections leave behind: each connection
eventlet serves ends as a reference cycle that only the garbage collector frees, and the
controller collects its older generations rarely (``controller.core.tune_gc``). Agents
open a connection per call, so the instance they ask first grew ~5 MB of RSS a minute
until ``controller.webserver.ClientPool`` collected them as connections close."""

from __future__ import annotations

import gc
from typing import Iterator

import eventlet
import eventlet.wsgi
import pytest
from eventlet.green.http import client as http_client
from eventlet.wsgi import HttpProtocol

from controller import webserver
from controller.core import tune_gc
from tests.support.controller_env import AUTH, Api, TOKEN, make_env

CONNECTIONS = 3000
BATCH = 30  # connections open at once


@pytest.fixture
def controller_gc() -> Iterator[None]:
    """The controller's collector thresholds for the test, the interpreter's after."""
    before = gc.get_threshold()
    gc.collect()
    tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.collect()


def live(kind: type) -> int:
    """Objects of ``kind`` the collector tracks, without collecting first."""
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def test_connections_served_do_not_accumulate(controller_gc: None) -> None:
    env = make_env(token=TOKEN)
    app = Api(env).app
    gid = Api(env).json("POST", "/v1/groups", {"model": "m", "source": env.ips[0],
                                               "receivers": [env.ips[1]]}, status=201)["id"]
    listener = eventlet.listen(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    pool = webserver.ClientPool(256, 64, 30.0)
    with open("/dev/null", "w") as devnull:
        server = eventlet.spawn(eventlet.wsgi.server, listener, app, log=devnull, custom_pool=pool,
                                keepalive=30.0, socket_timeout=30.0, debug=False)
        try:
            etag = None
            for _ in range(CONNECTIONS // BATCH):
                conns = []
                for i in range(BATCH):  # one call per connection, as agents make them
                    conn = http_client.HTTPConnection("127.0.0.1", port)
                    headers = dict(AUTH)
                    if etag is not None and i % 2:
                        headers.update({"If-None-Match": etag, "Prefer": "wait=0"})
                    conn.request("GET", f"/v1/groups/{gid}" if i % 3 else "/v1/offers?model=m",
                                 headers=headers)
                    resp = conn.getresponse()
                    resp.read()
                    assert resp.status in (200, 304)
                    etag = resp.getheader("ETag") or etag
                    conns.append(conn)
                # the controller's other work collects the youngest generation while
                # these connections are open (a real controller allocates all the time)
                gc.collect(0)
                for conn in conns:
                    conn.close()
                eventlet.sleep(0.01)
            eventlet.sleep(0.1)  # (the server's side of the last connections closes)
            assert sum(pool.open.values()) == 0
            # what the server still holds of the connections it served: bounded by the
            # collection interval, not by how many it served
            assert live(HttpProtocol) <= 2 * webserver.COLLECT_EVERY
        finally:
            server.kill()
            listener.close()
