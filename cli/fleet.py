"""`medic fleet drift`: the nodes whose versions differ from the golden ones in `[fleet.golden]`
or, for an item without them, from the most common value of their node class
(remediation.drift decides; each node's daemon records its inventory: healthd.inventory).

Reads the store through the database driver alone when it can (cli.common.read_store): no
SQLAlchemy on the way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from cli.common import (
    EXIT_USAGE,
    AdminError,
    config_option,
    echo_json,
    echo_table,
    iso,
    json_option,
    load,
    read_store,
    store_option,
    warn,
)
from medic_core.config import ConfigError
from medic_core.inventory import FleetSettings, NodeInventory
from medic_core.store_reader import Reader
from remediation.drift import Basis, DriftFinding, find_drift

HEADERS = ("NODE", "CLASS", "ITEM", "TARGET", "VALUE", "EXPECTED", "WHY")
WHY = {
    Basis.GOLDEN: "not golden",
    Basis.MAJORITY: "not the class majority",
    Basis.AMBIGUOUS: "ambiguous: no majority",
}


@click.group("fleet")
def fleet() -> None:
    """The fleet as a whole: nodes that run other versions than their peers."""


def read_inventories(reader: Reader) -> tuple[dict[str, NodeInventory], dict[str, Any]]:
    """(node -> inventory, node -> when its daemon last looked); a row this Medic cannot
    read is left out with a warning naming the node."""
    inventories: dict[str, NodeInventory] = {}
    seen: dict[str, Any] = {}
    rows = reader.rows("SELECT node, inventory, seen_at FROM node_inventory ORDER BY node")
    for node, data, seen_at in rows:
        try:
            inventories[node] = NodeInventory.from_json(reader.data(data))
        except ValueError as exc:
            warn(f"node {node}: its inventory is left out", str(exc), "restart its medic-healthd")
            continue
        seen[node] = reader.when(seen_at)
    return inventories, seen


def _finding_json(finding: DriftFinding) -> dict[str, Any]:
    return {
        "node": finding.node,
        "class": finding.node_class,
        "item": finding.item,
        "target": finding.target,
        "value": finding.value,
        "expected": list(finding.expected),
        "basis": finding.basis.value,
        "drift": finding.is_drift,
    }


@fleet.command("drift")
@config_option
@store_option
@json_option
def drift(config_path: Path | None, store_url: str | None, as_json: bool) -> None:
    """Nodes whose driver, CUDA, kernel, BIOS, VBIOS, InfoROM or HCA firmware differs from
    [fleet.golden] or from the majority of their class (same GPU model and count).

    Report only: nothing is drained. A tie for the most common value is listed as
    ambiguous, not as drift. Exit 0 whatever is found (1: the store or config is bad).
    """
    config = load(config_path)
    try:
        settings = FleetSettings.from_config(config)
    except ConfigError as exc:
        raise AdminError(
            "the configuration has a bad [fleet] table", str(exc), "fix it", EXIT_USAGE
        ) from exc
    with read_store(config, store_url) as reader:
        inventories, seen = read_inventories(reader)
    findings = find_drift(inventories, settings.golden)
    drifting = sorted({f.node for f in findings if f.is_drift})
    ambiguous = sorted({f.node for f in findings if not f.is_drift})
    if as_json:
        echo_json(
            {
                "nodes": len(inventories),
                "drifting": drifting,
                "ambiguous": ambiguous,
                "golden": {item: list(values) for item, values in settings.golden.items()},
                "findings": [_finding_json(f) for f in findings],
                "seen_at": {node: iso(at) for node, at in seen.items()},
            }
        )
        return
    if not inventories:
        click.echo(
            "no inventories recorded yet: each node's medic-healthd records its own when it starts"
        )
        return
    if findings:
        echo_table(
            HEADERS,
            (
                (f.node, f.node_class, f.item, f.target or "-", f.value,
                 ", ".join(f.expected), WHY[f.basis])
                for f in findings
            ),
        )  # fmt: skip
    words = f"{len(drifting)} of {len(inventories)} nodes drift"
    if ambiguous:
        words += (
            f"; {len(ambiguous)} with items that have no majority (name them in [fleet.golden])"
        )
    click.echo(words)
