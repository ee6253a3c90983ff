"""A node drained as `user_problem` given back once clean.

The node's hygiene record (slurm_hooks.hygiene_run.save_record) names what the job left
after SIGKILL. `look_again` kills what is still there again and removes the user's
/dev/shm files again; `resume_if_clean` then gives the node back through the decision core
(remediation.give_back: only Medic's recorded drain, no episode or RMA ticket owning the
node, nothing left) and deletes the record. The epilog starts `python -m
slurm_hooks.hygiene_watch`, which looks every `[hygiene] watch_every` seconds for up to
`watch_for`; the HealthCheckProgram looks at each of its runs.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from medic_core.config import ConfigError, MedicConfig, load_config
from medic_core.hygiene_settings import HygieneSettings
from slurm_hooks import hygiene as hy
from slurm_hooks.hygiene_run import read_entries, record_path

if TYPE_CHECKING:
    from medic_core.drain_book import DrainBook
    from medic_core.slurm import SlurmClient


@dataclass(frozen=True)
class Look:
    done: bool  # resumed, or nothing more for a watcher to do
    action: str  # "resumed", "kept", "gone"
    message: str


def read_record(config: MedicConfig) -> list[tuple[hy.JobOwner, hy.Leftovers]] | None:
    """Each job's leftovers as recorded; None when there is no readable record."""
    entries = read_entries(config)
    if not entries:
        return None
    try:
        return [
            (
                hy.JobOwner(**e["job"]),
                hy.Leftovers(
                    tuple(hy.ProcessLeft(**p) for p in e["left"]["processes"]),
                    tuple(str(n) for n in e["left"]["shm"]),
                    tuple(str(s) for s in e["left"]["scratch"]),
                ),
            )
            for e in entries
        ]
    except (KeyError, TypeError, ValueError):
        return None


def look_again(
    config: MedicConfig, settings: HygieneSettings, left: hy.Leftovers, uid: int
) -> hy.Leftovers:
    """What of `left` is still there, after one more SIGKILL and one more unlink."""
    import os

    proc_root = settings.proc_root(config)
    send = hy.pidfd_signaller(proc_root)
    still = []
    for p in left.processes:
        if hy.alive(proc_root, p):
            send(p, signal.SIGKILL)
            still.append(hy.as_now(proc_root, p))
    shm = hy.remove_shm(settings.shm_root(config), left.shm, uid)
    scratch = [s for s in left.scratch if os.path.lexists(s)]
    return hy.Leftovers(tuple(still), tuple(shm), tuple(scratch))


def resume_if_clean(config: MedicConfig, client: SlurmClient, book: DrainBook) -> Look:
    """One look at a user_problem node: given back when nothing is left."""
    from medic_core.drain_book import HOOK
    from medic_core.drain_reason import is_user_problem_reason
    from medic_core.slurm import SlurmError
    from remediation.give_back import give_back
    from remediation.user_problem import still_left
    from slurm_hooks.ownership import remediation_owns

    node = config.node_name
    record = read_record(config)
    settings = HygieneSettings.from_config(config)
    for job, left in record or ():  # first what is on the node (no Slurm, no store): cheap
        blocking = still_left(look_again(config, settings, left, job.uid).lines())
        if blocking:
            return Look(False, "kept", f"job {job.job_id}: {blocking[0].message}")
    info = client.node(node)
    if info is None or not (info.drained or info.down) or not is_user_problem_reason(info.reason):
        record_path(config).unlink(missing_ok=True)
        return Look(True, "gone", "no user_problem drain on the node any more")
    if record is None:
        return Look(True, "kept", "user_problem drain without a hygiene record: a human looks")
    owner = remediation_owns(config, node)
    if owner:
        return Look(False, "kept", owner)
    try:
        jobs = ", ".join(job.job_id for job, _ in record)
        done = give_back(client, book, node, actor=HOOK, note=f"job {jobs} left nothing now")
    except SlurmError as exc:
        return Look(False, "kept", f"resume failed: {exc}")
    if done.resumed:
        record_path(config).unlink(missing_ok=True)
        return Look(True, "resumed", f"user_problem of job {jobs} clean: {done.text}")
    return Look(False, "kept", done.why)


def watch(config: MedicConfig) -> Look:
    from medic_core.drain_book import node_book
    from medic_core.settings import HookSettings
    from remediation.actions import slurm_client

    settings = HygieneSettings.from_config(config)
    client = slurm_client(config, HookSettings.from_config(config), actor="hygiene")
    book = node_book(config)
    until = time.monotonic() + settings.watch_for
    while True:
        look = resume_if_clean(config, client, book)
        if look.done or time.monotonic() >= until:
            return look
        time.sleep(settings.watch_every)


def main() -> int:
    try:
        config = load_config()
        look = watch(config)
    except ConfigError as exc:
        print(f"medic-hygiene-watch: {exc}", file=sys.stderr)
        return 1
    print(f"medic-hygiene-watch: {config.node_name}: {look.action}: {look.message}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
