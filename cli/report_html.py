"""`medic report --html FILE`: the report as one self-contained page, plots drawn as inline
SVG by this module (no plotting library, nothing fetched: it opens on an air-gapped admin
host and attaches to a ticket as one file)."""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence

from remediation import report as rp

COLOURS = {
    "detection": "#8c564b",
    "isolation": "#d62728",
    "scheduling": "#ff7f0e",
    "restart": "#1f77b4",
    "lost_work": "#bbbbbb",
}
WIDTH = 900
ROW = 16
LEFT = 190
MAX_ROWS = 40
NODE_BARS = ("episodes", "interruptions")
RUNG_BARS = ("attempts", "worked")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


_seconds = rp.format_duration  # the text report's format: 643 ms, 4.4 s, 12 min 05 s


def _svg(height: int, body: Sequence[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}"'
        f' role="img" aria-label="{esc(label)}" font-family="sans-serif" font-size="11">'
        + "".join(body)
        + "</svg>"
    )


def timeline(report: rp.Report) -> str:
    """One bar per interruption (the longest MAX_ROWS), stacked by MTTR component, then the
    work lost to it in grey."""
    every = [i for j in report.jobs for i in j.interruptions]
    shown = sorted(every, key=lambda i: -(i.wall_s + (i.lost_work_s or 0)))[:MAX_ROWS]
    if not shown:
        return "<p>No interruption in this window.</p>"
    longest = max(i.wall_s + (i.lost_work_s or 0) for i in shown) or 1.0
    scale = (WIDTH - LEFT - 80) / longest
    body = []
    for row, i in enumerate(shown):
        y = 20 + row * ROW
        label = f"job {i.job_id} {i.node} {i.fault_class}"
        body.append(f'<text x="4" y="{y + 11}">{esc(label[:32])}</text>')
        x = float(LEFT)
        parts = [
            ("detection", i.detection_s),
            ("isolation", i.isolation_s),
            ("scheduling", i.scheduling_s),
            ("restart", i.restart_s),
            ("lost_work", i.lost_work_s),
        ]
        for name, value in parts:
            if not value:
                continue
            w = max(value * scale, 0.5)
            body.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{ROW - 3}"'
                f' fill="{COLOURS[name]}"><title>{esc(name)}: {esc(_seconds(value))}</title></rect>'
            )
            x += w
        total = _seconds(i.wall_s) + ("" if i.recovered else " (not running again)")
        body.append(f'<text x="{x + 4:.1f}" y="{y + 11}">{esc(total)}</text>')
    legend_y = 20 + len(shown) * ROW + 14
    x = float(LEFT)
    for name, colour in COLOURS.items():
        body.append(f'<rect x="{x}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>')
        body.append(f'<text x="{x + 14}" y="{legend_y}">{esc(name.replace("_", " "))}</text>')
        x += 110
    return _svg(legend_y + 10, body, "recovery timeline per interruption")


def ettr_over_time(report: rp.Report) -> str:
    jobs = [j for j in report.jobs if j.ettr is not None]
    if not jobs:
        return "<p>No job with a wall time in this window.</p>"
    height, top, bottom = 260, 20, 230
    span = (report.until - report.since).total_seconds() or 1.0
    body = [
        f'<line x1="{LEFT}" y1="{bottom}" x2="{WIDTH - 20}" y2="{bottom}" stroke="#444"/>',
        f'<line x1="{LEFT}" y1="{top}" x2="{LEFT}" y2="{bottom}" stroke="#444"/>',
    ]
    for value in (0.0, 0.5, 0.9, 1.0):
        y = bottom - value * (bottom - top)
        body.append(f'<text x="{LEFT - 40}" y="{y + 4:.1f}">{value:.0%}</text>')
        body.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - 20}" y2="{y:.1f}" stroke="#ddd"/>'
        )
    for j in jobs:
        assert j.ettr is not None
        x = LEFT + (j.ended_at - report.since).total_seconds() / span * (WIDTH - 20 - LEFT)
        y = bottom - j.ettr * (bottom - top)
        colour = "#1f77b4" if not j.ettr_is_upper_bound else "#9ecae1"
        body.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>job'
            f" {esc(j.job_id)}: ETTR {j.ettr:.1%}</title></circle>"
        )
    body.append(f'<text x="{LEFT}" y="{height - 8}">{esc(_day(report.since))}</text>')
    body.append(
        f'<text x="{WIDTH - 20}" y="{height - 8}" text-anchor="end">'
        f"{esc(_day(report.until))}</text>"
    )
    return _svg(height, body, "ETTR per job by the time it ended")


