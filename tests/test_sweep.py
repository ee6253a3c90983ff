"""Offline sweeps: the pure planning (risk order, share arithmetic, next batch, verdicts) and
`medic sweep run` on the lab (healthy nodes return, a latent fault only the deep tier finds
enters the ladder, others' drains stay, the share holds, an interrupted sweep resumes)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from cli.lab.cluster import Lab, pid_alive
from medic_core import proc
from medic_core.status import Status
from medic_core.store import open_store
from remediation import episodes as ep
from remediation.policy import Rung
from remediation.sweep import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    PROBING,
    RETURNED,
    Candidate,
    SweepStore,
    gres_request,
    judge,
    next_batch,
    rank,
    share_cap,
)
from tests.conftest import poll
from tests.lab_views import idle_and_clear
from tests.pg import PostgresServer, pg_server  # noqa: F401  (pytest fixture)

NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)


def _days_ago(days: float) -> dt.datetime:
    return NOW - dt.timedelta(days=days)


# ---- pure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "share", "minimum", "cap"),
    [
        (5, 0.05, 1, 1),  # 0.25 rounds down to 0: the minimum makes it one node
        (19, 0.05, 1, 1),
        (20, 0.05, 1, 1),
        (40, 0.05, 1, 2),
        (1000, 0.05, 1, 50),
        (5, 0.05, 0, 0),  # min_nodes = 0: small partitions are never swept
        (3, 1.0, 1, 3),
        (2, 0.05, 5, 2),  # never more than the partition has
    ],
)
def test_share_cap_rounds_down_with_a_floor(
    nodes: int, share: float, minimum: int, cap: int
) -> None:
    assert share_cap(nodes, share, minimum) == cap


def test_next_batch_fits_every_partition_of_a_node() -> None:
    partitions = {"a1": ("a",), "a2": ("a",), "ab": ("a", "b"), "b1": ("b",), "b2": ("b",)}
    caps = {"a": 2, "b": 1}
    assert next_batch(["ab", "a1", "a2", "b1"], partitions, {}, caps) == ["ab", "a1"]
    assert next_batch(["b1", "b2", "a1"], partitions, {"b": 1}, caps) == ["a1"]
    assert next_batch(["a1"], partitions, {"a": 2}, caps) == []
    assert next_batch(["gone"], partitions, {}, caps) == []


def test_rank_weighs_staleness_trend_and_lemon_history() -> None:
    candidates = [
        Candidate("n1", ("p",), True, last_deep=_days_ago(8)),
        Candidate("n2", ("p",), True, last_deep=_days_ago(30)),
        Candidate("n3", ("p",), True, last_deep=None),
        Candidate("n4", ("p",), True, last_deep=_days_ago(8), episodes_recent=2),
        Candidate(
            "n5",
            ("p",),
            True,
            last_deep=_days_ago(8),
            correctable=5000,
            correctable_before=100,
            correctable_since=_days_ago(8),
        ),
        Candidate("n6", ("p",), True, last_deep=_days_ago(1)),  # checked recently: not due
        Candidate("n7", ("p",), False, why_not="drained"),  # not available
    ]
    ranked = [c.node for c, _ in rank(candidates, NOW, min_interval_days=7)]
    # scores: n2 42.9 (30 days), n5 39.3 (errors +612/day), n4 31.4 (2 episodes), n3 30, n1 11.4
    assert ranked == ["n2", "n5", "n4", "n3", "n1"]
    risks = {c.node: r for c, r in rank(candidates, NOW, 7)}
    assert "correctable ECC errors +4900" in "; ".join(risks["n5"].reasons)
    assert risks["n3"].reasons == ("never deep-checked",)


def test_rank_breaks_ties_by_name_naturally() -> None:
    candidates = [Candidate(f"n{i}", ("p",), True) for i in (10, 2, 1)]
    assert [c.node for c, _ in rank(candidates, NOW, 7)] == ["n1", "n2", "n10"]


def _report(*results: dict[str, str]) -> str:
    return "srun noise\n" + json.dumps({"source": "inline", "results": list(results)}) + "\n"


def test_judge() -> None:
    ok = {"check": "deep_dcgm", "status": "OK", "message": "fine"}
    na = {"check": "deep_ib", "status": "NOT_APPLICABLE", "message": "no ib_write_bw"}
    bad = {
        "check": "deep_dcgm",
        "status": "CRITICAL",
        "fault_class": "gpu.dcgm.diag",
        "target": "2",
        "message": "GPU 2: memory",
    }
    assert judge(0, _report(ok, na), False, "", 60).outcome == PASS
    failed = judge(226, _report(ok, bad), False, "", 60)
    assert failed.outcome == FAIL
    assert [f.fault_class for f in failed.findings] == ["gpu.dcgm.diag"]
    assert failed.findings[0].status is Status.CRITICAL
    assert judge(0, _report(na), False, "", 60).outcome == INCONCLUSIVE
    assert judge(1, "srun: error: Unable to allocate", False, "exit 1", 60).outcome == INCONCLUSIVE
    timed_out = judge(None, "", True, "timed out", 60)
    assert timed_out.outcome == FAIL
    assert timed_out.findings[0].fault_class == "sweep.deep_timeout"


@pytest.mark.parametrize(
    ("gres", "wanted"),
    [("gpu:8", "gpu:8"), ("gpu:h100:8(S:0-1)", "gpu:8"), ("gpu:a:4,gpu:b:2", "gpu:6"), ("", None)],
)
def test_gres_request(gres: str, wanted: str | None) -> None:
    assert gres_request(gres) == wanted


# ---- on the lab ---------------------------------------------------------------------------


def _medic(lab: Lab) -> str:
    # On 24.11/26.05 the lab's venv is its Debian root's: the admin's sweep runs on the host.
    return str(
        (lab.venv_bin if lab.debian_root() is None else Path(sys.executable).parent) / "medic"
    )


def _sweep(lab: Lab, *args: str, timeout: float = 300) -> proc.CommandResult:
    return proc.run([_medic(lab), "sweep", *args], timeout=timeout, env=lab.process_env())


def _reservations(lab: Lab) -> str:
    return lab.slurm(["scontrol", "show", "reservation"], check=False).stdout.strip()


def _node(lab: Lab, name: str) -> dict[str, object]:
    return next(n for n in lab.sinfo_nodes() if n["name"] == name)


class _ShareWatch:
    """Polls Slurm during a sweep: the most nodes ever reserved (out of scheduling) at once."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = self.lab.slurm(["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout
            self.most = max(self.most, sum(1 for line in out.splitlines() if "resv" in line))
            self.samples += 1
            self._stop.wait(0.05)

    def __enter__(self) -> _ShareWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _assert_share_held(rows: list[object], cap: int) -> None:
    """From the recorded steps: never more than `cap` nodes taken and not yet given back."""
    spans = [(r.taken_at, r.returned_at) for r in rows if r.taken_at]  # type: ignore[attr-defined]
    for start, _ in spans:
        overlapping = [s for s, e in spans if s <= start and (e is None or e > start)]
        assert len(overlapping) <= cap, (start, spans)


