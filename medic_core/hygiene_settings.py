"""The `[hygiene]` table: post-job hygiene in the epilog (slurm_hooks/hygiene.py,
docs/operator-guide.md "Post-job hygiene")."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from medic_core.config import ConfigError, MedicConfig
from medic_core.typed_config import parse_table, setting

# What a scratch directory's template may name: the job's user, uid and id.
SCRATCH_FIELDS = ("{user}", "{uid}", "{job}")


@dataclass(frozen=True, kw_only=True)
class HygieneSettings:
    enabled: bool = setting(
        False,
        doc="after each job, clean what it left on the node (processes, /dev/shm, scratch)"
        " and drain as user_problem what survives",
    )
    term_grace: float = setting(
        5.0, minimum=0.1, maximum=120, doc="seconds between SIGTERM and SIGKILL"
    )
    kill_wait: float = setting(
        2.0, minimum=0.1, maximum=60, doc="seconds a killed process gets to be gone"
    )
    budget: float = setting(
        20.0, minimum=1, maximum=600, doc="seconds the epilog's hygiene may take in all"
    )
    min_uid: int = setting(
        1000,
        minimum=0,
        maximum=2**31,
        doc="users below this uid: only the job's own processes are cleaned (never root's"
        " by user, whatever this says)",
    )
    scratch_dirs: tuple[str, ...] = setting(
        (),
        doc='directories emptied of the user\'s files, e.g. ["/local/scratch/{user}"]'
        " ({user}, {uid}, {job}); without {job}, only when the user has no other job there",
    )
    drain: bool = setting(True, doc="drain as user_problem a node where something survives")
    watch_every: float = setting(
        1.0, minimum=0.1, maximum=60, doc="seconds between looks at a user_problem node"
    )
    watch_for: float = setting(
        3600.0,
        minimum=0,
        maximum=7 * 86400,
        doc="seconds the epilog's watcher waits for it to be clean (the HealthCheckProgram"
        " goes on after)",
    )
    proc_dir: str = setting("", doc="procfs the processes are read from ('' : <host_root>/proc)")
    shm_dir: str = setting("", doc="POSIX shared memory ('' : <host_root>/dev/shm)")

    def problems(self) -> Iterator[tuple[str, str, str]]:
        for template in self.scratch_dirs:
            if not template.startswith("/"):
                yield "scratch_dirs", f"{template!r} is not absolute", "write a full path"
            bare = template
            for name in SCRATCH_FIELDS:
                bare = bare.replace(name, "")
            if "{" in bare or "}" in bare:
                yield (
                    "scratch_dirs",
                    f"{template!r} names an unknown field",
                    "use {user}, {uid}, {job}",
                )
            if ".." in Path(template).parts:
                yield "scratch_dirs", f"{template!r} holds '..'", "write the directory itself"
        for key in ("proc_dir", "shm_dir"):
            value = getattr(self, key)
            if value and not value.startswith("/"):
                yield key, f"{value!r} is not absolute", "write a full path, or '' for the default"

    @classmethod
    def from_config(cls, config: MedicConfig) -> HygieneSettings:
        """Parsed once per configuration object (the daemon asks at every job's end; a
        MedicConfig is immutable and a reload makes a new one)."""
        hit = _last.get("one")  # one tuple, swapped whole: safe across the daemon's threads
        if hit is not None and hit[0] is config:
            return hit[1]
        parsed = parse_table(cls, config.table("hygiene"), prefix="hygiene", source=config.source)
        _last["one"] = (config, parsed)
        return parsed

    def proc_root(self, config: MedicConfig) -> Path:
        return Path(self.proc_dir) if self.proc_dir else config.paths.proc

    def shm_root(self, config: MedicConfig) -> Path:
        return Path(self.shm_dir) if self.shm_dir else config.paths.dev / "shm"


_last: dict[str, tuple[MedicConfig, HygieneSettings]] = {}


def hygiene_on(config: MedicConfig) -> bool:
    """[hygiene] enabled, for the daemon's reply to the epilog's job_end; a table that does
    not parse is off (`medic config check` names its problem)."""
    try:
        return HygieneSettings.from_config(config).enabled
    except ConfigError:
        return False
