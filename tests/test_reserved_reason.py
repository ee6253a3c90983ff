"""The `medic:` prefix is Medic's: an admin's reason that Slurm would store as one of Medic's
drains is refused, judged on what Slurm stores, not on what was typed (issue 11, item 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cli.lab.cluster import Lab
from cli.node_commands import node
from medic_core.drain_reason import as_slurm_stores, claims_medic_prefix, is_medic_reason
from medic_core.store import open_store

QUOTED = [
    "medic: gpu.xid.79 gpu2 fake",
    '"medic: gpu.xid.79 gpu2 fake"',
    '"medic: fake',  # scontrol drops a leading quote on its own
    "  medic: fake",
    '" medic: fake "',
    "'medic: fake'",
    "medic:fake",
    "MEDIC: fake",
    '""medic: fake""',
    "\tmedic:\tfake",
]


@pytest.mark.parametrize("typed", QUOTED)
def test_reasons_that_read_as_medics_are_refused(typed: str) -> None:
    assert claims_medic_prefix(typed)


@pytest.mark.parametrize("typed", ["admin: medic: said so", "fan noise", '"admin: x"', "medical"])
def test_other_reasons_are_allowed(typed: str) -> None:
    assert not claims_medic_prefix(typed)


def test_what_slurm_stores() -> None:
    assert as_slurm_stores('"medic: x"') == "medic: x"
    assert is_medic_reason(as_slurm_stores('"medic: x"'))
    assert as_slurm_stores('"a') == "a" and as_slurm_stores('a"') == "a"
    assert as_slurm_stores('""a""') == '"a"'  # one pair only, as scontrol does


@pytest.mark.parametrize("command", ["drain", "reboot"])
@pytest.mark.parametrize("typed", QUOTED)
def test_the_cli_refuses_before_touching_slurm(command: str, typed: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-medic.toml"  # refused before the config is even read
    result = CliRunner().invoke(node, [command, "n1", "--reason", typed, "--config", str(missing)])
    assert result.exit_code == 2, result.output
    assert "reserved" in result.stderr and "Slurm drops them" in result.stderr


@pytest.mark.parametrize("typed", ['""', '" "', '"'])
def test_a_reason_that_slurm_would_store_empty_is_refused(typed: str, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-medic.toml"
    result = CliRunner().invoke(node, ["drain", "n1", "--reason", typed, "--config", str(missing)])
    assert result.exit_code == 2 and "--reason is empty" in result.stderr


def _reason(lab: Lab, name: str) -> Any:
    return next(n for n in lab.sinfo_nodes() if n["name"] == name)["reason"]


def test_slurm_drops_the_quotes_and_the_cli_records_what_slurm_stores(lab: Lab) -> None:
    """On the lab's slurmctld: the model of as_slurm_stores is what scontrol does, and a
    quoted admin reason is recorded as Slurm keeps it."""
    lab.slurm(["scontrol", "update", "nodename=n3", "state=drain", 'reason="medic: typed"'])
    try:
        assert _reason(lab, "n3") == "medic: typed" == as_slurm_stores('"medic: typed"')
    finally:
        lab.slurm(["scontrol", "update", "nodename=n3", "state=resume"])
    conf = str(lab.layout.medic_conf)
    open_store(f"sqlite:///{lab.layout.store_db}").close()  # the CLI never creates one
    done = CliRunner().invoke(node, ["drain", "n3", "--reason", '"admin: fan"', "--config", conf])
    try:
        assert done.exit_code == 0, done.output
        assert "not recorded" not in done.stderr, done.stderr
        assert _reason(lab, "n3") == "admin: fan"
        with open_store(f"sqlite:///{lab.layout.store_db}") as store:
            (event,) = store.events("n3", kind="admin")
        assert event.evidence["reason"] == "admin: fan"
    finally:
        lab.slurm(["scontrol", "update", "nodename=n3", "state=resume"])
