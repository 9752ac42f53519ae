"""The web view's files at /ui/ through a real Ryu ``WSGIApplication`` (as the app
registers it, beside the REST API): the right types, nothing outside controller/ui/
served, the REST GETs' token rule, and a page that loads nothing from elsewhere."""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from ryu.app.wsgi import WSGIApplication
from webob import Request

from controller import webui
from controller.rest import RestApi
from controller.webui import WebUi, ui_files
from tests.support.controller_env import AUTH, TOKEN, make_env
from tests.support.lab import skip_or_fail

SECRET = b"not-for-the-browser"


def make_app(files: dict | None = None, token: str | None = TOKEN) -> WSGIApplication:
    """REST and the web view registered as controller/app.py does."""
    service = make_env(token=token).service
    app = WSGIApplication()
    app.register(RestApi, {"service": service})
    app.register(WebUi, {"service": service, **({"files": files} if files is not None else {})})
    return app


def get(app: WSGIApplication, path: str, headers: dict | None = None):
    return Request.blank(path, headers=headers or {}).get_response(app)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A ui/ directory with one file of each type, a hidden file, a file of a type not
    served, a link out of it, and a secret beside it (what traversal would reach)."""
    root = tmp_path / "ui"
    (root / "vendor").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><title>t</title>")
    (root / "app.js").write_text("'use strict';")
    (root / "style.css").write_text("body{}")
    (root / "vendor" / "lib.js").write_text("var lib;")
    (root / "vendor" / "lib.LICENSE").write_text("MIT")
    (root / ".hidden.js").write_text("hidden")
    (root / "notes.py").write_bytes(SECRET)
    (tmp_path / "secret.js").write_bytes(SECRET)
    os.symlink(tmp_path / "secret.js", root / "outside.js")
    return root


def test_each_file_is_served_with_its_type_and_the_page_headers(site):
    app = make_app(ui_files(site))
    want = {"/ui/": "text/html", "/ui/index.html": "text/html", "/ui/app.js": "text/javascript",
            "/ui/style.css": "text/css", "/ui/vendor/lib.js": "text/javascript",
            "/ui/vendor/lib.LICENSE": "text/plain"}
    for path, ctype in want.items():
        resp = get(app, path)
        assert resp.status_code == 200, (path, resp.status)
        assert resp.content_type == ctype and resp.charset == "utf-8", (path, resp.headers)
        name = "index.html" if path == "/ui/" else path.removeprefix("/ui/")
        assert resp.body == (site / name).read_bytes()
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    # /ui without the slash: to the page, the query kept (?token=, ?group=)
    bare = get(app, "/ui?group=3")
    loc = urlsplit(bare.headers["Location"])
    assert bare.status_code == 301 and (loc.path, loc.query) == ("/ui/", "group=3")


def test_an_unchanged_file_is_a_304(site):
    app = make_app(ui_files(site))
    first = get(app, "/ui/app.js")
    again = get(app, "/ui/app.js", {"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and not again.body
    assert get(app, "/ui/app.js", {"If-None-Match": '"other"'}).status_code == 200


@pytest.mark.parametrize("path", [
    "/ui/../secret.js", "/ui/%2e%2e/secret.js", "/ui/..%2fsecret.js", "/ui/vendor/../../secret.js",
    "/ui/outside.js", "/ui/notes.py", "/ui/.hidden.js", "/ui//etc/passwd", "/ui/%2fetc%2fpasswd",
    "/ui/vendor/", "/ui/vendor", "/ui/missing.js", "/ui/index.html%00.js",
])
def test_nothing_outside_the_table_of_files_is_served(site, path):
    """A link out, a hidden file, a type not served, ``..`` plain or encoded: a 404."""
    resp = get(make_app(ui_files(site)), path)
    assert resp.status_code == 404, (path, resp.status)
    assert SECRET not in resp.body and resp.content_type == "application/json"
    assert resp.json["error"]


def test_the_token_rule_is_the_rest_gets(site):
    """Anonymous callers may read (as GET /v1/topology), a valid token is welcome, a
    wrong one is a 401 with the same challenge as REST."""
    app = make_app(ui_files(site))
    for path in ("/ui/", "/ui/app.js", "/v1/topology"):
        assert get(app, path).status_code == 200, path
        assert get(app, path, AUTH).status_code == 200, path
        wrong = get(app, path, {"Authorization": "Bearer not-the-token"})
        assert wrong.status_code == 401, path
        assert wrong.headers["WWW-Authenticate"].startswith('Bearer realm="modelcast"')
        assert b"'use strict'" not in wrong.body


def test_rest_routes_are_untouched_by_the_view(site):
    app = make_app(ui_files(site))
    assert get(app, "/v1/topology", AUTH).json["switches"]
    missing = get(app, "/v1/ui/", AUTH)
    assert missing.status_code == 404 and missing.json["error"].startswith("no such route")
    assert get(app, "/ui/", AUTH).status_code == 200


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.inline_scripts = 0
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        for key in ("src", "href"):
            if a.get(key):
                self.refs.append(a[key])
        self._in_script = tag == "script" and not a.get("src")

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_scripts += 1

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False


def installed() -> dict:
    files = ui_files()
    if webui.LIBRARY not in files:
        skip_or_fail("run scripts/vendor-ui.sh (scripts/venv.sh does)", what="the vendored graph library")
    return files


def test_the_installed_page_loads_only_its_own_files():
    """No CDN at run time: every script and stylesheet the page names is one this
    controller serves, the graph library comes with its licence, and no script is
    inline (the Content-Security-Policy allows none)."""
    files = installed()
    app = make_app()
    page = get(app, "/ui/")
    assert page.status_code == 200 and page.body == files["index.html"].body
    refs = _Refs()
    refs.feed(page.text)
    assert refs.refs and refs.inline_scripts == 0
    for ref in refs.refs:
        if ref.startswith("data:"):  # (inline: the empty icon, so the browser asks no /favicon.ico)
            continue
        assert not re.match(r"^[a-z]+:|^//", ref), f"the page loads {ref} from elsewhere"
        resp = get(app, "/ui/" + ref)
        assert resp.status_code == 200 and resp.body, ref
    assert webui.LIBRARY in refs.refs
    licence = get(app, "/ui/vendor/cytoscape.LICENSE")
    assert licence.status_code == 200 and b"Permission is hereby granted" in licence.body
    assert not re.search(rb"https?://", files["app.js"].body)  # it talks to this controller only


def test_a_missing_library_says_how_to_vendor_it(site):
    resp = get(make_app(ui_files(site)), "/ui/" + webui.LIBRARY)
    assert resp.status_code == 404 and "scripts/vendor-ui.sh" in resp.json["error"]
