"""`medic check`: run health checks on this node once, now, in this process.

The same checks, configuration and runner as `medic-healthd` (and the prolog's inline launch
tier, healthd.inline.run_inline): fresh check instances, the node's NVML when there is
a driver. Launch and periodic checks run in parallel, as the daemon runs them; deep checks
run one after another, because each measures a bandwidth or a throughput that a second one
running beside it would take a share of.

Exit codes (worst result wins, in this order): 1 a CRITICAL result (the prolog would refuse
jobs), 3 an UNKNOWN result (a check could not tell: error, timeout, no NVML), 4 a WARN
result, 0 only OK and NOT_APPLICABLE; 2 a usage or configuration error.

`--requalify` is the end of an RMA (docs/rma.md): the checks the ladder verifies a repair
with; when they pass, the closed tickets' re-qualification flag is cleared and Medic's drain
resumed. Exit 0 re-qualified, 1 not.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli.admin import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    AdminError,
    actor,
    clip,
    config_option,
    echo_json,
    echo_table,
    iso,
    json_option,
    load,
    slurm_client,
    store_option,
    warn,
)
from healthd.checks.base import (
    CheckConfig,
    CheckContext,
    Result,
    Status,
    Tier,
    gpu_checks_skipped,
)
from healthd.runner import CheckOutcome, Runner
from medic_core.config import ConfigError, MedicConfig
from medic_core.slurm import SlurmError
from medic_core.status import Severity

# The store (SQLAlchemy) loads when results are recorded, not for `medic check --help`.
if TYPE_CHECKING:
    from medic_core.store import Store

EXIT_UNKNOWN = 3
EXIT_WARN = 4
EXIT_FOR = {
    Status.CRITICAL: EXIT_PROBLEM,
    Status.UNKNOWN: EXIT_UNKNOWN,
    Status.WARN: EXIT_WARN,
    Status.OK: EXIT_OK,
    Status.NOT_APPLICABLE: EXIT_OK,
}
DEFAULT_TIERS = (Tier.LAUNCH, Tier.PERIODIC)  # deep loads the node: only when asked
NVML_CALL_TIMEOUT = 3.0
HEADERS = ("CHECK", "TARGET", "STATUS", "FAULT", "MESSAGE")


@dataclass(frozen=True)
class Plan:
    """Which checks to run, and which were left out and why."""

    names: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (check, why)
    sequential: bool


def exit_code(results: Iterable[Result]) -> int:
    """1 CRITICAL, 3 UNKNOWN, 4 WARN, 0 otherwise (the worst present decides)."""
    present = {r.status for r in results}
    for status in (Status.CRITICAL, Status.UNKNOWN, Status.WARN):
        if status in present:
            return EXIT_FOR[status]
    return EXIT_OK


def worst_status(results: Iterable[Result]) -> Status:
    found = [r.status for r in results]
    return max(found, key=lambda s: s.severity) if found else Status.NOT_APPLICABLE


def result_json(r: Result) -> dict[str, Any]:
    return {
        "check": r.check,
        "status": r.status.value,
        "fault_class": r.fault_class,
        "target": r.target,
        "message": r.message,
        "remediation": r.remediation.value if r.remediation else None,
        "kind": r.kind.value,
        "evidence": dict(r.evidence),
    }


def report_json(
    node: str,
    tiers: Sequence[str],
    outcomes: Sequence[CheckOutcome],
    skipped: Sequence[tuple[str, str]],
    started: dt.datetime,
    seconds: float,
) -> dict[str, Any]:
    results = [r for o in outcomes for r in o.results]
    return {
        "node": node,
        "tiers": list(tiers),
        "started_at": iso(started),
        "seconds": round(seconds, 3),
        "status": worst_status(results).value,
        "exit_code": exit_code(results),
        "checks": [
            {
                "name": o.name,
                "state": o.state.value,
                "seconds": round(o.seconds, 3),
                "results": [result_json(r) for r in o.results],
            }
            for o in outcomes
        ],
        "skipped": [{"check": name, "why": why} for name, why in skipped],
    }


def result_rows(outcomes: Iterable[CheckOutcome]) -> list[list[str]]:
    return [
        [r.check, r.target or "-", r.status.value, r.fault_class or "-", clip(r.message, 90)]
        for o in outcomes
        for r in o.results
    ]


def summary_line(node: str, outcomes: Sequence[CheckOutcome], seconds: float) -> str:
    """`n3: 15 checks, 97 results: 1 CRITICAL, 0 UNKNOWN, 2 WARN (1.3s)`."""
    results = [r for o in outcomes for r in o.results]
    counts = {s: sum(1 for r in results if r.status is s) for s in Status}
    bad = ", ".join(
        f"{counts[s]} {s.value}" for s in (Status.CRITICAL, Status.UNKNOWN, Status.WARN)
    )
    noun = "check" if len(outcomes) == 1 else "checks"
    return f"{node}: {len(outcomes)} {noun}, {len(results)} results: {bad} ({seconds:.1f}s)"


def skipped_lines(skipped: Sequence[tuple[str, str]]) -> list[str]:
    """One line per reason: `skipped (why): a, b, c`."""
    by_why: dict[str, list[str]] = {}
    for name, why in skipped:
        by_why.setdefault(why, []).append(name)
    return [f"skipped ({why}): {', '.join(names)}" for why, names in by_why.items()]


def plan(runner: Runner, tiers: Sequence[Tier], wanted: Sequence[str]) -> Plan:
    """The checks `medic check` runs: `wanted` (every enabled check when empty) in `tiers`,
    without the checks this node does not run (GPU checks on a CPU node: `Runner.not_here`,
    the daemon's rule too). Raises AdminError (usage) for an unknown name or an empty
    selection."""
    specs = runner.specs
    unknown = sorted(set(wanted) - set(specs))
    if unknown:
        raise AdminError(
            f"no check named {', '.join(unknown)}",
            "not a registered check",
            f"use one of: {', '.join(sorted(specs))} (medic checks list)",
            EXIT_USAGE,
        )
    skipped: list[tuple[str, str]] = []
    names: list[str] = []
    for name in wanted or sorted(specs):
        spec = specs[name]
        if not spec.tiers & set(tiers):
            if wanted:
                tier_words = ",".join(sorted(t.value for t in spec.tiers))
                skipped.append((name, f"not in the {'/'.join(tiers)} tier ({tier_words})"))
            continue
        if not runner.configs[name].enabled:
            skipped.append((name, "disabled in medic.toml ([checks] disabled, or enabled = false)"))
            continue
        why = runner.not_here(name)
        if why:
            skipped.append((name, why))
            continue
        names.append(name)
    if not names:
        why = "; ".join(f"{n}: {w}" for n, w in skipped) or "no check is in that tier"
        raise AdminError("no check to run", why, "pick others with --check or --tier",
                         EXIT_USAGE)  # fmt: skip
    return Plan(tuple(names), tuple(skipped), sequential=Tier.DEEP in tiers)


@contextmanager
def nvml_for(gpus: str) -> Iterator[tuple[Any, str]]:
    """(the NVML client or None, why the GPU checks are left out or ""), by the rule the
    daemon and the prolog's inline run follow (`gpu_checks_skipped`): no driver on an
    `auto` node is a CPU node."""
    if gpus == "none":
        yield None, gpu_checks_skipped(gpus, driver=False)
        return
    from healthd.nvml_client import NvmlError, NvmlUnavailable, PynvmlClient

    opened = PynvmlClient(call_timeout=NVML_CALL_TIMEOUT)
    client: PynvmlClient | None = opened
    try:
        opened.open()
    except NvmlUnavailable:
        client = None
    except NvmlError:
        pass  # a GPU node in trouble: the GPU checks report it
    try:
        yield client, gpu_checks_skipped(gpus, driver=client is not None)
    finally:
        if client is not None:
            client.close()


def run_plan(runner: Runner, chosen: Plan, budget: float | None) -> list[CheckOutcome]:
    """All at once (launch, periodic), or one by one with a progress bar on a terminal."""
    if not chosen.sequential:
        return list(runner.run(list(chosen.names), budget=budget).outcomes)
    outcomes: list[CheckOutcome] = []
    if not sys.stderr.isatty():
        for name in chosen.names:
            outcomes += runner.run([name]).outcomes
        return outcomes
    with click.progressbar(
        chosen.names,
        label="deep checks",
        file=sys.stderr,
        item_show_func=lambda n: n or "",
    ) as bar:
        for name in bar:
            outcomes += runner.run([name]).outcomes
    return outcomes


@contextmanager
def _writable_store(config: MedicConfig, url: str | None) -> Iterator[Store]:
    """The store to record in; created when missing, as the daemon would create it (unlike
    the listings, which refuse a SQLite file that does not exist)."""
    from medic_core.store import BadStoreURL, StoreError, open_store, store_settings

    try:
        store = open_store(url if url is not None else store_settings(config).url)
    except (ConfigError, BadStoreURL, StoreError) as exc:
        raise AdminError(
            "cannot open the store to record the results", str(exc),
            "check [store] url (medic config check) or pass --store URL",
        ) from exc  # fmt: skip
    with store:
        yield store


def record(
    config: MedicConfig,
    store_url: str | None,
    node: str,
    outcomes: Sequence[CheckOutcome],
    at: dt.datetime,
) -> int:
    """Write the results to the store as the daemon would (conditions, and events that carry
    a fault class), in the daemon's recorder's forms (healthd.recorder); returns how many
    conditions changed. Drains and the ladder are the daemon's: nothing here acts on a fault."""
    from healthd.recorder import (
        condition_update,
        conditions_of,
        event_fields,
        fault_events,
        no_longer_reported,
    )

    changed = 0
    with _writable_store(config, store_url) as store:
        stored = store.conditions(node=node)
        for o in outcomes:
            updates = [condition_update(r) for r in conditions_of(o.results)]
            # This run speaks for the whole check: a target it no longer reports (a GPU's
            # XID aged out) is cleared, as the daemon clears it, not left CRITICAL.
            previous = [
                (c.type, c.target) for c in stored if c.type == o.name and c.status is not Status.OK
            ]
            updates += no_longer_reported(previous, updates)
            changes = store.set_conditions(node, updates, at) if updates else []
            changed += sum(1 for c in changes if c.previous_status != c.status)
            for event in fault_events(o.results):
                store.add_event(node, at=at, **event_fields(event, "cli:medic check"))
    return changed


def _check_configs(config: MedicConfig) -> tuple[dict[str, CheckConfig], str, float]:
    from healthd.checks import load_check_configs
    from medic_core.settings import DaemonSettings

    try:
        settings = DaemonSettings.from_config(config)
        return load_check_configs(config), settings.gpus, settings.launch_budget
    except ConfigError as exc:
        raise AdminError(
            "the configuration has a bad table", str(exc), "fix it (medic config check)", EXIT_USAGE
        ) from exc


@click.command("check")
@click.option(
    "--tier",
    "tier_word",
    type=click.Choice([t.value for t in Tier], case_sensitive=False),
    help="Only this tier's checks (default: launch and periodic; deep loads the node).",
)
@click.option(
    "--check",
    "names",
    multiple=True,
    metavar="NAME",
    help="Only this check (repeatable; any tier unless --tier): see `medic checks list`.",
)
@click.option(
    "--record",
    "record_results",
    is_flag=True,
    help="Also write the results to the store as this node's conditions.",
)
@click.option(
    "--requalify",
    is_flag=True,
    help="After an RMA ticket was closed: run the re-qualification checks, and if they pass, "
    "clear the tickets' flag and resume the node (if Medic drained it).",
)
@json_option
@store_option
@config_option
def check(
    tier_word: str | None,
    names: tuple[str, ...],
    record_results: bool,
    requalify: bool,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> None:
    """Run health checks on this node now, in this process; exit 0 healthy, 1 CRITICAL,
    3 UNKNOWN, 4 WARN (2: usage). With --requalify: 0 re-qualified, 1 not."""
    if requalify:
        if tier_word or names:
            raise AdminError(
                "--requalify runs its own set of checks",
                "re-qualification is the launch and periodic tiers plus [remediation] "
                "requalify_checks, as the ladder runs it",
                "drop --tier and --check",
                EXIT_USAGE,
            )
        code = _requalify(as_json, store_url, config_path)
    else:
        code = _check(tier_word, names, record_results, as_json, store_url, config_path)
    if code != EXIT_OK:
        raise SystemExit(code)


def _check(
    tier_word: str | None,
    names: tuple[str, ...],
    record_results: bool,
    as_json: bool,
    store_url: str | None,
    config_path: Path | None,
) -> int:
    config = load(config_path)
    configs, gpus, launch_budget = _check_configs(config)
    if tier_word:
        tiers: tuple[Tier, ...] = (Tier(tier_word.lower()),)
    elif names:
        tiers = tuple(Tier)
    else:
        tiers = DEFAULT_TIERS
    started = dt.datetime.now(dt.UTC)
    begin = time.monotonic()
    with nvml_for(gpus) as (client, skip_gpu):
        ctx = CheckContext.for_root(config.paths.host_root, nvml=client, gpu_skip=skip_gpu)
        runner = Runner(ctx, configs)
        chosen = plan(runner, tiers, list(dict.fromkeys(names)))
        # The launch tier alone runs within the prolog's budget, as it would at a job start.
        budget = launch_budget if tiers == (Tier.LAUNCH,) else None
        outcomes = run_plan(runner, chosen, budget)
    seconds = time.monotonic() - begin
    results = [r for o in outcomes for r in o.results]
    node = config.node_name
    if record_results:
        try:
            record(config, store_url, node, outcomes, started)
        except ValueError as exc:
            raise AdminError("cannot record the results", str(exc), "check the store") from exc
    if as_json:
        words = [t.value for t in tiers]
        echo_json(report_json(node, words, outcomes, chosen.skipped, started, seconds))
        return exit_code(results)
    echo_table(HEADERS, result_rows(outcomes))
    click.echo(summary_line(node, outcomes, seconds))
    for line in skipped_lines(chosen.skipped):
        click.echo(line)
    if record_results:
        click.echo(f"recorded in the store as {node}'s conditions")
    if not results:
        warn("the checks returned no results")
    return exit_code(results)


# --- re-qualification after an RMA ----------------------------------------------------------


def blocking(results: Iterable[Result]) -> list[Result]:
    """What keeps a node out after a repair: CRITICAL or UNKNOWN (as the ladder verifies)."""
    return [r for r in results if r.status in (Status.CRITICAL, Status.UNKNOWN)]


def _requalify(as_json: bool, store_url: str | None, config_path: Path | None) -> int:
    from medic_core.drain_book import DrainBook, operator
    from medic_core.drain_reason import DrainOutcome
    from medic_core.settings import RemediationSettings
    from remediation import episodes as ep
    from remediation import tickets
    from remediation.give_back import give_back

    config = load(config_path)
    configs, gpus, _ = _check_configs(config)
    try:
        extra = RemediationSettings.from_config(config).requalify_checks
    except ConfigError as exc:
        raise AdminError("the configuration has a bad [remediation] table", str(exc),
                         "fix it (medic config check)", EXIT_USAGE) from exc  # fmt: skip
    node = config.node_name
    with _writable_store(config, store_url) as store:
        if not tickets.needs_requalification(store, node):
            raise AdminError(
                f"{node} has no closed RMA ticket waiting for re-qualification",
                "--requalify clears what `medic rma close` set, and nothing is set",
                "run `medic check` to see the node's health, `medic rma list --node "
                f"{node} --all` for its tickets",
            )
    started = dt.datetime.now(dt.UTC)
    begin = time.monotonic()
    with nvml_for(gpus) as (client, skip_gpu):
        ctx = CheckContext.for_root(config.paths.host_root, nvml=client, gpu_skip=skip_gpu)
        runner = Runner(ctx, configs)
        chosen = plan(runner, DEFAULT_TIERS, ())
        outcomes = run_plan(runner, chosen, None)
        if extra:  # one by one, like the deep tier
            outcomes += run_plan(runner, plan(runner, tuple(Tier), list(extra)), None)
    seconds = time.monotonic() - begin
    record(config, store_url, node, outcomes, started)
    results = [r for o in outcomes for r in o.results]
    stopped = blocking(results)
    cleared: list[int] = []
    outcome = ""
    slurm_error = ""
    if not stopped:
        who = actor()
        with _writable_store(config, store_url) as store:
            cleared = tickets.requalified(
                store, node, who, f"medic check --requalify: {len(outcomes)} checks passed"
            )
            episodes = ep.EpisodeStore(store)
            for e in episodes.find(node=node, states=(ep.RMA,)):
                if e.ticket_id in cleared:
                    episodes.update(e.id, state=ep.RESOLVED, message=f"{e.message}; re-qualified")
            try:  # through the decision core: only a drain Medic's records hold
                outcome = give_back(
                    slurm_client(config),
                    DrainBook.of(store),
                    node,
                    actor=operator(),
                    human=True,
                    rma_open=tickets.open_tickets(store, node),
                    note="medic check --requalify",
                ).text
            except SlurmError as exc:
                slurm_error = str(exc)
            store.add_event(
                node, at=dt.datetime.now(dt.UTC), kind="admin", severity=Severity.INFO,
                source=f"cli:{who}", message=f"re-qualified by {who}: {outcome or slurm_error}",
                evidence={"action": "requalify", "actor": who, "tickets": cleared,
                          "slurm": outcome or slurm_error},
            )  # fmt: skip
    if as_json:
        doc = report_json(node, [t.value for t in DEFAULT_TIERS], outcomes, chosen.skipped,
                          started, seconds)  # fmt: skip
        doc.update(requalified=not stopped, tickets_cleared=cleared, slurm=outcome or slurm_error)
        echo_json(doc)
    else:
        rows = [row for row in result_rows(outcomes) if row[2] in ("CRITICAL", "UNKNOWN")]
        if rows:
            echo_table(HEADERS, rows)
        click.echo(summary_line(node, outcomes, seconds))
    if stopped:
        first = stopped[0]
        if not as_json:
            click.echo(f"{node} did not pass re-qualification: it stays out of service")
        raise AdminError(
            f"{node} is not re-qualified: {first.check} {first.status.value}",
            first.message,
            "repair it and run `medic check --requalify` again, or reopen the RMA",
        )
    if not as_json:
        ids = ", ".join(str(i) for i in cleared)
        click.echo(f"{node} re-qualified (RMA ticket {ids} cleared): {outcome or 'Slurm: ?'}")
        if outcome.startswith(DrainOutcome.NOT_OURS.value):
            click.echo(f"(the drain is not Medic's: `medic node resume {node} --force` when sure)")
    if slurm_error:
        raise AdminError(
            f"{node} re-qualified, but Slurm did not resume it", slurm_error,
            f"resume it with `medic node resume {node} --reason TEXT`",
        )  # fmt: skip
    return EXIT_OK
