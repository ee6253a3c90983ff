"""Per-check kill switches: `[checks] disabled = [...]` beside `[checks.<name>] enabled =
false`. A disabled check never runs (the runner never selects it) and `medic config check`,
`medic checks list` and `medic check` say so; a bad list is one line naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.checks import checks as checks_group
from cli.main import medic
from healthd.checks import disabled_by, load_check_configs, registry
from medic_core.config import ConfigError, load_config

NAMES = sorted(spec.name for spec in registry())


def configured(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "medic.toml"
    path.write_text(text)
    return path


@settings(max_examples=30, deadline=None)
@given(listed=st.sets(st.sampled_from(NAMES)), own=st.sets(st.sampled_from(NAMES)))
def test_a_check_is_off_when_either_switch_says_so(
    tmp_path_factory: pytest.TempPathFactory, listed: set[str], own: set[str]
) -> None:
    text = f"[checks]\ndisabled = {json.dumps(sorted(listed))}\n"
    text += "".join(f"[checks.{name}]\nenabled = false\n" for name in sorted(own))
    config = load_config(configured(tmp_path_factory.mktemp("c"), text))
    configs = load_check_configs(config)
    assert {n for n, c in configs.items() if not c.enabled} == listed | own
    for name in listed | own:
        by = disabled_by(config, name)
        assert by == ("[checks] disabled" if name in listed else f"[checks.{name}] enabled = false")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('["gpu_ecc", "no_such_check"]', "'no_such_check': no such check"),
        ('"gpu_ecc"', "expected a list of check names"),
        ("[1]", "expected a list of check names"),
    ],
)
def test_a_bad_list_is_one_line_naming_the_key(tmp_path: Path, value: str, says: str) -> None:
    config = load_config(configured(tmp_path, f"[checks]\ndisabled = {value}\n"))
    with pytest.raises(ConfigError) as caught:
        load_check_configs(config)
    line = str(caught.value)
    assert "checks.disabled" in line and says in line and "\n" not in line
    result = CliRunner().invoke(medic, ["config", "check", "--config", str(config.source)])
    assert result.exit_code != 0 and "checks.disabled" in result.output
    assert "Traceback" not in result.output


def test_the_cli_says_which_checks_are_off_and_by_which_switch(tmp_path: Path) -> None:
    path = configured(
        tmp_path,
        f'[checks]\ndisabled = ["gpu_ecc"]\n[checks.ib]\nenabled = false\n'
        f'[store]\nurl = "sqlite:///{tmp_path / "medic.db"}"\n',
    )
    checked = CliRunner().invoke(medic, ["config", "check", "--config", str(path)])
    assert checked.exit_code == 0, checked.output
    assert f"{len(NAMES) - 2} of {len(NAMES)} checks enabled (disabled: gpu_ecc, ib)" in (
        checked.output
    )
    listed = CliRunner().invoke(checks_group, ["list", "--json", "--config", str(path)])
    rows = {r["name"]: r for r in json.loads(listed.output)}
    assert rows["gpu_ecc"]["disabled_by"] == "[checks] disabled" and not rows["gpu_ecc"]["enabled"]
    assert rows["ib"]["disabled_by"] == "[checks.ib] enabled = false"
    assert rows["gpu_xid"]["enabled"] and rows["gpu_xid"]["disabled_by"] == ""
    table = CliRunner().invoke(checks_group, ["list", "--config", str(path)]).output
    assert "no: [checks] disabled" in table and "no: [checks.ib] enabled = false" in table


def test_the_runner_never_selects_a_disabled_check(tmp_path: Path) -> None:
    from healthd.checks.base import CheckContext
    from healthd.runner import Runner

    config = load_config(configured(tmp_path, '[checks]\ndisabled = ["gpu_xid", "memory"]\n'))
    runner = Runner(CheckContext.for_root(tmp_path), load_check_configs(config))
    chosen = runner.selected()
    assert "gpu_xid" not in chosen and "memory" not in chosen and "gpu_ecc" in chosen