def test_a_sweep_returns_healthy_nodes_and_hands_a_latent_fault_to_the_ladder(lab: Lab) -> None:
    lab.inject("n3", 2, ["dcgm_diag=fail"])  # NVML shows nothing: only dcgmi diag finds it
    admin = "admin: fan swap"
    lab.slurm(["scontrol", "update", "nodename=n5", "state=drain", f"reason={admin}"])

    with _ShareWatch(lab) as watch:
        result = _sweep(lab, "run", "--json")
    assert result.ok, result.tail()
    report = json.loads(result.stdout)
    by_node = {n["node"]: n for n in report["nodes"]}
    assert report["caps"] == {"gpu": 1}  # 5 % of 5 nodes rounds to the one-node minimum
    assert sorted(by_node) == ["n1", "n2", "n3", "n4"]  # n5 is an admin's: never planned
    for name in ("n1", "n2", "n4"):
        assert (by_node[name]["state"], by_node[name]["status"]) == (RETURNED, PASS)
    assert (by_node["n3"]["state"], by_node["n3"]["status"]) == ("handed", FAIL)

    nodes = {n["name"]: n for n in lab.sinfo_nodes()}
    for name in ("n1", "n2", "n4"):
        assert idle_and_clear(nodes[name]), nodes[name]
    assert "DRAIN" in nodes["n3"]["state_flags"]
    assert str(nodes["n3"]["reason"]).startswith("medic: gpu.dcgm.diag gpu2 ")
    assert "DRAIN" in nodes["n5"]["state_flags"] and nodes["n5"]["reason"] == admin
    assert _reservations(lab) == "No reservations in the system"

    with open_store(f"sqlite:///{lab.layout.store_db}") as store:
        episode = ep.EpisodeStore(store).open_for("n3")
        assert episode is not None and by_node["n3"]["episode_id"] == episode.id
        assert (episode.state, episode.rung) == (ep.WAITING_IDLE, int(Rung.REBOOT))
        assert (episode.fault_class, episode.target) == ("gpu.dcgm.diag", "2")
        assert ep.EpisodeStore(store).find(node="n5") == []
        rows = SweepStore(store).nodes(report["sweep"])
        events = store.events("n3", kind="sweep")
    _assert_share_held(rows, 1)
    assert watch.samples > 5 and watch.most <= 1
    assert events and events[0].fault_class == "gpu.dcgm.diag"

    # The next sweep finds nothing due: every node was deep-checked just now.
    again = json.loads(_sweep(lab, "run", "--json").stdout)
    assert again["nodes"] == []


