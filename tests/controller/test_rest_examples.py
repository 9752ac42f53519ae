"""The documented REST examples (``docs/rest.md``), run as written with the real ``curl``
against a real ``modelcast-controller``: when the docs and the API drift apart, this fails.

The examples are every ``curl`` line of the page's fenced code blocks (``\\``
continuations joined); a ``# -> ...`` comment under one is its documented response. A
``curl`` line the README shows must be one of them, so the front page runs as written too.
What the test changes, and nothing else:

* ``localhost:8080`` becomes the test controller's ``127.0.0.1:<free port>``
  (``DOC_ADDRESS``);
* the controller's token is the one the block's ``H='Authorization: Bearer ...'`` names;
* ``curl`` is a shell function running the real binary with ``-q -S --write-out`` added,
  so the status and Content-Type come back on stderr; the page's arguments pass as
  they are;
* the controller starts from a state file holding ``default_topology()`` (the
  leaf-spine fabric whose hosts are the examples' 10.0.0.1-6): with no switch connected
  it cannot learn hosts from packets, and creating a group needs known hosts;
* no switch is connected, so the switches confirm nothing: where the page shows
  ``"installed"``, the controller here answers ``"pending"`` (``NO_SWITCHES``).

``EXPECTED`` lists every example, in the page's order, with the statuses it documents and
what else its comment promises; each JSON answer must also match the OpenAPI response
schema for its status.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import controller.rest as rest
from lab.controller import Controller
from tests.support.controller_env import default_topology, real_controller
from tests.support.lab import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
REST_DOC = ROOT / "docs" / "rest.md"
README = ROOT / "README.md"
DOC_ADDRESS = "localhost:8080"
NO_SWITCHES = {"installed": "pending"}
# %{stderr} in --write-out needs curl >= 7.63; -q (first) ignores any ~/.curlrc
CURL_WRAPPER = 'curl() { command curl -q -S --write-out "%{stderr}%{http_code} %{content_type}" "$@"; }'
# the page's response notation: `[...]` / `{...}` any list / object, "<text>" any
# string, a trailing `, ...` in an object: more members follow
_ANY_LIST, _ANY_OBJECT, _ANY_STRING, _MORE = "\x00[...]", "\x00{...}", "\x00<string>", "\x00more"


@dataclass
class Example:
    """One documented curl line and what the page says about it."""

    command: str
    prelude: list[str]  # the block's shell lines before it that are not curl (H=...)
    method: str
    path: str  # with the query, as in the URL
    body: Any  # the -d JSON, or None
    comment: str  # the command line's trailing comment
    response: str | None = None  # the "# -> ..." notation under it

    @property
    def key(self) -> str:
        return f"{self.method} {self.path}"


def fenced_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced code block, ``\\`` continuations joined."""
    return [re.sub(r"\s*\\\n\s*", " ", body).splitlines()
            for body in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)]


def parse_curl(command: str, prelude: list[str]) -> Example:
    """Method, path, JSON body and trailing comment of one curl command line; an option
    this parser does not know fails the test rather than being misread."""
    tokens = shlex.split(command)
    cut = next((i for i, t in enumerate(tokens) if t.startswith("#")), len(tokens))
    args, comment = tokens[1:cut], " ".join(tokens[cut:]).lstrip("#").strip()
    method, data, url = None, None, None
    it = iter(args)
    for arg in it:
        if arg == "-X":
            method = next(it)
        elif arg in ("-d", "--data"):
            data = next(it)
        elif arg == "-H":
            next(it)
        elif arg == "-s":
            continue
        elif not arg.startswith("-") and url is None:
            url = arg
        else:
            raise AssertionError(f"REST example {command!r}: unexpected curl argument {arg!r}")
    assert url and url.startswith(DOC_ADDRESS + "/"), f"{command!r}: URL not on {DOC_ADDRESS}"
    return Example(command, list(prelude), method or ("POST" if data is not None else "GET"),
                   url[len(DOC_ADDRESS):], json.loads(data) if data is not None else None, comment)


def curl_examples(text: str) -> list[Example]:
    """Every curl example of a Markdown page, in order, with its documented response. In a
    block with examples, the other shell lines may only set variables (``H=...``): they
    run before each example, so anything else there would run unseen."""
    out: list[Example] = []
    for lines in fenced_blocks(text):
        if not any(line.startswith("curl ") for line in lines):
            continue
        prelude: list[str] = []
        last: Example | None = None
        in_response = False
        for line in lines:
            if line.startswith("curl "):
                last = parse_curl(line, prelude)
                out.append(last)
                in_response = False
            elif line.startswith("# ->") and last is not None:
                last.response = line[len("# ->"):]
                in_response = True
            elif in_response and re.match(r"#\s{2,}\S", line):
                assert last is not None and last.response is not None
                last.response += " " + line[1:].strip()
            elif line.startswith("#") or not line.strip():
                in_response = False
            else:
                assert re.match(r"[A-Za-z_]\w*=", line), f"curl block: {line!r} is not an example"
                prelude.append(line)
    return out