def _day(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%MZ")


def bars(
    rows: Sequence[tuple[str, float, float, bool]], label: str, what: str, names: tuple[str, str]
) -> str:
    """Two bars a row: (name, first, second, highlighted); `names` says what each counts."""
    if not rows:
        return f"<p>No {esc(what)} in this window.</p>"
    biggest = max(max(r[1], r[2]) for r in rows) or 1.0
    scale = (WIDTH - LEFT - 160) / biggest
    half = (ROW - 3) / 2
    body = []
    for n, (name, first, second, marked) in enumerate(rows):
        y = 10 + n * ROW
        body.append(f'<text x="4" y="{y + 11}">{esc(name[:30])}</text>')
        colour = "#d62728" if marked else "#1f77b4"
        body.append(
            f'<rect x="{LEFT}" y="{y}" width="{first * scale:.1f}" height="{half:.1f}"'
            f' fill="#9ecae1"/>'
        )
        body.append(
            f'<rect x="{LEFT}" y="{y + half:.1f}" width="{second * scale:.1f}"'
            f' height="{half:.1f}" fill="{colour}"/>'
        )
        text = f"{first:g} {names[0]}, {second:g} {names[1]}"
        body.append(
            f'<text x="{LEFT + max(first, second) * scale + 4:.1f}" y="{y + 11}">{esc(text)}</text>'
        )
    return _svg(20 + len(rows) * ROW, body, label)


def page(report: rp.Report) -> str:
    fleet = report.fleet
    nodes = [
        (n.node, float(n.episodes), float(n.interruptions), n.lemon)
        for n in fleet.by_node[:MAX_ROWS]
        if n.episodes or n.interruptions
    ]
    rungs = [
        (f"rung {r.rung} {r.action}", float(r.attempts), float(r.worked), False)
        for r in fleet.rungs
    ]
    c = report.components
    rows = "".join(
        f"<tr><td>{esc(name.replace('_', ' '))}</td><td>{s.count}</td>"
        f"<td>{esc(_seconds(s.p50_s))}</td><td>{esc(_seconds(s.p90_s))}</td>"
        f"<td>{esc(_seconds(s.total_s))}</td></tr>"
        for name, s in c.items()
    )
    cannot = "".join(f"<li>{esc(line)}</li>" for line in report.cannot_know)
    humans = "".join(
        f"<li>episode {w.episode_id} on {esc(w.node)} ({esc(w.fault_class or '-')}): waiting"
        f" for a human since {esc(_day(w.waiting_since))}</li>"
        for w in fleet.waiting_for_human
    )
    waiting = f"<h2>Waiting for a human</h2>\n<ul>{humans}</ul>" if humans else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>medic report {esc(_day(report.since))} .. {esc(_day(report.until))}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; max-width: {WIDTH + 40}px; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 2px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} h2 {{ margin-top: 1.6em; }}
.figure {{ font-size: 1.3em; }}
</style></head><body>
<h1>medic report</h1>
<p>{esc(_day(report.since))} .. {esc(_day(report.until))}</p>
<p class="figure">MTTR {esc(_seconds(report.mttr_s))} &middot;
{sum(len(j.interruptions) for j in report.jobs)} interruptions of {len(report.jobs)} jobs &middot;
MTBF {esc(f"{fleet.mtbf_node_hours:,.0f}" if fleet.mtbf_node_hours else "-")} node-hours &middot;
{len(fleet.lemons)} lemons &middot; {len(fleet.false_ejections)} false ejections</p>
<table><tr><th>component</th><th>count</th><th>p50</th><th>p90</th><th>total</th></tr>
{rows}</table>
<h2>Recovery timeline per interruption</h2>
{timeline(report)}
<h2>ETTR per job</h2>
<p>Pale: an upper bound (restart or lost work unknown).</p>
{ettr_over_time(report)}
<h2>Interruptions per node</h2>
<p>Pale: episodes; dark: job interruptions (red: a lemon node).</p>
{bars(nodes, "episodes and interruptions per node", "node with an episode", NODE_BARS)}
<h2>Rungs: how often each worked</h2>
<p>Pale: attempts; dark: the attempts after which re-qualification passed.</p>
{bars(rungs, "rung attempts and successes", "repair step", RUNG_BARS)}
{waiting}
<h2>What this report cannot know yet</h2>
<ul>{cannot}</ul>
</body></html>
"""
