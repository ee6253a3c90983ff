"""Pair tests, the runner (`medic sweep run --pairs`): take idle nodes with one reservation,
run rounds of 2-node jobs planned by `remediation.sweep.pairs` until the bad nodes are named
or nothing is left to learn (at most ceil(log2 N) + 2 rounds), hand each named node to the
ladder (the decision core: kill switch, drain cap, lemon) while the reservation still holds
it, then give every node back.

Holding all the nodes in one reservation (created only while they are idle: Slurm refuses
a reservation over a busy node) means no job is pre-empted and none can start on a node
between rounds; a node drained, downed or gone mid-sweep is left out of the later rounds.
A killed pair sweep leaves its reservation (`medic-sweep-pairs`), which the next one, under
the one-sweep lock, cancels and deletes first: no other sweep can own it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from medic_core.config import MedicConfig
from medic_core.pair_settings import FIGURE, IB, PairSettings
from medic_core.settings import SweepSettings
from medic_core.slurm import NodeInfo, SlurmError
from medic_core.status import Status
from medic_core.store import Severity, Store
from medic_core.vocabulary import Finding, Recommendation
from remediation import episodes as ep
from remediation.sweep.pair_jobs import (
    PAIR_RESERVATION,
    PairSlurm,
    node_classes,
    pair_floors,
    result_json,
    run_pair,
)
from remediation.sweep.pairs import (
    PairResult,
    PairVerdicts,
    next_round,
    round_limit,
    verdicts,
)
from remediation.sweep.policy import FAIL, PASS, availability, natural_key, partition_caps, risk
from remediation.sweep.runner import EVENT_KIND, Progress, Sweeper
from remediation.sweep.store import SweepStore

log = logging.getLogger("medic.sweep.pairs")

PAIR_CHECK = "sweep_pairs"
IB_FAULT, ALLREDUCE_FAULT = "ib.pair_bandwidth", "nccl.pair_allreduce"
# A pair sweep names a node only with three or more: with two, nobody is known-good.
MIN_PAIR_NODES = 3
COMPLETING_POLL = 0.5  # seconds between two looks at nodes our ended pair job leaves


@dataclass(frozen=True)
class PairSweepReport:
    dry_run: bool
    nodes: tuple[str, ...]
    rounds: int
    limit: int
    results: tuple[PairResult, ...]
    verdicts: PairVerdicts | None
    handed: Mapping[str, str] = field(default_factory=dict)
    left_out: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        v = self.verdicts
        return {
            "mode": "pairs",
            "dry_run": self.dry_run,
            "nodes": list(self.nodes),
            "rounds": self.rounds,
            "round_limit": self.limit,
            "results": [result_json(r) for r in self.results],
            "bad": {n: list(p) for n, p in (v.bad.items() if v else ())},
            "suspects": _names(v.suspects if v else ()),
            "flaky": _names(v.flaky if v else ()),
            "given_up": _names(v.given_up if v else ()),
            "handed": dict(self.handed),
            "left_out": dict(self.left_out),
            "seconds": round(self.seconds, 3),
            "message": self.message,
        }


def _names(nodes: Any) -> list[str]:
    return sorted(nodes, key=natural_key)


class PairSweeper:
    def __init__(
        self,
        config: MedicConfig,
        store: Store,
        slurm: PairSlurm,
        settings: SweepSettings,
        pairs: PairSettings,
        progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.slurm = slurm
        self.settings = settings
        self.pairs = pairs
        self.progress = progress or (lambda _p: None)
        self.sweeper = Sweeper(config, store, slurm, settings)  # candidates, the ladder

    def choose(self, nodes: Sequence[NodeInfo], partition: str | None, share: float) -> list[str]:
        """Idle nodes of the partition(s), riskiest first, within each partition's share."""
        wanted = {partition} if partition else set(self.settings.partitions)
        chosen = [n for n in nodes if not wanted or wanted & set(n.partitions)]
        now = SweepStore(self.store).now()
        scored = [
            (c, risk(c, now, self.settings.min_interval_days))
            for c in self.sweeper.candidates(chosen)
            if c.available
        ]
        scored.sort(key=lambda cr: (-cr[1].score, natural_key(cr[0].node)))
        minimum = max(self.settings.min_nodes, MIN_PAIR_NODES) if self.settings.min_nodes else 0
        caps = partition_caps(chosen, share, minimum)
        taken: dict[str, int] = {}
        out: list[str] = []
        for c, _ in scored:
            if all(taken.get(p, 0) < caps.get(p, 0) for p in c.partitions) and c.partitions:
                out.append(c.node)
                for p in c.partitions:
                    taken[p] = taken.get(p, 0) + 1
        if self.settings.max_nodes:
            out = out[: self.settings.max_nodes]
        return sorted(out, key=natural_key)

    def run(
        self, partition: str | None = None, share: float | None = None, dry_run: bool = False
    ) -> PairSweepReport:
        started = time.monotonic()
        share = self.settings.share if share is None else share
        if dry_run:
            names = self.choose(self.slurm.nodes(), partition, share)
            first = next_round(names, [])
            return PairSweepReport(
                True,
                tuple(names),
                0,
                round_limit(len(names)),
                (),
                None,
                seconds=time.monotonic() - started,
                message=f"would pair {len(names)} nodes; round 1: "
                + (", ".join(f"{a}+{b}" for a, b in first) or "none"),
            )
        with SweepStore(self.store).exclusive():
            self._clear_leftover()
            names = self.choose(self.slurm.nodes(), partition, share)
            if len(names) < 2:
                return PairSweepReport(
                    False, tuple(names), 0, 0, (), None, message="fewer than 2 idle nodes"
                )
            names = self._take(names)
            try:
                report = self._rounds(names, started)
            finally:
                with contextlib.suppress(SlurmError):
                    self.slurm.delete_reservation(PAIR_RESERVATION)
        return report

    # ---- steps -----------------------------------------------------------------------------

    def _clear_leftover(self) -> None:
        if self.slurm.reservation_exists(PAIR_RESERVATION):
            log.warning("a killed pair sweep left %s: given back", PAIR_RESERVATION)
            self.slurm.cancel_reservation_jobs(PAIR_RESERVATION)
            self.slurm.delete_reservation(PAIR_RESERVATION)

    def _minutes(self, nodes: int) -> int:
        per_round = self.pairs.timeout + self.settings.immediate
        return math.ceil((round_limit(nodes) * per_round + 600) / 60)

    def _user(self) -> str:
        import pwd

        return self.settings.reservation_user or pwd.getpwuid(os.getuid()).pw_name

    def _take(self, names: list[str]) -> list[str]:
        """One reservation over the nodes; one node busy since we looked makes Slurm refuse:
        look again and take those still idle (twice at most)."""
        for attempt in range(3):
            try:
                self.slurm.create_reservation(
                    PAIR_RESERVATION, ",".join(names), self._minutes(len(names)), self._user()
                )
                return names
            except SlurmError:
                if attempt == 2:
                    raise
                nodes = {n.name: n for n in self.slurm.nodes()}
                names = [n for n in names if n in nodes and not availability(nodes[n], False)]
                if len(names) < 2:
                    raise
        return names

    def _settled(self, names: Sequence[str]) -> dict[str, NodeInfo]:
        """Slurm's nodes once ours are past COMPLETING: a pair job that just ended leaves
        its nodes completing for a moment (the lab saw it between two rounds), which is not
        someone else's job. Waits at most `[sweep] immediate` seconds."""
        deadline = time.monotonic() + self.settings.immediate
        while True:
            nodes = {n.name: n for n in self.slurm.nodes()}
            completing = [n for n in names if n in nodes and "COMPLETING" in nodes[n].flags]
            if not completing or time.monotonic() >= deadline:
                return nodes
            time.sleep(COMPLETING_POLL)

    def _still_ours(self, names: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        nodes = self._settled(names)
        open_nodes = {e.node for e in self.sweeper.episodes.find(states=ep.OPEN_STATES)}
        keep, out = [], {}
        for name in names:
            info = nodes.get(name)
            why = "gone" if info is None else availability(info, name in open_nodes, ours=True)
            if why:
                out[name] = why
            else:
                keep.append(name)
        return keep, out

    def _rounds(self, names: list[str], started: float) -> PairSweepReport:
        classes = node_classes(self.store.inventories())
        limit = round_limit(len(names))
        results: list[PairResult] = []
        left_out: dict[str, str] = {}
        rounds = 0
        confirm, inconclusive = self.pairs.confirm, self.pairs.max_inconclusive
        while rounds < limit:
            available, gone = self._still_ours([n for n in names if n not in left_out])
            left_out.update(gone)
            planned = next_round(available, results, confirm, inconclusive)
            if not planned:
                break
            rounds += 1
            with concurrent.futures.ThreadPoolExecutor(len(planned), "pairs") as pool:
                futures = [
                    pool.submit(
                        run_pair,
                        self.slurm,
                        self.config,
                        PAIR_RESERVATION,
                        pair,
                        rounds,
                        self.settings,
                        self.pairs,
                        pair_floors(self.pairs, classes, *pair),
                    )
                    for pair in planned
                ]
                for future in futures:
                    result = future.result()
                    results.append(result)
                    self._record(result, limit)
        final = verdicts(names, results, confirm, inconclusive)
        handed = {
            node: self._hand(node, partners, results, left_out)
            for node, partners in sorted(final.bad.items(), key=lambda kv: natural_key(kv[0]))
        }
        message = _summary(final, rounds)
        log.info("pair sweep: %s", message)
        return PairSweepReport(
            False,
            tuple(names),
            rounds,
            limit,
            tuple(results),
            final,
            handed,
            left_out,
            time.monotonic() - started,
            message,
        )

    def _record(self, r: PairResult, limit: int) -> None:
        now = SweepStore(self.store).now()
        severity = {PASS: Severity.INFO, FAIL: Severity.WARN}.get(r.outcome, Severity.WARN)
        for node in (r.a, r.b):
            self.store.add_event(
                node=node,
                at=now,
                kind=EVENT_KIND,
                severity=severity,
                source=f"sweep-pairs:round {r.round}",
                message=f"pair {r.a}+{r.b} {r.outcome}: {r.why}",
                evidence={"pair": [r.a, r.b], "round": r.round, "measured": dict(r.measured)},
            )
        self.progress(Progress(f"{r.a}+{r.b}", r.outcome, r.why, r.round, limit))

    def _hand(
        self,
        node: str,
        partners: Sequence[str],
        results: Sequence[PairResult],
        left_out: Mapping[str, str],
    ) -> str:
        """The named node to the ladder, while our reservation holds it and only if it runs
        no job (it cannot: the reservation is ours and the pair jobs are over; checked)."""
        if node in left_out:
            return f"not handed: {left_out[node]}"
        info = self._settled([node]).get(node)
        why = "gone" if info is None else availability(info, False, ours=True)
        if why:
            return f"not handed: {why}"
        failed = [
            r
            for r in results
            if r.outcome == FAIL and node in (r.a, r.b) and r.partner(node) in partners
        ]
        ib_short = any(FIGURE[IB] in r.why for r in failed)
        shown = "; ".join(f"with {r.partner(node)}: {r.why}" for r in failed)[:1500]
        finding = Finding(
            check=PAIR_CHECK,
            status=Status.CRITICAL,
            fault_class=IB_FAULT if ib_short else ALLREDUCE_FAULT,
            target="",
            message=f"failed pair tests with known-good {', '.join(partners)}: {shown}",
            recommendation=Recommendation.DRAIN,
        )
        _, what = self.sweeper.hand_to_ladder(node, [finding], None)
        return what


def _summary(v: PairVerdicts, rounds: int) -> str:
    parts = [f"{rounds} rounds"]
    if v.bad:
        parts.append("bad: " + ", ".join(_names(v.bad)))
    for label, nodes in (
        ("suspects", v.suspects),
        ("flaky", v.flaky),
        ("given up", v.given_up),
        ("untested", v.untested),
    ):
        if nodes:
            parts.append(f"{label}: {', '.join(_names(nodes))}")
    parts.append(f"{len(v.good)} good")
    return "; ".join(parts)
