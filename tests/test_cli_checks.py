"""`medic checks list` and `medic checks docs`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import healthd.checks as checks
from cli.checks import checks as checks_group
from healthd.checks.reference import BEGIN, END, generated_block, render_reference


def test_list_prints_an_aligned_table_of_every_check() -> None:
    result = CliRunner().invoke(checks_group, ["list"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split() == ["NAME", "TIERS", "INTERVAL", "TIMEOUT", "NEEDS", "ENABLED"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {s.name for s in checks.registry()}
    assert rows["ib"] == ["ib", "launch,periodic", "60s", "10s", "host", "yes"]
    assert rows["gpu_thermal"][1:5] == ["periodic", "60s", "10s", "nvml"]
    column = lines[0].index("TIMEOUT")
    assert all(line[column - 2 : column] == "  " for line in lines[1:])


def test_list_json_follows_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "medic.toml"
    config.write_text("[checks.ib]\nenabled = false\ninterval = 120\n")
    result = CliRunner().invoke(checks_group, ["list", "--json", "--config", str(config)])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert rows["ib"]["enabled"] is False and rows["ib"]["interval"] == 120.0
    assert rows["ib"]["tiers"] == ["launch", "periodic"]
    assert "ib.port.down" in rows["ib"]["faults"]
    assert rows["memory"]["enabled"] is True and rows["memory"]["interval"] == 300.0
    assert rows["kernel_log"]["needs"] == ["host"]


def test_list_reports_a_bad_config_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "medic.toml"
    config.write_text("[checks.ib]\nmin_rate_gbps = 'fast'\n")
    result = CliRunner().invoke(checks_group, ["list", "--config", str(config)])
    assert result.exit_code != 0
    assert "checks.ib.min_rate_gbps: expected a number" in result.output
    missing = CliRunner().invoke(checks_group, ["list", "--config", str(tmp_path / "nope")])
    assert missing.exit_code != 0 and "file not found" in missing.output


def test_docs_prints_the_reference() -> None:
    result = CliRunner().invoke(checks_group, ["docs"])
    assert result.exit_code == 0
    assert result.output == render_reference()


def test_docs_write_rewrites_only_the_generated_block(tmp_path: Path) -> None:
    page = tmp_path / "checks.md"
    page.write_text(f"# Checks\n\nhand-written\n\n{BEGIN}\nstale\n{END}\n\nafter\n")
    runner = CliRunner()
    result = runner.invoke(checks_group, ["docs", "--write", "--path", str(page)])
    assert result.exit_code == 0, result.output
    assert "updated" in result.output
    text = page.read_text()
    assert text.startswith("# Checks\n\nhand-written\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert generated_block(text) == render_reference()
    again = runner.invoke(checks_group, ["docs", "--write", "--path", str(page)])
    assert again.exit_code == 0 and "already up to date" in again.output
    assert page.read_text() == text


def test_docs_write_refuses_a_page_without_markers(tmp_path: Path) -> None:
    page = tmp_path / "checks.md"
    page.write_text("# Checks\n")
    result = CliRunner().invoke(checks_group, ["docs", "--write", "--path", str(page)])
    assert result.exit_code != 0 and "markers" in result.output
    assert page.read_text() == "# Checks\n"