def test_an_interrupted_sweep_resumes_and_gives_back_exactly_its_nodes(
    lab: Lab, tmp_path: Path
) -> None:
    admin = "admin: bios update"
    lab.slurm(["scontrol", "update", "nodename=n2", "state=drain", f"reason={admin}"])
    url = f"sqlite:///{lab.layout.store_db}"
    pid = proc.spawn(
        [_medic(lab), "sweep", "run"], log_path=tmp_path / "first.log", env=lab.process_env()
    )
    try:
        poll("the first sweep to start", lambda: lab.layout.store_db.exists(), 30)
        with open_store(url) as store:
            rows = SweepStore(store)
            poll("the first sweep to plan", lambda: rows.active() is not None, 30)
            busy = _sweep(lab, "run")
            assert busy.returncode == 75, busy.tail()  # two sweeps never run at once
            assert "another sweep is running" in busy.stderr

            def probing() -> bool:
                active = rows.active()
                return active is not None and any(
                    n.state == PROBING and n.position >= 1 for n in rows.nodes(active.id)
                )

            poll("a node's deep tier to be running", probing, 60)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            active = rows.active()
            assert active is not None
            held = [n.node for n in rows.nodes(active.id) if n.state == PROBING]
            assert len(held) == 1
            assert held[0] in _reservations(lab)  # still out of scheduling, ours
            status = json.loads(_sweep(lab, "status", "--json").stdout)
            assert status["state"] == "running" and status["sweep"] == active.id

            result = _sweep(lab, "run", "--json")
            assert result.ok, result.tail()
            report = json.loads(result.stdout)
            assert report["resumed"] is True and report["sweep"] == active.id
            by_node = {n["node"]: n for n in report["nodes"]}
            assert sorted(by_node) == ["n1", "n3", "n4", "n5"]
            assert all(n["state"] == RETURNED for n in by_node.values()), by_node
            _assert_share_held(rows.nodes(active.id), 1)
    finally:
        if proc.run(["kill", "-0", str(pid)], timeout=5).ok:
            os.kill(pid, signal.SIGKILL)
    assert _reservations(lab) == "No reservations in the system"
    nodes = {n["name"]: n for n in lab.sinfo_nodes()}
    for name in ("n1", "n3", "n4", "n5"):
        assert idle_and_clear(nodes[name]), nodes[name]
    assert nodes["n2"]["reason"] == admin and "DRAIN" in nodes["n2"]["state_flags"]
    jobs = [j for j in lab.active_jobs() if str(j.get("name", "")).startswith("medic-sweep-")]
    assert jobs == []  # the orphaned probe was cancelled, not left running


def test_a_sweep_on_a_postgresql_store(
    lab: Lab,
    tmp_path: Path,
    pg_server: PostgresServer,  # noqa: F811
) -> None:
    """The fleet setting: the sweep's state, its lock (an advisory lock) and the ladder's
    episode in PostgreSQL."""
    url = pg_server.create_database("sweeps")
    config = tmp_path / "medic.toml"
    sqlite = f'url = "sqlite:///{lab.layout.store_db}"'
    text = lab.layout.medic_conf.read_text()
    assert sqlite in text
    config.write_text(text.replace(sqlite, f'url = "{url}"'))
    env = {**lab.process_env(), "MEDIC_CONFIG": str(config)}
    lab.inject("n4", 5, ["dcgm_diag=fail"])
    log = tmp_path / "sweep.log"
    pid = proc.spawn([_medic(lab), "sweep", "run", "--json"], log_path=log, env=env)
    try:
        with open_store(url) as store:
            rows = SweepStore(store)
            poll("the sweep to plan", lambda: rows.active() is not None, 60)
            busy = proc.run([_medic(lab), "sweep", "run"], timeout=60, env=env)
            assert busy.returncode == 75, busy.tail()  # the advisory lock is held
            poll("the sweep to finish", lambda: not pid_alive(pid), 240)
            report = json.loads(log.read_text()[log.read_text().index("{") :])
            by_node = {n["node"]: (n["state"], n["status"]) for n in report["nodes"]}
            assert by_node.pop("n4") == ("handed", FAIL)
            assert set(by_node.values()) == {(RETURNED, PASS)} and len(by_node) == 4
            _assert_share_held(rows.nodes(report["sweep"]), 1)
            episode = ep.EpisodeStore(store).open_for("n4")
            assert episode is not None and episode.fault_class == "gpu.dcgm.diag"
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert "DRAIN" in _node(lab, "n4")["state_flags"]
    assert _reservations(lab) == "No reservations in the system"
