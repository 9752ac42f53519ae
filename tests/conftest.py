"""Shared test setup. The eventlet shim must load before anything imports ryu.app.wsgi."""

import os
import tempfile

import controller.compat  # noqa: F401

# The agents cache manifests per file (hostagent/manifest.py): tests, and the agents they
# start as subprocesses, use a throw-away cache instead of the user's ~/.cache/modelcast.
os.environ.setdefault("MODELCAST_CACHE_DIR", tempfile.mkdtemp(prefix="modelcast-test-cache-"))
