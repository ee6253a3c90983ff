"""bench.checkpoint_tiers on a tiny checkpoint: it runs, measures every tier and case, reloads
from the tier each case must (local after a restart here, durable after a node loss), and
leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import checkpoint_tiers


def test_the_bench_measures_each_tier_and_reload_and_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "shm").mkdir()
    (tmp_path / "disk").mkdir()
    args = ["--sizes", "0.001", "--durable-mbps", "50", "--local-dir", str(tmp_path / "shm")]
    assert checkpoint_tiers.main([*args, "--durable-dir", str(tmp_path / "disk")]) == 0
    out = json.loads(capsys.readouterr().out)
    (size,) = out["sizes"]
    assert size["bytes"] == int(0.001 * (1 << 30)) // 4 * 4
    assert size["reload_same_node"]["tier"] == "local"
    assert size["reload_node_lost"]["tier"] == "durable"
    assert size["reload_node_lost"]["bytes"] == size["bytes"]
    # 1 MiB at 50 MB/s: the durable tier's limit shows in the durable-only stall
    assert size["durable_only"]["stall_s"] >= size["bytes"] / 50e6
    assert out["extrapolated"]["durable_reload_s"] == pytest.approx(5.7e12 / 5e9, rel=1e-3)
    assert list((tmp_path / "shm").iterdir()) == [] and list((tmp_path / "disk").iterdir()) == []


def test_bad_sizes_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        checkpoint_tiers.main(["--sizes", "big"])
    assert "expected GiB numbers" in capsys.readouterr().err
