"""Fleet drift, decided: which nodes run another version than they should, item by item.

Pure: inventories and the golden versions in, findings out (no store, no clock, no
commands). Per item and node class (same GPU models and counts):

* with golden versions for the item (`[fleet.golden]`), every value not among them is drift;
* without, the values of the class vote (one vote per node for a node-wide item, per GPU
  for a GPU's, per HCA for an HCA's): a value that is not the most common one is drift; when
  two or more values share the most votes there is no majority, and the values that tie are
  reported as AMBIGUOUS (a human picks the right one, or names it golden), never as drift.

A value not known (None) neither votes nor is reported.
"""

from __future__ import annotations

import enum
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from medic_core.inventory import ITEMS, NodeInventory


class Basis(enum.StrEnum):
    GOLDEN = "golden"  # not among the configured versions
    MAJORITY = "majority"  # not the most common value of the node class
    AMBIGUOUS = "ambiguous"  # among values that tie for most common: no majority to go by


@dataclass(frozen=True)
class DriftFinding:
    node: str
    node_class: str
    item: str  # one of medic_core.inventory.ITEMS
    target: str  # "" node-wide, "GPU 3", "mlx5_0"
    value: str
    expected: tuple[str, ...]  # the golden versions, the majority value, or the tied values
    basis: Basis

    @property
    def is_drift(self) -> bool:
        return self.basis is not Basis.AMBIGUOUS


def find_drift(
    inventories: Mapping[str, NodeInventory],
    golden: Mapping[str, Iterable[str]] | None = None,
) -> list[DriftFinding]:
    """Every finding, ordered by node class, node, item (in ITEMS' order) and target."""
    wanted = {item: tuple(values) for item, values in (golden or {}).items()}
    by_class: dict[str, list[str]] = defaultdict(list)
    for node, inventory in inventories.items():
        by_class[inventory.node_class].append(node)
    findings: list[DriftFinding] = []
    for node_class, nodes in by_class.items():
        for item in ITEMS:
            seen = [
                (node, target, value)
                for node in nodes
                for target, value in inventories[node].values(item)
                if value is not None
            ]
            findings += _judge(node_class, item, seen, wanted.get(item))
    order = {item: i for i, item in enumerate(ITEMS)}
    findings.sort(key=lambda f: (f.node_class, f.node, order[f.item], _target_key(f.target)))
    return findings


def _judge(
    node_class: str,
    item: str,
    seen: list[tuple[str, str, str]],
    golden: tuple[str, ...] | None,
) -> list[DriftFinding]:
    if golden:
        return [
            DriftFinding(node, node_class, item, target, value, golden, Basis.GOLDEN)
            for node, target, value in seen
            if value not in golden
        ]
    votes = Counter(value for _, _, value in seen)
    if not votes:
        return []
    top = max(votes.values())
    leaders = tuple(sorted(v for v, n in votes.items() if n == top))
    out = []
    for node, target, value in seen:
        if len(leaders) > 1 and value in leaders:
            out.append(DriftFinding(node, node_class, item, target, value, leaders,
                                    Basis.AMBIGUOUS))  # fmt: skip
        elif value not in leaders:
            out.append(DriftFinding(node, node_class, item, target, value, leaders,
                                    Basis.MAJORITY))  # fmt: skip
    return out


def _target_key(target: str) -> tuple[int, str]:
    """GPU 10 after GPU 9."""
    head, _, number = target.rpartition(" ")
    return (int(number), head) if head and number.isdigit() else (-1, target)
