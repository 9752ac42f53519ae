"""The agent commands (``modelcast ...``) a Markdown page shows in its fenced code blocks,
as tests read them: ``tests/hostagent/test_agent_examples.py`` parses each one, and
``tests/lab/test_newcomer.py`` runs the README's on a lab (and its ``modelcast-controller``
lines, read the same way)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ELIDED = "..."  # "and the options shown above", where a page abbreviates


@dataclass
class AgentExample:
    """One ``modelcast`` (or ``modelcast-controller``) command line of a page (``\\``
    continuations joined)."""

    page: str
    line: int
    command: str

    @property
    def program(self) -> str:
        """The command it runs (``modelcast``, ``modelcast-controller``)."""
        return self.command.split(" ", 1)[0]

    @property
    def argv(self) -> list[str]:
        """The arguments after the program, a trailing comment and ``...`` left out."""
        return [t for t in shlex.split(self.command, comments=True)[1:] if t != ELIDED]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.command}"


def agent_examples(page: Path, program: str = "modelcast") -> list[AgentExample]:
    """Every ``program`` command line in the page's fenced code blocks, in order."""
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
            if command.startswith(f"{program} "):
                found.append(AgentExample(str(page.relative_to(ROOT)), first + start, command))
            i += 1
    return found
