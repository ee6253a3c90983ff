"""Pair tests, the pure part: which pairs of nodes to test in the next round, what the
results so far say of each node, and whether one pair's measurements pass.

A round is a set of disjoint pairs run at once (each pair one 2-node Slurm job). Round 1
pairs the nodes in name order; a passing pair makes both its nodes known-good. A node is
named bad only when it failed with `confirm` (default 2) distinct known-good partners, so
with measurements that are consistent (a pair passes exactly when both nodes are good) a
good node is never named: its partners in failing pairs were bad, never known-good. The
partner of a failing pair is re-tested against a known-good node in the next round, which
also makes the first failure count: with one bad node among N >= 3 it is named within
`round_limit(N)` = ceil(log2 N) + 2 rounds (tests/test_sweep_pairs.py holds that for every
N in 2..64). With N = 2, or every pair failing, there is no known-good node: the failing
nodes stay suspects and nothing is named.

Flaky results: a known-good node that fails with another known-good node contradicts the
model; both become `flaky` (reported, never named, not re-tested). A pair whose job did not
run or printed no measurement is inconclusive and may be tried again; a node with
`max_inconclusive` of those is given up. A node that is no longer available (drained,
down, gone) is simply left out of later rounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from remediation.sweep.policy import FAIL, INCONCLUSIVE, PASS, natural_key

Pair = tuple[str, str]


def round_limit(nodes: int) -> int:
    """Rounds a pair sweep of `nodes` runs at most: ceil(log2 N) + 2."""
    return math.ceil(math.log2(max(nodes, 2))) + 2


def pair_of(a: str, b: str) -> Pair:
    return (a, b) if natural_key(a) <= natural_key(b) else (b, a)


@dataclass(frozen=True)
class PairResult:
    """One pair test: both nodes, the round, the outcome (pass, fail, inconclusive), the
    measured figures (GB/s or Gb/s by name) and why, in words."""

    a: str
    b: str
    round: int
    outcome: str
    measured: Mapping[str, float] = field(default_factory=dict)
    why: str = ""

    @property
    def pair(self) -> Pair:
        return pair_of(self.a, self.b)

    def partner(self, node: str) -> str:
        return self.b if node == self.a else self.a


@dataclass(frozen=True)
class PairVerdicts:
    good: frozenset[str]
    bad: Mapping[str, tuple[str, ...]]  # node -> the known-good partners it failed with
    flaky: frozenset[str]
    suspects: frozenset[str]  # failed, but not yet with `confirm` known-good partners
    given_up: frozenset[str]  # too many inconclusive tests
    untested: frozenset[str]


def verdicts(
    nodes: Iterable[str],
    results: Sequence[PairResult],
    confirm: int = 2,
    max_inconclusive: int = 2,
) -> PairVerdicts:
    names = set(nodes)
    decided = [r for r in results if r.outcome in (PASS, FAIL)]
    good = {n for r in decided if r.outcome == PASS for n in (r.a, r.b)}
    flaky: set[str] = set()
    while True:  # a known-good node failing with a known-good node: both are flaky
        clash = {
            n
            for r in decided
            if r.outcome == FAIL and r.a in good and r.b in good
            for n in (r.a, r.b)
        }
        if not clash:
            break
        flaky |= clash
        good -= clash
    failed_with: dict[str, set[str]] = {}
    failed: set[str] = set()
    for r in decided:
        if r.outcome != FAIL:
            continue
        for node in (r.a, r.b):
            failed.add(node)
            if r.partner(node) in good:
                failed_with.setdefault(node, set()).add(r.partner(node))
    bad = {
        n: tuple(sorted(p, key=natural_key))
        for n, p in failed_with.items()
        if n not in good and n not in flaky and len(p) >= max(confirm, 1)
    }
    errors: dict[str, int] = {}
    for r in results:
        if r.outcome == INCONCLUSIVE:
            for node in (r.a, r.b):
                errors[node] = errors.get(node, 0) + 1
    tested = {n for r in decided for n in (r.a, r.b)}
    settled = good | flaky | set(bad)
    given_up = {n for n, k in errors.items() if k >= max_inconclusive and n not in settled}
    return PairVerdicts(
        good=frozenset(good & names),
        bad={n: p for n, p in bad.items() if n in names},
        flaky=frozenset(flaky & names),
        suspects=frozenset((failed - settled - given_up) & names),
        given_up=frozenset(given_up & names),
        untested=frozenset(names - tested - given_up),
    )


def next_round(
    available: Iterable[str],
    results: Sequence[PairResult],
    confirm: int = 2,
    max_inconclusive: int = 2,
) -> list[Pair]:
    """The pairs to test next among the `available` nodes (empty: nothing left to learn).
    Suspects first, then untested nodes, each with a known-good partner it was not yet
    tested with; those left over are paired with each other (pairs not tested before)."""
    nodes = sorted(set(available), key=natural_key)
    v = verdicts(nodes, results, confirm, max_inconclusive)
    tested = {r.pair for r in results if r.outcome in (PASS, FAIL)}
    open_ = [n for n in nodes if n in v.suspects] + [n for n in nodes if n in v.untested]
    partners = [n for n in nodes if n in v.good]
    used: set[str] = set()
    pairs: list[Pair] = []
    for node in open_:
        partner = next(
            (g for g in partners if g not in used and pair_of(node, g) not in tested), None
        )
        if partner is not None:
            pairs.append(pair_of(node, partner))
            used |= {node, partner}
    left = [n for n in open_ if n not in used]
    for i, node in enumerate(left):
        if node in used:
            continue
        partner = next(
            (m for m in left[i + 1 :] if m not in used and pair_of(node, m) not in tested), None
        )
        if partner is not None:
            pairs.append(pair_of(node, partner))
            used |= {node, partner}
    return pairs


@dataclass(frozen=True)
class PairJudgement:
    outcome: str
    why: str


def judge_pair(
    measured: Mapping[str, float], floors: Mapping[str, float], wanted: Sequence[str]
) -> PairJudgement:
    """Pass when every wanted test measured at least its floor (0 or absent: no floor);
    inconclusive when one printed no figure; else fail, naming each shortfall."""
    missing = [t for t in wanted if t not in measured]
    if missing:
        return PairJudgement(INCONCLUSIVE, f"no figure for {', '.join(missing)}")
    short = [
        f"{t} {measured[t]:g} < {floors[t]:g}"
        for t in wanted
        if floors.get(t, 0.0) > 0 and measured[t] < floors[t]
    ]
    if short:
        return PairJudgement(FAIL, "; ".join(short))
    return PairJudgement(PASS, ", ".join(f"{t} {measured[t]:g}" for t in wanted))
