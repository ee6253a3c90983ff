"""Evidence bundles (remediation/evidence.py): the parts, a part that hangs or fails, the
size cap, pruning, a planted symlink, the checksum, the ticket and the ladder's call."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import stat
import tarfile
import threading
import time
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from medic_core.config import ConfigError, load_config
from medic_core.settings import EvidenceSettings, RemediationSettings
from medic_core.status import Status
from medic_core.store import Store, open_store
from medic_core.store.models import RmaOutboxRow
from medic_core.vocabulary import Finding, Recommendation
from remediation import episodes as ep
from remediation import tickets
from remediation.evidence import (
    Bundle,
    EvidenceCollector,
    EvidenceError,
    EvidenceRequest,
    EvidenceSources,
    bundle_name,
    collect,
    hca_counters,
    prune,
    sha256_of,
    verify,
)
from tests.test_ladder_unit import XID_95, World, template_db, world  # noqa: F401

LINK = Finding("ib_port", Status.CRITICAL, "ib.port.down", "mlx5_0/1", "down",
               Recommendation.RECHECK)  # fmt: skip
AT = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
REQUEST = EvidenceRequest(
    node="gpu01",
    episode_id=7,
    fault_class="gpu.xid.95",
    target="3",
    occasion="rma",
    findings={"findings": [{"check": "gpu_xid", "fault_class": "gpu.xid.95", "target": "3"}]},
    ticket_id=4,
    fault_at=AT,
)


def fixed() -> dt.datetime:
    return AT


def settings(**changes: Any) -> EvidenceSettings:
    base: dict[str, Any] = {"bug_report": (), "part_timeout": 5.0, "bug_report_timeout": 10.0}
    return EvidenceSettings(**{**base, **changes})


def sysfs(root: Path) -> Path:
    port = root / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters").mkdir(parents=True, exist_ok=True)
    (port / "hw_counters").mkdir(exist_ok=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "counters/symbol_error").write_text("12\n")
    (port / "hw_counters/link_downed").write_text("3\n")
    return root / "sys"


def sources(root: Path, **changes: Any) -> EvidenceSources:
    values: dict[str, Any] = {
        "sys_root": sysfs(root),
        "kernel_log": lambda at: f"[{at}] NVRM: Xid (PCI:0000:47:00): 95\n",
        "nvml": lambda gpu: {str(gpu): {"ecc": {"dbe_volatile": 1}}},
    }
    return EvidenceSources(**{**values, **changes})


def members(bundle: Bundle) -> dict[str, bytes]:
    with tarfile.open(bundle.path, "r:gz") as tar:
        found = {}
        for m in tar.getmembers():
            stream = tar.extractfile(m)
            assert stream is not None
            found[m.name] = stream.read()
        return found


def manifest(bundle: Bundle) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(members(bundle)["manifest.json"])
    return parsed


def parts(bundle: Bundle) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in manifest(bundle)["parts"]}


def fake_bug_report(tmp_path: Path, body: str) -> Path:
    """An executable standing in for nvidia-bug-report.sh, which writes <output-file>.gz."""
    script = tmp_path / "bin" / "nvidia-bug-report.sh"
    script.parent.mkdir(exist_ok=True)
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return script


def test_a_bundle_holds_every_part_and_its_checksum_verifies(tmp_path: Path) -> None:
    script = fake_bug_report(tmp_path, 'test "$1" = --output-file && echo report > "$2.gz"\n')
    state = tmp_path / "state"
    state.mkdir()
    started = time.monotonic()
    bundle = collect(REQUEST, sources(tmp_path), settings(bug_report=(str(script),)), state,
                     now=fixed)  # fmt: skip
    assert time.monotonic() - started < 10
    got = members(bundle)
    assert sorted(got) == ["findings.json", "hca.json", "kernel.log", "manifest.json",
                           "nvidia-bug-report.log.gz", "nvml.json"]  # fmt: skip
    assert json.loads(got["findings.json"]) == dict(REQUEST.findings)
    assert b"Xid" in got["kernel.log"] and b"2026-11-28 12:00:00" in got["kernel.log"]
    assert json.loads(got["nvml.json"]) == {"3": {"ecc": {"dbe_volatile": 1}}}  # GPU 3 asked
    port = json.loads(got["hca.json"])["mlx5_0"]["1"]
    assert port["state"] == "4: ACTIVE" and port["counters/symbol_error"] == "12"
    assert port["hw_counters/link_downed"] == "3"
    assert got["nvidia-bug-report.log.gz"] == b"report\n"
    assert all(p["ok"] for p in parts(bundle).values())
    assert manifest(bundle)["ticket"] == 4 and manifest(bundle)["episode"] == 7
    # the checksum: recorded, beside the bundle in sha256sum format, and it verifies
    assert bundle.sha256 == sha256_of(bundle.path) and verify(bundle.path, bundle.sha256)
    side = bundle.path.with_name(bundle.path.name + ".sha256").read_text()
    assert side == f"{bundle.sha256}  {bundle.path.name}\n"
    assert bundle.path.parent == state / "evidence"
    assert stat.S_IMODE(os.stat(state / "evidence").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(bundle.path).st_mode) == 0o600
    assert bundle.as_dict()["path"] == str(bundle.path)
    # a changed byte no longer verifies; a missing file neither
    data = bytearray(bundle.path.read_bytes())
    data[-1] ^= 1
    bundle.path.write_bytes(bytes(data))
    assert not verify(bundle.path, bundle.sha256)
    assert not verify(tmp_path / "gone.tar.gz", bundle.sha256)
    assert [p.name for p in (state / "evidence").iterdir() if p.name.startswith(".")] == []


def test_a_hanging_part_is_cut_at_its_deadline_and_the_rest_is_written(tmp_path: Path) -> None:
    release = threading.Event()

    def hangs(gpu: int | None) -> Mapping[str, Any]:
        release.wait(60)  # a GPU wedged inside NVML
        return {}

    script = fake_bug_report(tmp_path, "exec sleep 60\n")
    started = time.monotonic()
    try:
        bundle = collect(REQUEST, sources(tmp_path, nvml=hangs),
                         settings(part_timeout=1.0, bug_report=(str(script),),
                                  bug_report_timeout=1.0), tmp_path, now=fixed)  # fmt: skip
    finally:
        release.set()
    took = time.monotonic() - started
    assert took < 8, took
    got = parts(bundle)
    assert got["nvml.json"] == {"name": "nvml.json", "ok": False, "seconds": got["nvml.json"][
        "seconds"], "bytes": 0, "note": "timed out after 1s"}  # fmt: skip
    assert got["nvidia-bug-report.log.gz"]["note"] == "timed out after 1s"
    assert got["kernel.log"]["ok"] and got["hca.json"]["ok"] and got["findings.json"]["ok"]
    assert "nvml.json" not in members(bundle)


def test_a_failing_part_is_noted_and_the_bundle_is_still_written(tmp_path: Path) -> None:
    def broken(at: dt.datetime | None) -> str:
        raise PermissionError("/dev/kmsg: permission denied")

    script = fake_bug_report(tmp_path, "echo 'nvidia driver not loaded' >&2; exit 3\n")
    bundle = collect(REQUEST, sources(tmp_path, kernel_log=broken, nvml=None),
                     settings(bug_report=(str(script),)), tmp_path, now=fixed)  # fmt: skip
    got = parts(bundle)
    assert got["kernel.log"]["note"] == "PermissionError: /dev/kmsg: permission denied"
    assert got["nvml.json"]["note"] == "no NVML on this node"
    assert got["nvidia-bug-report.log.gz"]["note"] == "exit 3: nvidia driver not loaded"
    assert sorted(members(bundle)) == ["findings.json", "hca.json", "manifest.json"]
    assert verify(bundle.path, bundle.sha256)


@pytest.mark.parametrize(
    ("program", "note"),
    [
        ("no-such-nvidia-bug-report.sh", "no-such-nvidia-bug-report.sh: not installed"),
        ("/nonexistent/nvidia-bug-report.sh", "/nonexistent/nvidia-bug-report.sh: not installed"),
    ],
)
def test_no_bug_report_installed_is_noted(tmp_path: Path, program: str, note: str) -> None:
    bundle = collect(REQUEST, sources(tmp_path), settings(bug_report=(program,)), tmp_path,
                     now=fixed)  # fmt: skip
    assert parts(bundle)["nvidia-bug-report.log.gz"]["note"] == note


def test_a_report_that_writes_nothing_or_a_symlink_is_left_out(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root's secret")
    nothing = fake_bug_report(tmp_path, "exit 0\n")
    bundle = collect(REQUEST, sources(tmp_path), settings(bug_report=(str(nothing),)),
                     tmp_path, now=fixed)  # fmt: skip
    assert parts(bundle)["nvidia-bug-report.log.gz"]["note"] == "the command wrote no report"
    linker = fake_bug_report(tmp_path, f'ln -s {secret} "$2.gz"\n')
    bundle = collect(REQUEST, sources(tmp_path), settings(bug_report=(str(linker),)),
                     tmp_path, now=lambda: AT + dt.timedelta(seconds=1))  # fmt: skip
    assert parts(bundle)["nvidia-bug-report.log.gz"]["note"] == "the command wrote no report"
    assert b"root's secret" not in b"".join(members(bundle).values())


def test_the_size_cap_leaves_out_a_part_that_does_not_fit(tmp_path: Path) -> None:
    huge = "x" * 5000
    script = fake_bug_report(tmp_path, 'head -c 3000 /dev/zero > "$2.gz"\n')
    bundle = collect(REQUEST, sources(tmp_path, kernel_log=lambda at: huge),
                     settings(max_bytes=2500, bug_report=(str(script),)), tmp_path,
                     now=fixed)  # fmt: skip
    got = parts(bundle)
    assert got["kernel.log"]["ok"] is False and "5000 bytes: over the" in got["kernel.log"]["note"]
    assert "larger than the" in got["nvidia-bug-report.log.gz"]["note"]
    kept = members(bundle)
    assert "kernel.log" not in kept and "nvidia-bug-report.log.gz" not in kept
    assert sum(len(v) for k, v in kept.items() if k != "manifest.json") <= 2500


def test_a_symlink_planted_at_the_bundle_path_is_not_followed(tmp_path: Path) -> None:
    directory = tmp_path / "evidence"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "etc-shadow"
    victim.write_text("untouched")
    planted = directory / (bundle_name(REQUEST, AT) + ".tar.gz")
    planted.symlink_to(victim)
    (directory / (bundle_name(REQUEST, AT) + "-1.tar.gz.sha256")).symlink_to(victim)
    bundle = collect(REQUEST, sources(tmp_path), settings(), tmp_path, now=fixed)
    assert victim.read_text() == "untouched"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert bundle.path.name == bundle_name(REQUEST, AT) + "-2.tar.gz"  # -1's checksum was taken
    assert not bundle.path.is_symlink() and verify(bundle.path, bundle.sha256)


def test_an_unsafe_evidence_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "evidence").symlink_to(elsewhere)
    with pytest.raises(EvidenceError, match="not a plain directory"):
        collect(REQUEST, sources(tmp_path), settings(), tmp_path, now=fixed)
    assert list(elsewhere.iterdir()) == []
    (tmp_path / "evidence").unlink()
    (tmp_path / "evidence").write_text("a file")
    with pytest.raises(EvidenceError, match="remove it and Medic makes it"):
        collect(REQUEST, sources(tmp_path), settings(), tmp_path, now=fixed)


def test_a_loose_directory_mode_is_tightened(tmp_path: Path) -> None:
    (tmp_path / "evidence").mkdir(mode=0o755)
    os.chmod(tmp_path / "evidence", 0o777)
    collect(REQUEST, sources(tmp_path), settings(), tmp_path, now=fixed)
    assert stat.S_IMODE(os.stat(tmp_path / "evidence").st_mode) == 0o700


def test_pruning_by_age_and_count(tmp_path: Path) -> None:
    directory = tmp_path / "evidence"
    directory.mkdir(mode=0o700)
    now = AT.timestamp()

    def old(name: str, days: float) -> Path:
        path = directory / name
        path.write_text(name)
        os.utime(path, (now - days * 86400, now - days * 86400))
        return path

    ancient = old("a.tar.gz", 40)
    ancient_sum = old("a.tar.gz.sha256", 40)
    recent = [old(f"r{n}.tar.gz", 10 - n) for n in range(4)]  # r0 the oldest
    stale_partial = old(".b.1.2.partial", 2)
    fresh_partial = old(".c.1.2.partial", 0.01)  # a collection under way
    other = old("notes.txt", 90)
    target = tmp_path / "target.tar.gz"
    target.write_text("not ours")
    link = directory / "link.tar.gz"
    link.symlink_to(target)
    os.utime(link, (now - 90 * 86400,) * 2, follow_symlinks=False)
    removed = prune(directory, settings(keep_days=30, keep_bundles=3), AT, keep=recent[0])
    assert sorted(p.name for p in removed) == ["a.tar.gz", "r1.tar.gz"]
    assert not ancient.exists() and not ancient_sum.exists()
    assert recent[0].exists()  # kept: the bundle just written, however old its clock says
    assert not recent[1].exists() and recent[2].exists() and recent[3].exists()
    assert not stale_partial.exists() and fresh_partial.exists() and other.exists()
    assert link.is_symlink() and target.read_text() == "not ours"


def test_hca_counters_of_a_node_without_infiniband(tmp_path: Path) -> None:
    assert hca_counters(tmp_path / "sys") == {}


def test_the_collector_runs_in_the_background_and_never_raises(tmp_path: Path) -> None:
    told: list[tuple[Bundle | None, str]] = []

    def done(request: EvidenceRequest, bundle: Bundle | None, why: str) -> None:
        told.append((bundle, why))

    collector = EvidenceCollector(settings, lambda: sources(tmp_path), lambda: tmp_path, done)
    thread = collector.start(REQUEST)
    assert thread is not None
    thread.join(30)
    [(bundle, why)] = told
    assert bundle is not None and why == "" and verify(bundle.path, bundle.sha256)
    (tmp_path / "evidence").rename(tmp_path / "moved")
    (tmp_path / "evidence").symlink_to(tmp_path / "moved")
    thread = collector.start(REQUEST)
    assert thread is not None
    thread.join(30)
    assert told[1][0] is None and "not a plain directory" in told[1][1]
    off = EvidenceCollector(lambda: settings(enabled=False), lambda: sources(tmp_path),
                            lambda: tmp_path, done)  # fmt: skip
    assert off.start(REQUEST) is None and len(told) == 2

    def unreadable() -> EvidenceSettings:
        raise ConfigError(tmp_path / "medic.toml", "remediation.evidence.x", "bad", "fix it")

    assert EvidenceCollector(unreadable, lambda: sources(tmp_path), lambda: tmp_path,
                             done).start(REQUEST) is None  # fmt: skip


def test_settings_are_read_and_checked(tmp_path: Path) -> None:
    defaults = EvidenceSettings()
    assert (
        defaults.enabled
        and defaults.keep_days == 30
        and defaults.bug_report == ("nvidia-bug-report.sh",)
    )
    conf = tmp_path / "medic.toml"
    conf.write_text(
        "[remediation]\ndry_run = true\n[remediation.evidence]\nenabled = false\n"
        'bug_report = ["/opt/nvidia/nvidia-bug-report.sh", "--safe-mode"]\nkeep_days = 7\n'
    )
    config = load_config(conf)
    got = EvidenceSettings.from_config(config)
    assert not got.enabled and got.keep_days == 7
    assert got.bug_report == ("/opt/nvidia/nvidia-bug-report.sh", "--safe-mode")
    assert RemediationSettings.from_config(config).dry_run  # the sub-table is not its key
    for bad, key in [("keep_days = 0", "keep_days"), ("max_bytes = 10", "max_bytes"),
                     ('bug_report = [""]', "bug_report"), ("colour = 1", "colour"),
                     ("enabled = 'yes'", "enabled")]:  # fmt: skip
        conf.write_text(f"[remediation.evidence]\n{bad}\n")
        with pytest.raises(ConfigError, match=f"remediation.evidence.{key}"):
            EvidenceSettings.from_config(load_config(conf))
    conf.write_text('[remediation]\nevidence = "on"\n')
    with pytest.raises(ConfigError, match=r"write its keys under \[remediation.evidence\]"):
        EvidenceSettings.from_config(load_config(conf))


# --- the ticket and the ladder -----------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'db' / 'medic.db'}") as opened:
        yield opened


def test_the_ticket_and_its_webhook_payload_name_the_bundle(store: Store, tmp_path: Path) -> None:
    ticket = tickets.open_ticket(store, "gpu01", "gpu.xid.95", "GPU 3", [{"index": 3}],
                                 {"reason": "lemon"}, "medic-ladder")  # fmt: skip
    assert ticket.bundle == {} and ticket.as_dict()["bundle"] == {}
    bundle = collect(REQUEST, sources(tmp_path), settings(), tmp_path, now=fixed)
    after = tickets.attach_bundle(store, ticket.id, bundle.as_dict(), "medic-ladder")
    assert after.state is ticket.state and after.reason == "lemon"  # evidence kept
    assert after.bundle["path"] == str(bundle.path) and after.bundle["sha256"] == bundle.sha256
    again = tickets.get(store, ticket.id)
    assert again is not None and verify(Path(again.bundle["path"]), again.bundle["sha256"])
    with Session(store.engine) as session:
        rows = list(session.scalars(select(RmaOutboxRow).order_by(RmaOutboxRow.id)))
    assert [r.event for r in rows] == ["ticket.opened", "ticket.evidence"]
    payload = rows[1].payload
    assert payload["ticket"]["bundle"]["sha256"] == bundle.sha256
    assert payload["evidence"]["bundle"]["path"] == str(bundle.path)
    assert payload["transition"]["from"] == payload["transition"]["to"] == "open"
    audit = tickets.audit(store, ticket.id)
    assert audit[-1].note == f"evidence bundle {bundle.path} sha256 {bundle.sha256}"
    with pytest.raises(tickets.TicketError, match="RMA ticket 99 does not exist"):
        tickets.attach_bundle(store, 99, bundle.as_dict(), "medic-ladder")


def test_the_ladder_asks_for_a_bundle_on_rma(world: World) -> None:  # noqa: F811
    asked: list[tuple[str, int | None]] = []
    world.daemon("n2").evidence = lambda occasion, e: asked.append((occasion, e.ticket_id))
    for _ in range(2):  # a lemon: two earlier episodes of GPU 3 this week
        world.opened("n2", ep.RESOLVED, attempts={"1": 1})
        world.clock.advance(3600)
    world.fault("n2", XID_95)
    episode = world.tick("n2")
    assert episode is not None and episode.state == ep.RMA
    assert asked == [("rma", episode.ticket_id)] and episode.ticket_id is not None


def test_the_ladder_asks_for_a_bundle_when_a_human_is_needed(world: World) -> None:  # noqa: F811
    asked: list[str] = []
    world.configure(recheck_window=0.0)  # the link is re-checked once, then a human's
    world.daemon("n1").evidence = lambda occasion, e: asked.append(occasion)
    world.fault("n1", LINK)
    episode = world.run("n1")
    assert episode.state == ep.NEEDS_HUMAN and asked == ["needs_human"]


def test_no_bundle_in_a_dry_run(world: World) -> None:  # noqa: F811
    asked: list[str] = []
    world.configure(dry_run=True)
    world.daemon("n1").evidence = lambda occasion, e: asked.append(occasion)
    world.fault("n1", XID_95)
    episode = world.tick("n1")
    assert episode is not None and episode.state == ep.NEEDS_HUMAN and asked == []


# --- the daemon's sources (healthd/evidence_sources.py) -----------------------------------------


def daemon_stub(root: Path, client: object | None = None) -> Any:
    from healthd.hostfs import HostRoots

    return types.SimpleNamespace(
        ctx=types.SimpleNamespace(roots=HostRoots(root)),
        gpu=types.SimpleNamespace(client=client) if client is not None else None,
    )


def test_the_kernel_log_around_the_fault(tmp_path: Path) -> None:
    from healthd.evidence_sources import kernel_log_reader
    from healthd.kmsg import format_record

    uptime_us = int(time.monotonic() * 1e6)
    if uptime_us < 2000 * 10**6:
        pytest.skip("the host booted under 2000 s ago: no record is old enough to leave out")
    kmsg = tmp_path / "dev/kmsg"
    kmsg.parent.mkdir()
    kmsg.write_text(
        format_record(1, "long before: mlx5 firmware loaded", timestamp_us=uptime_us - 1800 * 10**6)
        + format_record(2, "NVRM: Xid (PCI:0000:47:00): 95", timestamp_us=uptime_us - 5 * 10**6)
        + format_record(3, "after: nvidia-smi reset", timestamp_us=uptime_us - 10**6)
    )
    read = kernel_log_reader(daemon_stub(tmp_path))
    text = read(dt.datetime.now(dt.UTC) - dt.timedelta(seconds=10))
    assert "NVRM: Xid" in text and "after: nvidia-smi reset" in text
    assert "long before" not in text and "2 lines from 600s before the fault" in text
    # No time near the fault (a fixture's log stamped from zero): the last lines, said so.
    kmsg.write_text("".join(format_record(n, f"line {n}") for n in range(1, 801)))
    text = read(dt.datetime.now(dt.UTC))
    assert "no line placed near the fault: the last 500 lines" in text
    assert "line 800" in text and "line 300\n" not in text


def test_the_nvml_snapshot_of_the_faulty_gpu_records_each_error(tmp_path: Path) -> None:
    from healthd.evidence_sources import nvml_reader

    @dataclasses.dataclass(frozen=True)
    class Rows:
        correctable: int
        pending: bool

    class Client:
        def __getattr__(self, name: str) -> Any:
            def fails(index: int, **_: Any) -> Any:
                raise RuntimeError(f"{name}: NVML_ERROR_GPU_IS_LOST")

            return fails

        def driver_version(self) -> str:
            return "550.54.15"

        def device_count(self) -> int:
            return 2

        def remapped_rows(self, index: int) -> Rows:
            return Rows(correctable=index, pending=True)

    snapshot = nvml_reader(daemon_stub(tmp_path, Client()))
    assert snapshot is not None
    one = snapshot(1)
    assert list(one) == ["driver_version", "1"] and one["driver_version"] == "550.54.15"
    assert one["1"]["remapped_rows"] == {"correctable": 1, "pending": True}
    assert one["1"]["ecc"] == {"error": "RuntimeError: ecc_counts: NVML_ERROR_GPU_IS_LOST"}
    assert list(snapshot(None)) == ["driver_version", "0", "1"]  # no GPU named: every GPU
    json.dumps(snapshot(None))  # it goes into the bundle as JSON
    assert nvml_reader(daemon_stub(tmp_path)) is None  # no GPU plumbing: no NVML part


def test_the_daemon_names_the_bundle_in_the_ticket_and_an_event(
    store: Store, tmp_path: Path
) -> None:
    from healthd.evidence_sources import attach_evidence

    conf = tmp_path / "medic.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path / "state"}"\n[remediation.evidence]\n'
                    "bug_report = []\n")  # fmt: skip
    (tmp_path / "state").mkdir()
    daemon = daemon_stub(tmp_path)
    daemon.config, daemon.store, daemon.node = load_config(conf), store, "gpu01"
    events: list[tuple[str, str]] = []
    ladder = types.SimpleNamespace(
        host=types.SimpleNamespace(
            event=lambda message, severity, **_: events.append((severity, message))
        ),
        evidence=None,
    )
    ticket = tickets.open_ticket(store, "gpu01", "gpu.remap.failure", "GPU 1", [{"index": 1}],
                                 {}, "medic-ladder")  # fmt: skip
    collector = attach_evidence(daemon, ladder)  # type: ignore[arg-type]
    episode = types.SimpleNamespace(id=3, fault_class="gpu.remap.failure", target="1",
                                    evidence={"findings": []}, ticket_id=ticket.id,
                                    opened_at=AT)  # fmt: skip
    ladder.evidence("rma", episode)
    [thread] = collector.threads
    thread.join(30)
    found = tickets.get(store, ticket.id)
    assert found is not None and found.bundle["path"].startswith(str(tmp_path / "state/evidence"))
    assert verify(Path(found.bundle["path"]), found.bundle["sha256"])
    assert found.bundle["parts"]["nvidia-bug-report.log.gz"] == "switched off: bug_report = []"
    assert found.bundle["parts"]["nvml.json"] == "no NVML on this node"
    [(severity, message)] = events
    assert severity == "INFO" and message.startswith("evidence bundle ")
    assert message.endswith(f"sha256 {found.bundle['sha256']} (rma)")
