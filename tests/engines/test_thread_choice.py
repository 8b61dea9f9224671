"""``EngineConfig.num_threads="auto"``: the smallest of torch's default, the affinity mask and the cgroup quota."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inferscale.config import EngineConfig
from inferscale.engines.hf.threads import cgroup_cpu_quota, choose_threads
from tests.tiny_models import tiny_engine


def test_auto_is_the_default() -> None:
    assert EngineConfig().num_threads == "auto"


def test_configured_and_none_are_kept() -> None:
    assert choose_threads(None) is None
    assert choose_threads(3, torch_default=1, affinity=1, quota=1.0).threads == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("torch_default", "affinity", "quota", "expected", "named"),
    [
        (32, 64, 2.0, 2, "cgroup CPU quota 2"),  # a 2-CPU container on a 64-core host: torch would start 32
        (32, 64, 1.5, 2, "cgroup CPU quota 1.5"),  # a fractional quota rounds up
        (32, 4, None, 4, "CPUs in the affinity mask"),  # taskset / cpuset
        (8, 16, None, 8, "torch's default"),  # hyper-threads: torch counts physical cores
        (8, 16, 0.25, 1, "cgroup CPU quota 0.25"),  # never below one thread
    ],
)
def test_auto_takes_the_tightest_limit(
    torch_default: int, affinity: int, quota: float | None, expected: int, named: str
) -> None:
    choice = choose_threads("auto", torch_default=torch_default, affinity=affinity, quota=quota)
    assert choice is not None
    assert choice.threads == expected
    assert choice.reason.startswith(named)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "150000 100000"}, 1.5),
        ({"cpu.max": "max 100000"}, None),
        ({"cpu.max": "garbage"}, None),
        ({"cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({}, None),
    ],
)
def test_cgroup_quota_v1_and_v2(tmp_path: Path, files: dict[str, str], expected: float | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == expected


def test_engine_load_sets_the_chosen_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1-CPU quota makes an engine loaded with the default config run torch on one thread."""
    before = torch.get_num_threads()
    monkeypatch.setattr("inferscale.engines.hf.threads.cgroup_cpu_quota", lambda root=None: 1.0)
    try:
        tiny_engine()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
