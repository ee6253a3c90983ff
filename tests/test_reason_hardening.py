"""Drain reasons are shown everywhere (`sinfo -R`, terminals, logs, slurmdbd): Medic's own
never carry a character that does not print as itself, and an admin's is refused when too
long for Slurm's accounting or holding such characters (hardening issue, item 14)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.node_commands import node
from medic_core.drain_reason import (
    MAX_ADMIN_REASON,
    MAX_REASON,
    PREFIX,
    admin_reason_problem,
    format_reason,
    is_medic_reason,
    parse_reason,
)

FUZZ = settings(max_examples=200, derandomize=True, database=None, deadline=None)
HOSTILE = ["\x00", "\x07", "\x1b[31m", "\u202e", "\u2066", "\u200b", "\ufeff", "\udcff", "\ue000"]


def _shows_as_itself(text: str) -> bool:
    return all(c == " " or unicodedata.category(c)[0] not in "CZ" for c in text)


@pytest.mark.parametrize("char", HOSTILE)
def test_medic_s_reason_never_passes_an_unprintable_character(char: str) -> None:
    """NUL, BEL, ESC, RTL override and isolate, zero-width space, BOM, a lone surrogate,
    private use: each was copied into the drain reason as it was."""
    reason = format_reason(f"gpu.xid{char}79", f"2{char}", f"fell{char} off the bus")
    assert _shows_as_itself(reason), ascii(reason)
    assert char not in reason
    shown = "?" + char[1:]  # an escape sequence loses its ESC: "[31m" alone does nothing
    assert reason.startswith(f"medic: gpu.xid{shown}79 ") and f"fell{shown} off" in reason
    reason.encode("utf-8")  # a surrogate would raise here


@FUZZ
@given(fault_class=st.text(max_size=80), where=st.text(max_size=20), evidence=st.text())
def test_any_finding_text_makes_a_short_printable_medic_reason(
    fault_class: str, where: str, evidence: str
) -> None:
    reason = format_reason(fault_class, where, evidence)
    assert is_medic_reason(reason) and reason.startswith(PREFIX)
    assert len(reason.encode("utf-8")) <= MAX_REASON
    assert _shows_as_itself(reason), ascii(reason)
    assert "=" not in reason
    assert parse_reason(reason) is not None


@pytest.mark.parametrize(
    ("typed", "problem"),
    [
        ("x" * 20_000, f"--reason is 20000 bytes, over the {MAX_ADMIN_REASON} bytes"),
        ("é" * 128, "--reason is 256 bytes"),
        ("admin: fan\x00 replaced", "(U+0000)"),
        ("admin: fan\x07 replaced", "(U+0007)"),
        ("admin: \u202eecalper naf", "(U+202E)"),
        ("admin: \x1b[2J cleared", "(U+001B)"),
    ],
)
@pytest.mark.parametrize("command", ["drain", "reboot", "resume"])
def test_the_cli_refuses_an_unfit_admin_reason_before_touching_slurm(
    command: str, typed: str, problem: str, tmp_path: Path
) -> None:
    """A 20,000-character reason was accepted and sent to slurmctld, and NUL, BEL and RTL
    overrides went into Slurm, its accounting and every `sinfo -R` as they were."""
    missing = tmp_path / "no-such-medic.toml"  # refused before the config is even read
    result = CliRunner().invoke(node, [command, "n1", "--reason", typed, "--config", str(missing)])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines()[0].startswith(f"medic: {problem}") or (
        problem in result.stderr.splitlines()[0]
    ), result.stderr
    assert "no-such-medic.toml" not in result.stderr


@pytest.mark.parametrize(
    "typed",
    [
        "admin: reseat GPU 2 (ticket 1234)",
        "admin: réseau IB à vérifier",
        "运维: 更换风扇",
        "x" * 255,
    ],
)
def test_a_plain_admin_reason_of_any_script_passes(typed: str) -> None:
    assert admin_reason_problem(typed) is None
