"""The agent commands the README and the docs show, held to the real ``modelcast``
parser: every ``modelcast ...`` line of a fenced code block (``\\`` continuations joined,
a trailing ``# comment`` cut, a standalone ``...`` read as "the options above") must parse
with ``hostagent.cli.build_parser()`` -- its options exist, its required ones are there --
and pass the checks the CLI makes before it runs (a group needs a key file or
``--insecure``; a controller receiver needs ``--model`` or ``--expect``). No example puts
a token in argv (``ps`` shows argv to every user): they use ``--token-file`` or
``$MODELCAST_TOKEN``.

``tests/lab/test_newcomer.py`` runs the README's quick start on a lab. The REST
(``curl``) examples are ``tests/controller/test_rest_examples.py``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from hostagent.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELIDED = "..."  # "and the options shown above", where a page abbreviates


@dataclass
class AgentExample:
    page: str
    line: int
    command: str

    @property
    def argv(self) -> list[str]:
        tokens = shlex.split(self.command, comments=True)
        assert tokens[0] == "modelcast", self
        return [t for t in tokens[1:] if t != ELIDED]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.command}"


def agent_examples(page: Path) -> list[AgentExample]:
    """Every ``modelcast`` command line in the page's fenced code blocks."""
    text = page.read_text(encoding="utf-8")
    found = []
    for block in re.finditer(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S):
        first = text.count("\n", 0, block.start(1)) + 1
        lines = block.group(1).split("\n")
        i = 0
        while i < len(lines):
            start, command = i, lines[i]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1].rstrip() + " " + lines[i].strip()
            if command.startswith("modelcast "):
                found.append(AgentExample(str(page.relative_to(ROOT)), first + start, command))
            i += 1
    return found


EXAMPLES = [ex for page in PAGES for ex in agent_examples(page)]


def parse(example: AgentExample) -> argparse.Namespace:
    """The example's arguments as the CLI parses them; a usage error fails with the
    parser's own message."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(example.argv)
        except SystemExit:
            pass
    pytest.fail(f"{example}\n  does not parse: {err.getvalue().strip().splitlines()[-1]}")


def test_the_pages_show_every_command() -> None:
    """The extraction still finds the examples: each command is shown somewhere."""
    assert len(EXAMPLES) >= 20
    shown = {ex.argv[0] for ex in EXAMPLES}
    assert {"send", "recv", "serve", "fetch", "catalog", "ls", "keygen"} <= shown, shown


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_an_agent_example_parses_and_would_run(example: AgentExample) -> None:
    args = parse(example)
    if args.command in ("send", "recv"):
        if args.group:
            assert args.key_file or args.insecure, f"{example}\n  --group needs --key-file (or --insecure)"
        if args.command == "recv" and args.controller:
            assert args.model or args.expect, f"{example}\n  a controller receiver needs --model or --expect"
    assert getattr(args, "token", None) is None, \
        f"{example}\n  puts the token in argv, where ps shows it: use --token-file or $MODELCAST_TOKEN"
