"""Shared test setup. The eventlet shim must load before anything imports ryu.app.wsgi."""

import controller.compat  # noqa: F401
