"""What a benchmark ran on: its numbers mean little without it (machines of one kind
differ several-fold), which is also why every bench reports ratios to a reference."""

from __future__ import annotations

import os
import platform
from typing import Any


def machine() -> dict[str, Any]:
    """CPU model, cores, kernel and the 1-minute load average at the time of the call."""
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(),
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def describe(m: dict[str, Any]) -> str:
    """One line for a report header."""
    return f"{m['cpu']}, {m['cores']} cores, Linux {m['kernel']}, load {m['loadavg_1m']}"
