"""The configuration shown in the docs is configuration Medic accepts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from healthd.checks import load_check_configs
from medic_core.config import load_config
from medic_core.settings import DaemonSettings, HookSettings, RemediationSettings, SweepSettings
from medic_core.store import store_settings

DOCS = Path(__file__).parents[1] / "docs"


def toml_blocks(page: str) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


@pytest.mark.parametrize("page", ["operator-guide.md", "remediation.md", "sweeps.md"])
def test_every_toml_example_validates(page: str, tmp_path: Path) -> None:
    blocks = toml_blocks(page)
    assert blocks, f"{page} shows no medic.toml"
    for number, block in enumerate(blocks):
        path = tmp_path / f"example-{number}.toml"
        path.write_text(block)
        config = load_config(path)
        DaemonSettings.from_config(config)
        load_check_configs(config)
        store_settings(config)
        HookSettings.from_config(config)
        RemediationSettings.from_config(config)
        SweepSettings.from_config(config)
