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

import pytest

from hostagent.cli import build_parser
from tests.support.doc_examples import PAGES, AgentExample, agent_examples

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


def test_a_command_started_alone_reads_every_example_as_the_whole_cli_does(capsys: pytest.CaptureFixture) -> None:
    """``modelcast COMMAND`` builds only that command's options (a shorter start for every
    agent): each example parses to exactly what the whole command line makes of it, and
    ``modelcast --help`` still lists every command."""
    for example in EXAMPLES:
        assert build_parser(example.argv[0]).parse_args(example.argv) == parse(example), str(example)
    with pytest.raises(SystemExit):
        build_parser(None).parse_args(["--help"])
    listed = capsys.readouterr().out
    assert all(f"    {name} " in listed for name in ("send", "recv", "serve", "fetch", "catalog", "ls", "keygen",
                                                       "trace")), listed
