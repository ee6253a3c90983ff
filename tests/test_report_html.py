"""`medic report --html`: one self-contained page (cli/report_html.py), well formed, every
text escaped, nothing fetched; drawn by a real headless Chromium when one is installed."""

from __future__ import annotations

import shutil
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cli.report_html import page
from medic_core import proc
from remediation import report as rp
from tests.test_report import at, data, one_job

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.seen: dict[str, int] = {}
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen[tag] = self.seen.get(tag, 0) + 1
        self.urls += [v or "" for k, v in attrs if k in ("src", "href")]
        if tag not in ("meta", "line", "rect", "circle"):  # void, or closed by "/>" in SVG
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.seen[tag] = self.seen.get(tag, 0) + 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("line", "rect", "circle"):
            return
        assert self.open and self.open[-1] == tag, (self.open, tag)
        self.open.pop()


def a_report() -> rp.Report:
    rows = one_job(
        episodes=[
            rp.EpisodeRow(1, "n1", "resolved", "gpu.xid.79", at(3602), at(4300)),
            rp.EpisodeRow(2, "n<b>", "resolved", "ib.port.down", at(100), at(160)),
        ],
        steps=[rp.StepRow(1, 3, "reboot", "done", at(3700), at(4300))],
    )
    return rp.build_report(rows)


def test_the_page_is_well_formed_escaped_and_self_contained() -> None:
    text = page(a_report())
    tags = Tags()
    tags.feed(text)
    tags.close()
    assert tags.open == []
    assert tags.seen["svg"] == 4 and tags.seen["rect"] >= 4 and tags.seen["circle"] == 1
    assert tags.urls == []  # nothing to fetch
    assert "n&lt;b&gt;" in text and "n<b>" not in text
    assert "What this report cannot know yet" in text


def test_an_empty_window_says_so() -> None:
    text = page(rp.build_report(data()))
    assert "No interruption in this window." in text
    assert "No job with a wall time in this window." in text


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


@pytest.mark.skipif(
    CHROMIUM is None, reason="no headless browser (Debian: apt-get install chromium)"
)
def test_chromium_draws_the_page(tmp_path: Path) -> None:
    html_file = tmp_path / "report.html"
    html_file.write_text(page(a_report()))
    shot = tmp_path / "report.png"
    assert CHROMIUM is not None
    common = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
    drawn = proc.run(
        [*common, f"--screenshot={shot}", "--window-size=1000,1400", html_file.as_uri()],
        timeout=120,
    )
    assert shot.exists(), drawn.stderr
    assert png_size(shot) == (1000, 1400)
    dom = proc.run([*common, "--dump-dom", html_file.as_uri()], timeout=120)
    assert dom.ok, dom.stderr
    # the browser parsed the SVG as SVG: its bars are elements of the page
    assert dom.stdout.count("<rect") >= 4 and "recovery timeline" in dom.stdout
