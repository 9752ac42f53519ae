"""bench.memory: the free page reporting setting the agent bench changes comes back."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import memory


@pytest.fixture
def fake_sys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(memory.os, "geteuid", lambda: 0)
    setting = tmp_path / "page_reporting_order"
    setting.write_text("9\n")
    monkeypatch.setattr(memory, "REPORTING_ORDER", setting)
    monkeypatch.setattr(memory, "STATE_DIR", tmp_path / "state")
    return setting


def test_reporting_is_off_inside_and_restored_after(fake_sys: Path, tmp_path: Path) -> None:
    with memory.steady_memory(tmp_path, 3 << 20) as info:
        assert fake_sys.read_text().strip() == str(memory.NO_REPORTING)
        assert info["reporting_was"] == 9 and info["warmed_bytes"] == 3 << 20
        assert not list(tmp_path.glob("modelcast-warm-*")), "the warm-up file is deleted"
    assert fake_sys.read_text().strip() == "9"
    assert not (tmp_path / "state" / "page_reporting_order.orig").exists()


def test_restored_after_a_failure_and_after_a_killed_bench(fake_sys: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with memory.steady_memory(tmp_path, 1 << 20):
            raise RuntimeError("a run failed")
    assert fake_sys.read_text().strip() == "9"
    # a bench killed inside the block left the setting off and the old value saved:
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "page_reporting_order.orig").write_text("9")
    fake_sys.write_text(str(memory.NO_REPORTING))
    with memory.steady_memory(tmp_path, 1 << 20) as info:
        assert info["reporting_was"] == 9
    assert fake_sys.read_text().strip() == "9"


def test_a_kernel_without_reporting_is_left_alone(fake_sys: Path, tmp_path: Path) -> None:
    fake_sys.unlink()
    with memory.steady_memory(tmp_path, 1 << 20) as info:
        assert info["reporting_was"] is None
    assert not fake_sys.exists()


def test_first_touch_reports_both_costs(tmp_path: Path) -> None:
    """Both are CPU seconds per GB of a real write: above zero, and below 10 s/GB (a first
    touch costs ~3 s/GB on the VMs bench/memory.py describes, ~0.2 s/GB elsewhere)."""
    costs = memory.first_touch(tmp_path, 16 << 20)
    assert set(costs) == {"first_write_s_per_gb", "rewrite_s_per_gb"}
    assert all(0 < v < 10 for v in costs.values()), costs
    assert not list(tmp_path.iterdir())
