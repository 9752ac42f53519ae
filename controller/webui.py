"""The live web view's files under /ui/ (a Ryu WSGI controller beside ``RestApi``).

The page (``controller/ui/``: index.html, app.js, style.css, and the graph library
vendored at build time by ``scripts/vendor-ui.sh``) reads the same REST API as any other
client, with the caller's token; this controller only hands out its files. It answers
under the REST GETs' rule (``controller.rest.endpoint``: anonymous callers may read, a
wrong token is a 401) and serves only the files found in ``controller/ui/`` at start
with a known type: a name is looked up in that table, never joined onto a path, so no
request reaches a file outside it (``..``, encoded or not, is simply not a name there).

Registered by the app: ``wsgi.register(WebUi, {"service": service})``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from ryu.app.wsgi import ControllerBase, Response, route

from controller.rest import ApiError, endpoint, etag, if_none_match
from controller.service import Service

UI_DIR = Path(__file__).with_name("ui")
LIBRARY = "vendor/cytoscape.min.js"  # (scripts/vendor-ui.sh puts it there)
# the types served; a file with any other suffix under ui/ is not served
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".LICENSE": "text/plain; charset=utf-8",
}
# The page runs only its own scripts and talks only to this controller: a token kept in
# the page's session storage is not readable by script injected from elsewhere.
# (cytoscape adds a <style> element for its container: styles may be inline.)
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # a new controller's page is fetched again, not taken from the browser's cache
    "Cache-Control": "no-cache",
}


class UiFile:
    """One served file, read once: its bytes, type and ETag."""

    def __init__(self, path: Path, ctype: str) -> None:
        self.body = path.read_bytes()
        self.ctype = ctype
        self.etag = etag(self.body)


def ui_files(root: Path = UI_DIR) -> dict[str, UiFile]:
    """The servable files under ``root`` by their URL name (``vendor/cytoscape.min.js``):
    regular files with a type in CONTENT_TYPES, no hidden ones, none reached through a
    link out of ``root``."""
    out: dict[str, UiFile] = {}
    if not root.is_dir():
        return out
    base = root.resolve()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        ctype = content_type(path.name)
        if (ctype is not None and path.is_file() and path.resolve().is_relative_to(base)
                and not any(part.startswith(".") for part in rel.parts)):
            out[rel.as_posix()] = UiFile(path, ctype)
    return out


@functools.cache
def installed_files() -> dict[str, UiFile]:
    """The package's own files, read at the first request (Ryu makes a controller object
    per request)."""
    return ui_files()


def content_type(name: str) -> str | None:
    """The Content-Type of a served file name, None for a type not served."""
    suffix = name[name.rfind("."):] if "." in name else ""
    return CONTENT_TYPES.get(suffix)


class WebUi(ControllerBase):
    """GET /ui (a redirect), /ui/ (the page) and /ui/<file>."""

    def __init__(self, req: Any, link: Any, data: dict[str, Any], **config: Any) -> None:
        super().__init__(req, link, data, **config)
        self.service: Service = data["service"]
        self.forward = None  # (the REST wrapper's hook for mutations: a read is never forwarded)
        self.files: dict[str, UiFile] = data["files"] if "files" in data else installed_files()

    @route("modelcast_ui_bare", "/ui", methods=["GET"])
    @endpoint()
    def bare(self, req: Any, **_: Any) -> Response:
        """The page's relative links need the trailing slash."""
        resp = Response(status=301)
        resp.headers["Location"] = "/ui/" + (f"?{req.query_string}" if req.query_string else "")
        return resp

    @route("modelcast_ui_index", "/ui/", methods=["GET"])
    @endpoint()
    def index(self, req: Any, **_: Any) -> Response:
        return self._file(req, "index.html")

    @route("modelcast_ui_file", "/ui/{name:.+}", methods=["GET"])
    @endpoint()
    def file(self, req: Any, name: str, **_: Any) -> Response:
        return self._file(req, name)

    def _file(self, req: Any, name: str) -> Response:
        f = self.files.get(name)
        if f is None:
            if name == LIBRARY:
                raise ApiError(404, "the graph library was not vendored into this install: run "
                                    "scripts/vendor-ui.sh before installing the package (scripts/venv.sh does)")
            raise ApiError(404, f"no such file of the web view: {name[:200]!r}")
        resp = Response(status=304) if f.etag in if_none_match(req) else Response(status=200, body=f.body)
        resp.headers["Content-Type"] = f.ctype
        resp.headers["ETag"] = f.etag
        for k, v in SECURITY_HEADERS.items():
            resp.headers[k] = v
        return resp
