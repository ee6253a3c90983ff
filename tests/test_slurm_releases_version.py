"""medic_core.slurm_release: slurmctld's release, read from `scontrol show config`, and the
branches keyed on it (each a difference measured on the lab's 22.05, 24.11 and 26.05)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from medic_core.slurm_release import (
    RECONFIGURE,
    RESTART,
    ReleaseError,
    SlurmRelease,
    controller_release,
    gres_change_env,
    parse_release,
    read_release,
)


@pytest.mark.parametrize(
    ("printed", "release"),
    [
        ("slurm 22.05.8\n", SlurmRelease(22, 5, 8)),  # Debian 12's, the lab's host
        ("slurm-wlm 24.11.5\n", SlurmRelease(24, 11, 5)),  # Debian 13's (measured)
        ("slurm-wlm 26.05.5\n", SlurmRelease(26, 5, 5)),  # Debian sid's (measured)
        ("slurm 26.05.0-0rc1", SlurmRelease(26, 5, 0)),
        ("slurm 23.11", SlurmRelease(23, 11, 0)),
        ("24.11.5", SlurmRelease(24, 11, 5)),  # a JSON document's meta
    ],
)
def test_the_release_is_read_from_what_scontrol_version_prints(
    printed: str, release: SlurmRelease
) -> None:
    assert parse_release(printed) == release


@pytest.mark.parametrize(
    "printed",
    ["", "slurm", "slurm 2.6", "slurm 24.13.1", "slurm 24.11.5 extra", "slurm 124.11.5",
     "slurm_load_node error: Unspecified error", "slurm 24.11.5;rm -rf /", "x" * 10_000],
)  # fmt: skip
def test_anything_else_is_one_line_naming_what_was_seen(printed: str) -> None:
    with pytest.raises(ReleaseError) as caught:
        parse_release(printed)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


@given(st.text(max_size=200))
def test_any_text_is_a_release_or_a_release_error(text: str) -> None:
    try:
        release = parse_release(text)
    except ReleaseError as exc:
        assert "\n" not in str(exc)
    else:
        assert 1 <= release.minor <= 12 and str(release).count(".") == 2


@given(st.integers(0, 99), st.integers(1, 12), st.integers(0, 9999))
def test_a_release_prints_as_it_is_read(major: int, minor: int, patch: int) -> None:
    release = SlurmRelease(major, minor, patch)
    if major >= 10:
        assert parse_release(f"slurm {release}") == release


@pytest.mark.parametrize(
    ("release", "change"),
    [
        (SlurmRelease(22, 5, 8), RESTART),  # measured: reconfigure leaves the node INVAL
        (SlurmRelease(23, 11, 10), RESTART),  # not measured: the restart, right everywhere
        (SlurmRelease(24, 5, 4), RESTART),
        (SlurmRelease(24, 11, 0), RECONFIGURE),  # measured on 24.11.5
        (SlurmRelease(25, 5, 1), RECONFIGURE),
        (SlurmRelease(26, 5, 5), RECONFIGURE),  # measured
    ],
)
def test_a_gres_count_change_takes_a_restart_before_24_11(
    release: SlurmRelease, change: str
) -> None:
    assert release.gres_change == change


def _scontrol(where: Path, body: str) -> Path:
    where.mkdir(exist_ok=True)
    script = where / "scontrol"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return where


def _config(version: str) -> str:
    return f"echo 'PropagateResourceLimits = ALL'; echo 'SLURM_VERSION           = {version}'"


def test_read_release_asks_the_first_directory_that_has_scontrol(tmp_path: Path) -> None:
    first = _scontrol(tmp_path / "lab", _config("24.11.5"))
    host = _scontrol(tmp_path / "host", _config("22.05.8"))
    assert read_release([tmp_path / "none", first, host], {}, 5.0) == SlurmRelease(24, 11, 5)


def test_the_controllers_release_not_the_clients() -> None:
    # Measured on the 26.05 lab: the host's 22.05 `scontrol version` prints 22.05.8 whatever
    # the controller; `scontrol show config` carries slurmctld's own SLURM_VERSION.
    shown = "Configuration data as of 2026-11-28T17:14:02\nSLURM_VERSION           = 26.05.5\n"
    assert controller_release(shown) == SlurmRelease(26, 5, 5)
    with pytest.raises(ReleaseError, match="no SLURM_VERSION line"):
        controller_release("slurm-wlm 24.11.5\n")
    with pytest.raises(ReleaseError):
        controller_release("SLURM_VERSION = garbage\n")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("echo 'slurm_load_ctl_conf error' >&2; exit 1", "exit 1"),
        ("sleep 30", "timed out"),
        ("echo 'SLURM_VERSION = garbage'", "not a Slurm release"),
        ("echo garbage", "no SLURM_VERSION line"),
    ],
)
def test_read_release_fails_on_one_line(tmp_path: Path, body: str, words: str) -> None:
    bin_dir = _scontrol(tmp_path / "bin", body)
    with pytest.raises(ReleaseError) as caught:
        read_release([bin_dir], {}, 0.5)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_read_release_without_scontrol_names_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ReleaseError, match=f"scontrol not found in {tmp_path}"):
        read_release([tmp_path], {}, 1.0)


class _Client:
    def __init__(self, bin_dirs: tuple[Path, ...]) -> None:
        self.bin_dirs, self.env, self.timeout = bin_dirs, {}, 5.0


def test_gres_change_env_falls_back_to_the_restart(tmp_path: Path) -> None:
    new = _scontrol(tmp_path / "new", _config("26.05.5"))
    assert gres_change_env(_Client((new,))) == {
        "MEDIC_GRES_CHANGE": "reconfigure",
        "MEDIC_SLURM_RELEASE": "26.05.5",
    }
    assert gres_change_env(_Client((tmp_path / "nothing",))) == {"MEDIC_GRES_CHANGE": "restart"}
    assert gres_change_env(object()) == {"MEDIC_GRES_CHANGE": "restart"}
