"""The alert rules shipped in docs/prometheus (goodput issue, Prometheus part): promtool
accepts them, their unit tests (medic-alerts.test.yml: series in, alerts expected out) pass,
and every metric they query is one a real medic-healthd exports."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from healthd.daemon import HealthDaemon
from medic_core import proc
from tests.test_metrics import (  # noqa: F401  (daemon: a fixture)
    daemon,
    exportable,
    full_exposition,
    needs_promtool,
    promtool,
)

RULES_DIR = Path(__file__).parents[1] / "docs" / "prometheus"
RULES = RULES_DIR / "medic-alerts.yml"
RULE_TESTS = RULES_DIR / "medic-alerts.test.yml"
# Not Medic's: the series Prometheus itself writes for every target.
PROMETHEUS_OWN = {"up"}


def expressions(path: Path) -> dict[str, str]:
    """alert name -> its expr (one line, or a `|` block), read without a YAML library."""
    found: dict[str, str] = {}
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        alert = re.match(r"\s*- alert: (\S+)", line)
        if not alert:
            continue
        expr_at = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("expr:"))
        head = lines[expr_at].split("expr:", 1)[1].strip()
        if head != "|":
            found[alert.group(1)] = head
            continue
        indent = len(lines[expr_at]) - len(lines[expr_at].lstrip())
        body = []
        for following in lines[expr_at + 1 :]:
            if following.strip() and len(following) - len(following.lstrip()) <= indent:
                break
            body.append(following.strip())
        found[alert.group(1)] = " ".join(body).strip()
    return found


def test_the_rules_cover_what_an_operator_alerts_on() -> None:
    assert set(expressions(RULES)) == {
        "MedicCriticalNodeInService",  # a CRITICAL on a node Slurm still schedules
        "MedicEpisodeWaitingOnHuman",  # an episode waiting on a human for over an hour
        "MedicRemediationPaused",  # the fleet paused
        "MedicDaemonDown",  # a daemon silent: no scrape for 15 min
        "MedicChecksStalled",  # ... or no check results for 15 min
        "MedicStoreUnreachable",
        "MedicNodeInRmaTooLong",  # a node in RMA for over 7 days
    }


def test_every_metric_the_rules_query_is_exported_by_a_real_daemon(daemon: HealthDaemon) -> None:  # noqa: F811
    exported = exportable(full_exposition(daemon))
    queried = {
        name
        for expr in expressions(RULES).values()
        for name in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.sub(r'"[^"]*"', "", expr))
        if name.startswith("medic_") or name in PROMETHEUS_OWN
    }
    assert "medic_slurm_node_in_service" in queried and "medic_build_info" in queried
    assert queried - PROMETHEUS_OWN <= exported, queried - PROMETHEUS_OWN - exported


@needs_promtool
def test_promtool_check_rules() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


@needs_promtool
def test_promtool_test_rules() -> None:
    """medic-alerts.test.yml: each rule fires on the node it should, after its `for`, with
    its labels (the node's name joined from medic_build_info) and annotations, and not on
    the nodes beside it (drained, healthy, too recent, never asked Slurm)."""
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


ROUTES = RULES_DIR / "alertmanager-routes.yml"
PAGED = {
    "MedicCriticalNodeInService",
    "MedicEpisodeWaitingOnHuman",  # a stuck episode
    "MedicRemediationPaused",  # a fleet pause
    "MedicDaemonDown",
    "MedicChecksStalled",
}


def routed(path: Path) -> dict[str, str]:
    """alert name -> the receiver of the first route whose alertname matcher takes it."""
    found: dict[str, str] = {}
    receiver = ""
    for line in path.read_text().splitlines():
        named = re.match(r"\s*- receiver: (\S+)", line)
        if named:
            receiver = named.group(1)
        matcher = re.match(r'\s*- alertname=~"([^"]+)"', line)
        if matcher:
            for name in matcher.group(1).split("|"):
                found.setdefault(name, receiver)
    return found


def test_every_alert_is_routed_and_what_needs_a_human_now_pages() -> None:
    routes = routed(ROUTES)
    alerts = set(expressions(RULES))
    assert set(routes) == alerts, f"routed but no such alert, or not routed: {set(routes) ^ alerts}"
    assert {name for name, receiver in routes.items() if receiver == "medic-pager"} == PAGED


AMTOOL = shutil.which("amtool")


@pytest.mark.skipif(
    AMTOOL is None, reason="amtool not installed (Debian: prometheus-alertmanager; bootstrap)"
)
def test_alertmanager_takes_the_routes_and_sends_each_alert_where_they_say() -> None:
    assert AMTOOL is not None
    checked = proc.run([AMTOOL, "check-config", str(ROUTES)], timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    for alert, receiver in routed(ROUTES).items():
        sent = proc.run(
            [AMTOOL, "config", "routes", "test", f"--config.file={ROUTES}",
             f"alertname={alert}", "node=n1"],
            timeout=60,
        )  # fmt: skip
        assert sent.stdout.strip() == receiver, (alert, sent.stdout, sent.stderr)
