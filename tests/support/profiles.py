"""Hypothesis profiles, loaded by tests/conftest.py before any test module is imported.

``ci`` (chosen when CI=true): a fixed seed per test (``derandomize``), so a red CI run
reproduces on any machine and a green one is not a lucky draw, and ``CI_SCALE`` times the
examples: tests that name no count get 100 x ``CI_SCALE``, tests that name theirs through
``examples(n)`` get ``n x CI_SCALE``. ``dev`` (otherwise): fresh random examples on each
run, as many as each test asks for; failures found are kept in ``.hypothesis/`` and tried
first next time. ``HYPOTHESIS_PROFILE=ci`` runs CI's examples anywhere.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

CI_SCALE = 2
_SCALES = {"dev": 1, "ci": CI_SCALE}

# deadline=None in both: per-example timing on a shared 2-core machine says more about the
# neighbours than about the code (the suite's timeouts catch a hang).
settings.register_profile("dev", deadline=None, print_blob=True)
settings.register_profile("ci", deadline=None, print_blob=True, derandomize=True, database=None,
                          max_examples=100 * CI_SCALE, suppress_health_check=[HealthCheck.too_slow])


def chosen() -> str:
    """The profile this run uses: $HYPOTHESIS_PROFILE, else ``ci`` under CI=true, else ``dev``."""
    return os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")


_loaded = "dev"


def load() -> str:
    """Load ``chosen()`` as Hypothesis' default settings; returns its name."""
    global _loaded
    _loaded = chosen()
    settings.load_profile(_loaded)
    return _loaded


def examples(n: int) -> int:
    """A test's example count under the loaded profile: ``n`` locally, ``n x CI_SCALE`` on CI."""
    return n * _SCALES.get(_loaded, 1)