# -- documented responses ----------------------------------------------------------------
def template(notation: str) -> Any:
    """The page's response notation as JSON with sentinels, ``NO_SWITCHES`` applied."""
    text = notation.replace("[...]", json.dumps(_ANY_LIST)).replace("{...}", json.dumps(_ANY_OBJECT))
    text = re.sub(r",\s*\.\.\.\s*}", lambda _: f", {json.dumps(_MORE)}: null}}", text)
    text = re.sub(r'"<[^"<>]*>"', lambda _: json.dumps(_ANY_STRING), text)
    return _substitute(json.loads(text))


def _substitute(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _substitute(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v) for v in value]
    return NO_SWITCHES.get(value, value) if isinstance(value, str) else value


def assert_matches(want: Any, got: Any, where: str = "") -> None:
    """``got`` is what ``want`` (a ``template``) documents; the message names where not."""
    if want == _ANY_LIST:
        assert isinstance(got, list), f"{where or '/'}: want a list, got {got!r}"
    elif want == _ANY_OBJECT:
        assert isinstance(got, dict), f"{where or '/'}: want an object, got {got!r}"
    elif want == _ANY_STRING:
        assert isinstance(got, str), f"{where or '/'}: want a string, got {got!r}"
    elif isinstance(want, dict):
        assert isinstance(got, dict), f"{where or '/'}: want an object, got {got!r}"
        keys = set(want) - {_MORE}
        if _MORE not in want:
            assert set(got) == keys, f"{where or '/'}: members {sorted(got)}, the docs show {sorted(keys)}"
        for k in keys:
            assert k in got, f"{where}/{k}: documented, missing from the answer"
            assert_matches(want[k], got[k], f"{where}/{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: want {want!r}, got {got!r}"
        for i, (w, g) in enumerate(zip(want, got)):
            assert_matches(w, g, f"{where}/{i}")
    else:
        assert got == want, f"{where or '/'}: the docs show {want!r}, the controller answered {got!r}"


def assert_openapi_shape(ex: Example, status: int, content_type: str, body: Any) -> None:
    """The status is one the OpenAPI document lists for the operation, and a JSON answer
    matches the schema it documents for that status."""
    doc = rest.openapi()
    path = ex.path.split("?")[0]
    template_path = next((p for p in doc["paths"]
                          if re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", p), path)), None)
    assert template_path, f"{ex.key}: no such path in openapi.json"
    op = doc["paths"][template_path].get(ex.method.lower())
    assert op, f"{ex.key}: openapi.json has no {ex.method} on {template_path}"
    response = op["responses"].get(str(status))
    assert response is not None, f"{ex.key}: status {status} is not documented in openapi.json"
    if "$ref" in response:
        response = doc["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    content = response.get("content", {})
    if status == 204:
        assert not content and body == "", f"{ex.key}: 204 with a body {body!r}"
        return
    assert content_type.split(";")[0] in {c.split(";")[0] for c in content}, (ex.key, content_type)
    schema = content.get("application/json", {}).get("schema", {})
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        errors = [e.message for e in rest.validator(ref.rsplit("/", 1)[1]).iter_errors(body)]
        assert not errors, f"{ex.key}: answer does not match {ref}: {errors}"


# -- what each example's comment promises, beyond status and schema ----------------------
@dataclass
class Expect:
    """The statuses of successive runs of one example (the test runs it once per status)
    and a check of its last answer against what its comment says."""

    statuses: tuple[int, ...]
    check: Callable[[Example, Any, Controller], None] = lambda ex, body, ctl: None


def _receiver_joined(ex: Example, group: Any, ctl: Controller) -> None:
    assert ex.path.rsplit("/", 1)[1] in group["receivers"], group


def _receiver_left(ex: Example, group: Any, ctl: Controller) -> None:
    assert ex.path.rsplit("/", 1)[1] not in group["receivers"], group


def _list_filters(ex: Example, groups: Any, ctl: Controller) -> None:
    """Every filter the comment names narrows the list: the group's own value keeps it,
    another value drops it."""
    assert [g["id"] for g in groups] == [1], groups
    assert "no key without a token" in ex.comment and all("key" not in g for g in groups)
    names = re.findall(r"[?&](\w+)=", ex.comment)
    assert names, f"{ex.key}: the comment names no filters: {ex.comment!r}"
    for name in names:
        assert name in groups[0], f"{ex.key}: the comment names a filter {name!r}; groups have no such member"
        mine = ctl.api("GET", ex.path, params={name: groups[0][name]})
        assert mine.status_code == 200 and [g["id"] for g in mine.json()] == [1], (name, mine.text)
        other = ctl.api("GET", ex.path, params={name: "10.9.9.9"})
        assert other.status_code == 200 and other.json() == [], (name, other.text)


def _one_group(ex: Example, group: Any, ctl: Controller) -> None:
    assert group["id"] == int(ex.path.rsplit("/", 1)[1]), group
    assert "key" not in group  # the example reads it without a token


def _rekeyed(ex: Example, group: Any, ctl: Controller) -> None:
    """A fresh key: the one receivers get by joining again, unseen without a token; and
    the announced transfer, seen by anyone."""
    assert group["id"] == 1 and len(group["key"]) == 64, group
    assert ctl.api("PUT", "/v1/groups/1/receivers/10.0.0.5").json()["key"] == group["key"]
    anonymous = ctl.api("GET", "/v1/groups/1", headers={"Authorization": ""}).json()
    assert "key" not in anonymous
    assert {k: anonymous[k] for k in ex.body} == ex.body  # session and file_digest


def _pinned(ex: Example, group: Any, ctl: Controller) -> None:
    assert group["id"] == 1 and group["pinned"] is True, group
    assert ctl.api("GET", "/v1/groups/1").json()["pinned"] is True


def _rule_added(ex: Example, rule: Any, ctl: Controller) -> None:
    """The rule as posted, with its id; posting it again replaced it (same id)."""
    assert rule == {"id": 1, **ex.body}, rule


def _rules_listed(ex: Example, rules: Any, ctl: Controller) -> None:
    assert [r["model"] for r in rules] == ["blake3:5f1c"], rules
    # "who may offer": a host token not named there is refused (the admin offers below)
    assert rules[0]["offer"] == ["10.0.0.1"] and rules[0]["join"] == ["10.0.0.0/24"]


def _group_gone(ex: Example, body: Any, ctl: Controller) -> None:
    assert ctl.api("GET", ex.path).status_code == 404


def _offered(ex: Example, offer: Any, ctl: Controller) -> None:
    assert offer["id"] == 1 and {k: offer[k] for k in ex.body} == ex.body, offer


def _offers_listed(ex: Example, offers: Any, ctl: Controller) -> None:
    """"who serves it, and the id of its group (or null)": the group was deleted above."""
    assert [(o["id"], o["source"], o["group"]) for o in offers] == [(1, "10.0.0.1", None)], offers
    assert ctl.api("GET", "/v1/offers", params={"model": "blake3:other"}).json() == []


def _offer_gone(ex: Example, body: Any, ctl: Controller) -> None:
    assert ctl.api("GET", ex.path).status_code == 404 and ctl.api("GET", "/v1/offers").json() == []


def _host_declared(ex: Example, host: Any, ctl: Controller) -> None:
    assert host == ex.body
    assert ex.body in ctl.client.topology()["hosts"]


def _topology(ex: Example, topo: Any, ctl: Controller) -> None:
    """"switches, links (with ports), hosts": the fabric from the state file."""
    assert set(topo) == {"switches", "links", "hosts"}
    fabric = default_topology()
    assert topo["switches"] == sorted(fabric.switches) and len(topo["links"]) == len(fabric.links)
    assert all({"a_port", "b_port"} <= set(link) for link in topo["links"]), topo["links"]


def _health(ex: Example, health: Any, ctl: Controller) -> None:
    """The restored fabric's switches; the group the examples created is deleted by now."""
    assert health["status"] == "ok" and health["groups"] == 0
    assert health["switches"] == len(default_topology().switches)


def _group_story(ex: Example, answer: Any, ctl: Controller) -> None:
    """"what happened to group 1": the examples' group from its creation to its deletion."""
    kinds = [e["kind"] for e in answer["events"]]
    assert kinds[0] == "group_created" and "join" in kinds and "leave" in kinds and kinds[-1] == "group_deleted", kinds
    assert all(e.get("group") == 1 or 1 in e.get("groups", ()) for e in answer["events"]), answer


def _metric_families(ex: Example, text: Any, ctl: Controller) -> None:
    """Every word after "Prometheus:" names a modelcast metric family."""
    words = re.findall(r"\w+", ex.comment.split("Prometheus:", 1)[1])
    families = re.findall(r"^# TYPE (modelcast_\w+) ", text, re.M)
    for word in words:
        assert any(word in f for f in families), f"no modelcast metric for {word!r} in {families}"


EXPECTED: dict[str, Expect] = {
    "POST /v1/groups": Expect((201, 200)),  # "201 (new) or 200 (existing)"
    "PUT /v1/groups/1/receivers/10.0.0.5": Expect((200,), _receiver_joined),
    "DELETE /v1/groups/1/receivers/10.0.0.3": Expect((200,), _receiver_left),
    "GET /v1/groups": Expect((200,), _list_filters),
    "GET /v1/groups/1": Expect((200,), _one_group),
    "POST /v1/groups/1/rekey": Expect((200,), _rekeyed),
    "PUT /v1/groups/1/pin": Expect((200,), _pinned),
    "DELETE /v1/groups/1": Expect((204,), _group_gone),
    "POST /v1/acl": Expect((201, 200), _rule_added),  # one rule per pattern: posting it again replaces it
    "GET /v1/acl": Expect((200,), _rules_listed),
    "POST /v1/offers": Expect((201, 200), _offered),  # modelcast serve's registration, idempotent
    "GET /v1/offers?model=blake3:5f1c": Expect((200,), _offers_listed),
    "DELETE /v1/offers/1": Expect((204,), _offer_gone),
    "POST /v1/hosts": Expect((201,), _host_declared),
    "GET /v1/topology": Expect((200,), _topology),
    "GET /v1/health": Expect((200,), _health),
    "GET /metrics": Expect((200,), _metric_families),
    "GET /v1/events?since=0&group=1": Expect((200,), _group_story),
}


# -- running them -------------------------------------------------------------------------
def example_token(examples: list[Example]) -> str:
    """The bearer token the examples send."""
    tokens = {m for ex in examples for line in ex.prelude
              for m in re.findall(r"Authorization: Bearer ([^'\"\s]+)", line)}
    assert len(tokens) == 1, f"the examples should use one bearer token, found {tokens}"
    return tokens.pop()


def run_curl(ex: Example, ctl: Controller) -> tuple[int, str, str]:
    """Run the example with sh and the real curl: (status, Content-Type, body)."""
    script = "\n".join([CURL_WRAPPER, *ex.prelude,
                        ex.command.replace(DOC_ADDRESS, f"127.0.0.1:{ctl.rest_port}")])
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    proc = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env=env)
    m = re.search(r"(\d{3}) ([^\n]*)\Z", proc.stderr)
    assert proc.returncode == 0 and m, f"{ex.command}\nrc {proc.returncode}\n{proc.stderr}"
    return int(m.group(1)), m.group(2), proc.stdout


@pytest.fixture
def examples() -> list[Example]:
    """The curl examples of docs/rest.md as the file is now."""
    return curl_examples(REST_DOC.read_text(encoding="utf-8"))


@pytest.fixture
def controller(tmp_path: Path, examples: list[Example]) -> Iterator[Controller]:
    """A real controller that knows the examples' hosts (from its state file)."""
    if shutil.which("curl") is None:
        skip_or_fail("curl is not installed; the REST examples need it (apt-get install curl)")
    with real_controller(tmp_path, example_token(examples)) as ctl:
        yield ctl


def test_every_rest_example_has_a_documented_outcome(examples):
    """A new, changed or removed example must change ``EXPECTED`` too."""
    assert [ex.key for ex in examples] == list(EXPECTED), \
        "the curl examples of docs/rest.md changed: update EXPECTED with what each one documents"
    assert [ex.key for ex in examples if ex.response] == ["POST /v1/groups", "POST /v1/groups/1/rekey"]


def test_the_readme_shows_only_examples_that_run_here(examples):
    """The README's quick start shows curl lines of this page (with its token), so they
    run as written below; one it shows that is not here would never be run."""
    documented = {" ".join(ex.command.split()) for ex in examples}
    shown = curl_examples(README.read_text(encoding="utf-8"))
    assert shown, "the README shows no curl example: nothing to hold to docs/rest.md"
    for ex in shown:
        assert " ".join(ex.command.split()) in documented, \
            f"README example {ex.command!r} is not one of docs/rest.md's (which the test runs)"
        assert example_token([ex]) == example_token(examples), f"README example {ex.command!r}: another token"


def test_rest_curl_examples_run_as_documented(examples, controller):
    """In the page's order (each builds on the last): the documented statuses, the OpenAPI
    shape of every answer, the ``# ->`` response and what each comment promises."""
    for ex in examples:
        expect = EXPECTED[ex.key]
        for status_wanted in expect.statuses:
            status, ctype, text = run_curl(ex, controller)
            assert status == status_wanted, f"{ex.command}\n-> {status} {text}"
            body: Any = json.loads(text) if ctype.startswith("application/json") else text
            assert_openapi_shape(ex, status, ctype, body)
            if ex.response is not None:
                assert_matches(template(ex.response), body)
        expect.check(ex, body, controller)
