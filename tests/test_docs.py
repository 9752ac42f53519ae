"""The documentation: the MkDocs site builds with ``--strict`` (a broken link, a missing
anchor or a page left out of the nav fails), it has the pages the README promises, and
the README stays a front page (short, every link into the docs landing on a built page).

The REST examples of ``docs/rest.md`` are run against a real controller by
``tests/controller/test_rest_examples.py``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.lab import skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 250
MIN_PAGES = 8


def built_site(out: Path) -> list[Path]:
    """Build the site into ``out`` as ``make docs`` does; the HTML pages it wrote."""
    for module in ("mkdocs", "material"):
        if importlib.util.find_spec(module) is None:
            skip_or_fail(f"{module} is not installed (the venv's docs extra: pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return sorted(p for p in out.rglob("index.html"))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("site")
    return out, built_site(out)


def test_the_site_builds_strict_with_every_page(site):
    """At least the pages the README links to, each a real page with a title and text."""
    out, pages = site
    assert len(pages) >= MIN_PAGES, f"{len(pages)} pages built: {[str(p.relative_to(out)) for p in pages]}"
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert re.search(r"<h1[^>]*>", html), f"{page.relative_to(out)}: no heading"
        text = re.sub(r"<[^>]+>", " ", html.split('<article', 1)[-1])
        assert len(text.split()) > 100, f"{page.relative_to(out)}: nearly empty"


def test_the_readme_is_a_front_page_linking_into_the_built_site(site):
    """Short, and every ``docs/...md`` link of the README is a page of the site (mkdocs
    checks the links between pages; the README is not one of them)."""
    out, pages = site
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"
    links = re.findall(r"\]\((docs/[^)#]+\.md)(?:#[^)]*)?\)", text)
    assert links, "the README links to no documentation page"
    for link in links:
        page = Path(link).relative_to("docs").with_suffix("")
        built = out / "index.html" if page.name == "index" else out / page / "index.html"
        assert built in pages, f"README links to {link}, which the site does not build"


def test_docs_hold_no_dated_or_before_after_files():
    """docs/ describes what is: one result set per benchmark, no dated series, no
    before/after folders (git keeps those)."""
    stale = [str(p.relative_to(ROOT)) for p in DOCS.rglob("*")
             if re.search(r"\d{4}-\d{2}-\d{2}|before|after|history", p.name)]
    assert not stale, f"dated or before/after files under docs/: {stale}"


def test_every_file_the_docs_and_the_readme_cite_exists() -> None:
    """A path in backquotes (``tests/...``, ``controller/...``) names a file that is
    there: tests and modules move, and a page must not send a reader to nothing."""
    cited = re.compile(r"`((?:tests|controller|hostagent|lab|bench|topologies|scripts)/[\w/.*-]+\.(?:py|c|json|sh))")
    missing, seen = [], 0
    for page in [README, *DOCS.rglob("*.md")]:
        for path in cited.findall(page.read_text(encoding="utf-8")):
            seen += 1
            if not list(ROOT.glob(path)):
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert seen > 20  # (the pattern still finds the pages' citations)
    assert not missing, "\n".join(missing)
