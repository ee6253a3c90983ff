"""The one sanitiser for untrusted text (issue 23, finding 2): CSI was stripped (by click,
and only when the output was not a terminal), but OSC (`ESC ] 0;PWNED BEL`, which sets the
window title) from a job's text reached `medic events` and `medic report` raw.
medic_core.text.sanitised replaces every C0 and C1 control, DEL and the Unicode format
characters by "?" (line breaks and tabs by spaces), so no escape sequence can start; it is
what cli.common's table and clip, the drain reasons, and the guard `medic` puts on its
stdout and stderr use."""

from __future__ import annotations

import io
import json
import os
import sys
import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.common import clip, table
from cli.main import medic
from medic_core import proc
from medic_core.drain_reason import format_reason
from medic_core.store import Severity, open_store
from medic_core.text import TerminalGuard, sanitised

REPO = Path(__file__).resolve().parent.parent
FUZZ = settings(max_examples=2000, derandomize=True, database=None, deadline=None)

OSC = "\x1b]0;PWNED\x07"
# One of each: CSI (7 and 8 bit), OSC to BEL and to ST (7 and 8 bit), DCS, SOS, PM, APC, a
# single ESC x (RIS: reset the terminal), CR (overwrites the line), NEL, and an RTL override.
SEQUENCES = [
    "\x1b[31m", "\x1b[2J", "\x9b31m", OSC, "\x1b]8;;http://evil\x1b\\", "\x9d0;t\x9c",
    "\x1bP1$r\x1b\\", "\x90q\x9c", "\x1bXsos\x1b\\", "\x98sos\x9c", "\x1b^pm\x1b\\",
    "\x9epm\x9c", "\x1b_apc\x1b\\", "\x9fapc\x9c", "\x1bc", "\r", "\x85", "\u202e",
]  # fmt: skip


def terminal_safe(text: str) -> bool:
    """Nothing a terminal acts on: no C0 (a line break only where allowed), DEL or C1, no
    format, surrogate, private-use or unassigned character."""
    return not any(
        ord(c) < 0x20
        or 0x7F <= ord(c) <= 0x9F
        or unicodedata.category(c) in ("Cf", "Cs", "Co", "Cn")
        for c in text
    )


@FUZZ
@given(st.text() | st.lists(st.sampled_from([*SEQUENCES, "a", "é", "漢", " "])).map("".join))
def test_any_text_comes_out_with_no_control_and_its_printable_text_kept(text: str) -> None:
    shown = sanitised(text)
    assert terminal_safe(shown), ascii(shown)
    assert "\x1b" not in shown and len(shown) == len(text)
    for before, after in zip(text, shown, strict=True):  # one for one, in place
        category = unicodedata.category(before)
        if category[0] in "LMNPS" or category == "Zs":  # text, and spaces
            assert after == before
        else:  # a control, a line break, a format character: replaced
            assert after in ("?", " ")
    assert sanitised(shown) == shown


@pytest.mark.parametrize("sequence", SEQUENCES)
def test_each_escape_sequence_loses_its_introducer_and_shows(sequence: str) -> None:
    shown = sanitised(f"job{sequence}name")
    assert shown.startswith("job") and shown.endswith("name") and terminal_safe(shown)
    assert sanitised(OSC) == "?]0;PWNED?"  # the attempt shows, the title is not set


def test_printable_text_is_kept_as_it_is() -> None:
    for text in ("train-llama 70B", "ジョブ", "naïve café", "🚀 run #3", "a\u00a0b", "x=1;y=[2]"):
        assert sanitised(text) == text


def test_tables_and_clipped_messages_are_sanitised() -> None:
    lines = table(["JOB", "MESSAGE"], [[f"4{OSC}2", "fine\nFORGED ROW"]])
    assert len(lines) == 2 and all(terminal_safe(line) for line in lines)
    assert "FORGED ROW" in lines[1]  # on the cell's own line
    assert clip(f"evil{OSC}\r\x1b[2J", 80) == "evil?]0;PWNED? ?[2J"


@FUZZ
@given(st.text())
def test_the_terminal_guard_keeps_line_breaks_and_tabs_and_nothing_else(text: str) -> None:
    out = io.StringIO()
    assert TerminalGuard(out).write(text) == len(text)  # type: ignore[arg-type]
    written = out.getvalue()
    assert written.count("\n") == text.count("\n") and written.count("\t") == text.count("\t")
    assert all(terminal_safe(part) for part in written.replace("\t", "\n").split("\n"))


def test_drain_reasons_use_the_same_sanitiser() -> None:
    reason = format_reason("gpu.xid.79", "2", f"job{OSC} died\r")
    assert reason == "medic: gpu.xid.79 gpu2 job?]0;PWNED? died" and terminal_safe(reason)


# --- end to end: the commands that showed it raw --------------------------------------------


def store_with_hostile_text(url: str) -> None:
    from tests.test_report_cli import record_day, t

    with open_store(url) as store:
        record_day(store)
        store.add_event(
            "n1", at=t(3602), kind="job_action", severity=Severity.WARN, source="test",
            fault_class=f"gpu.xid.79{OSC}", target=f"job:6{OSC}6", message=f"requeued {OSC}",
            evidence={"action": "requeued", "job_id": f"6{OSC}6"},
        )  # fmt: skip
        store.add_event(
            "n2", at=t(3602), kind="kernel_log", severity=Severity.CRITICAL, source="kmsg",
            message=f"user text {OSC} \x9b2J \x1bP+q\x1b\\ end", fault_class="x\x1b[31m",
        )  # fmt: skip


@pytest.mark.parametrize("args", [["events", "--since", "1d"], ["report", "--since", "3h"]])
def test_medic_events_and_report_show_no_escape_sequence(tmp_path: Path, args: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    store_with_hostile_text(url)
    result = CliRunner().invoke(medic, [*args, "--store", url])
    assert result.exit_code == 0, result.output
    assert "PWNED" in result.output or args[0] == "report"
    assert all(terminal_safe(line) for line in result.output.splitlines()), ascii(result.output)


def test_the_medic_process_guards_its_own_output(tmp_path: Path) -> None:
    """The installed entry point (cli.main.main) puts the guard on stdout and stderr."""
    url = f"sqlite:///{tmp_path / 'medic.db'}"
    store_with_hostile_text(url)
    probe = (
        "import sys; from cli.main import main; sys.argv[0] = 'medic'\n"
        "try:\n    main()\nexcept SystemExit as done:\n    code = done.code\n"
        "print('\\x1b]0;PWNED\\x07 from a print', file=sys.stderr)\n"
        "sys.exit(code)"
    )
    done = proc.run(
        [sys.executable, "-c", probe, "events", "--since", "1d", "--store", url],
        timeout=120,
        cwd=REPO,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert done.returncode == 0, done.stderr
    assert "PWNED" in done.stdout and "?]0;PWNED? from a print" in done.stderr
    for line in (done.stdout + done.stderr).splitlines():
        assert terminal_safe(line), ascii(line)
    as_json = CliRunner().invoke(medic, ["events", "--since", "1d", "--store", url, "--json"])
    assert OSC in "".join(e["message"] for e in json.loads(as_json.output))  # escaped by JSON
