"""Whether this process uses the controller's C extension (``controller._fastplan``: the
per-switch loops of a group's first tree, ``MulticastCore._fill`` and
``ofmsgs.tree_adds``, the layered least-loaded search, ``trees._spt_vector``, a tree's
output ports and link loads, ``trees._outs`` and ``trees._bump``, and the searches done
once per topology, ``trees._bfs_dag`` and ``protect._path_around``): built
by pip with the system compiler where it can be, and used
then unless ``MODELCAST_PURE_PYTHON=1`` asks for the pure-Python path (the benchmark's
and the tests' way to run both; the agent's ``hostagent.native`` follows the same
variable). The two give the same entries, bookkeeping and bytes
(tests/test_controller_fastpath.py); without the C one a new tree costs ~1.7x the CPU.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

try:
    import controller._fastplan as _module  # type: ignore[import-not-found]
except ImportError as exc:  # not built (no compiler or no Python headers at install time)
    module: Optional[Any] = None
    why = str(exc)
else:
    module = _module
    why = ""

NATIVE = module is not None and os.environ.get("MODELCAST_PURE_PYTHON", "") in ("", "0")


def warn_if_pure(log: logging.Logger) -> None:
    """Say at start-up that new trees are built in Python, and why."""
    if not NATIVE:
        reason = "MODELCAST_PURE_PYTHON is set" if module is not None else f"controller._fastplan is not built ({why})"
        log.warning("the pure-Python tree builder is in use (%s): the same trees and messages, ~1.7x the CPU per "
                    "new tree; reinstall with a C compiler and the Python headers to build it", reason)
