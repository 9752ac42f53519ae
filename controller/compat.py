"""Compatibility shim: make Ryu 4.34 importable with eventlet >= 0.30.3 on Python 3.11.

`ryu.app.wsgi` does ``from eventlet.wsgi import ALREADY_HANDLED`` at import time; eventlet
removed that name in 0.30.3, and eventlet < 0.33 does not import on Python >= 3.10
(faucetsdn/ryu issue #138). Ryu only uses the value as an opaque sentinel, so any unique
object works. This module must be imported before anything imports ``ryu.app.wsgi``;
the controller entry point and the test suite do so. It is the only place with this fix.
"""

import warnings

# eventlet announces its own deprecation on import; Ryu 4.34 has no other event loop.
warnings.filterwarnings("ignore", message=r"\s*Eventlet is deprecated", category=Warning)
# eventlet's resolver imports dnspython, whose DNSSEC module loads DSA at import; cryptography
# >= 51 deprecates DSA, so every start printed 8 lines of warnings (nothing here uses DNSSEC)
warnings.filterwarnings("ignore", message=r"DSA is deprecated", category=Warning)

import eventlet.wsgi  # noqa: E402

if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
    eventlet.wsgi.ALREADY_HANDLED = object()  # type: ignore[attr-defined]
