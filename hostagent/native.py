"""Whether this process uses the agent's C extension (``hostagent._fastrun``): built by
pip with the system compiler against OpenSSL's libcrypto where it can be, and used then
unless ``MODELCAST_PURE_PYTHON=1`` asks for the pure-Python path (the benchmark's and the
tests' way to run both). One place for the choice: ``hostagent.fastrun`` (the receiver's
run path) and ``hostagent.wire`` (the DATA tags) both follow it.
"""

from __future__ import annotations

import os
from typing import Any, Optional

try:
    import hostagent._fastrun as _module  # type: ignore[import-not-found]
except ImportError as exc:  # not built (no compiler or no OpenSSL headers at install time)
    module: Optional[Any] = None
    why = str(exc)  # what the warning says
else:
    module = _module
    why = ""

NATIVE = module is not None and os.environ.get("MODELCAST_PURE_PYTHON", "") in ("", "0")
