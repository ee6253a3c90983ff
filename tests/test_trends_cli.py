"""`medic node show` prints the trends check's series: a compact line per GPU and counter
(last values, rate per hour), from the condition the daemon writes; hostile evidence is
skipped, not a crash."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from types import SimpleNamespace

from click.testing import CliRunner

from cli.node_commands import node
from cli.trend_view import trend_lines
from medic_core.store import ConditionUpdate, open_store

T = 1_800_000_000
EVIDENCE = {
    "index": 2,
    "uuid": "GPU-2",
    "series": {
        "ecc_corrected": [[T, 0], [T + 60, 5], [T + 120, 15], [T + 180, 35]],
        "pcie_replay": [[T, 0], [T + 60, 0], [T + 120, 0], [T + 180, 0]],
        "temperature_c": [[T, 33], [T + 60, 34], [T + 120, 33], [T + 180, 33]],
    },
    "rates_per_hour": {"ecc_corrected": 700.0, "pcie_replay": 0.0, "temperature_c": 0.0},
    "rising": ["ecc_corrected"],
    "recommendation": "drain_after_job",
}


def test_node_show_prints_the_series_of_a_rising_counter(tmp_path: Path) -> None:
    db = tmp_path / "medic.db"
    with open_store(f"sqlite:///{db}") as store:
        store.set_condition(
            "n1",
            ConditionUpdate(
                "gpu_trends", "WARN", "2", "gpu.trend.ecc_corrected",
                "GPU 2: correctable ECC rising 700/h (limit 100/h)", evidence=EVIDENCE,
            ),
            dt.datetime.now(dt.UTC),
        )  # fmt: skip
    conf = tmp_path / "medic.toml"
    conf.write_text(
        f'[slurm]\nconf = "{tmp_path}/no-slurm.conf"\n[store]\nurl = "sqlite:///{db}"\n'
    )
    shown = CliRunner().invoke(node, ["show", "n1", "--config", str(conf)])
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    at = lines.index("trends (last values, rate per hour over the window):")
    assert lines[at + 1] == "  GPU 2  correctable ECC: 0 5 15 35 (700/h)  RISING"
    assert "PCIe replays" not in shown.stdout  # a counter that does not move is left out
    every = CliRunner().invoke(node, ["show", "n1", "--all", "--config", str(conf)])
    assert "  GPU 2  PCIe replays: 0 0 0 0 (0/h)" in every.stdout


def test_hostile_evidence_is_skipped() -> None:
    rows = [
        SimpleNamespace(type="gpu_trends", target="1", evidence={"series": "nope"}),
        SimpleNamespace(type="gpu_trends", target="x", evidence=None),
        SimpleNamespace(
            type="gpu_trends",
            target="3",
            evidence={"series": {"ecc_corrected": [["a"]]}, "rates_per_hour": {"ecc_corrected": 5}},
        ),
        SimpleNamespace(type="gpu_ecc", target="0", evidence=EVIDENCE),
        SimpleNamespace(type="gpu_trends", target="2", evidence=EVIDENCE),
    ]
    assert trend_lines(rows) == ["  GPU 2  correctable ECC: 0 5 15 35 (700/h)  RISING"]
