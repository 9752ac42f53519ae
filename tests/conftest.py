"""Shared test setup. The eventlet shim must load before anything imports ryu.app.wsgi;
the Hypothesis profile (tests/support/profiles.py: a fixed seed and more examples under
CI=true) before any test module reads its settings."""

import os
import tempfile

import controller.compat  # noqa: F401
from tests.support import profiles

profiles.load()

# The agents cache manifests per file (hostagent/manifest.py): tests, and the agents they
# start as subprocesses, use a throw-away cache instead of the user's ~/.cache/modelcast.
os.environ.setdefault("MODELCAST_CACHE_DIR", tempfile.mkdtemp(prefix="modelcast-test-cache-"))


def pytest_report_header(config):
    """Say which Hypothesis profile ran (a CI failure's examples reproduce under the same one)."""
    return f"hypothesis profile: {profiles.chosen()} (HYPOTHESIS_PROFILE=ci reproduces CI's examples)"
