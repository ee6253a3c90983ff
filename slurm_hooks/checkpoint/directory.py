"""`CheckpointDir`: the checkpoints of one job, the API the job calls (write a step, commit a
directory, find the newest step to resume from, its history, prune, drain the node-local
tier); each is carried out by the module of its concern in this package."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal, Self

from slurm_hooks.checkpoint.commit import commit_directory, staging
from slurm_hooks.checkpoint.layout import (
    DIR_ENV,
    DURABLE,
    JOB_ENV,
    STALE_AFTER,
    Checkpoint,
    CheckpointError,
    step_dirs,
    step_name,
)
from slurm_hooks.checkpoint.ledger import (
    LedgerRecord,
    Resume,
    mark_resume,
    merged_history,
    read_ledger,
    read_resumes,
)
from slurm_hooks.checkpoint.node_local import LOCAL_ENV, LocalTier, own_dir, shared_base
from slurm_hooks.checkpoint.prune import Pruned, prune_report
from slurm_hooks.checkpoint.reading import load_step

_monotonic = time.monotonic  # bound here: tests replace the commit modules' `time` with a clock


class CheckpointDir:
    """The checkpoints of one job: `root/step-NNNNNNNNN/` plus a manifest in each."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        hash_files: bool = True,
        env: Mapping[str, str] | None = None,
        local: str | os.PathLike[str] | Literal[False] | None = None,
        local_cap: int | None = None,
        background_drain: bool = True,
    ) -> None:
        """`local`: the node-local tier's directory for this job (None: from LOCAL_ENV, off
        without it; False: off); `local_cap`: its cap in bytes (None: LOCAL_CAP_ENV, else
        half its file system); `background_drain` False: steps drain only in `drain()`."""
        self._env: Mapping[str, str] = os.environ if env is None else env
        if root is None:
            root = self._env.get(DIR_ENV) or None
        if root is None:
            raise CheckpointError(
                f"no checkpoint directory: pass one, or set {DIR_ENV} in the job's environment"
            )
        self.root = Path(root).absolute()
        if self.root.exists() and not self.root.is_dir():
            raise CheckpointError(
                f"{self.root}: not a directory; point {DIR_ENV} (or --dir) at a directory"
            )
        # Hashing costs a second read of every file; sizes alone still catch truncation.
        self.hash_files = hash_files
        self._tier = DURABLE  # the commit's fault points name it; a node-local tier's: LOCAL
        self._ledger = True  # a node-local tier's steps are in the durable ledger only
        self.local: LocalTier | None = None
        if local is None and self._env.get(LOCAL_ENV):
            job = self._env.get(JOB_ENV) or f"uid-{os.geteuid()}"
            if "/" in job or job in (".", ".."):
                raise CheckpointError(f"{JOB_ENV}={job!r}: not a job id; unset {LOCAL_ENV}")
            own_dir(local := shared_base(Path(self._env[LOCAL_ENV])) / f"job-{job}")
            # per durable directory: a rank moved to a node never takes another rank's steps
            local /= "d-" + hashlib.sha256(str(self.root).encode()).hexdigest()[:16]
        if local is not None and local is not False:
            self.local = LocalTier(self, Path(local), local_cap, background_drain)

    # ---- writing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        """Yield an empty directory to write step `step` into; commit it when the block ends
        without an exception, discard it otherwise. With a node-local tier the directory is
        there and the commit too; the step then drains to this directory in the background."""
        if self.local is not None:
            with self.local.writing(step) as tmp:
                yield tmp
            return
        with staging(self, step) as tmp:
            yield tmp

    def commit(self, src: Path, step: int, *, move: bool = False) -> Checkpoint:
        """Make the directory `src` checkpoint `step`, atomically: copied (or, with `move`,
        moved, which is a rename on the same filesystem) into a temporary directory first.

        A failed commit never loses `src`: everything is checked before the first file is
        touched (a symlink or a special file refuses the commit), and with `move` whatever
        was moved goes back to `src` when the commit fails later (a full disk, another
        writer); if even that fails, the error names the directory that holds the files."""
        commit_directory(self, src, step, move=move)
        found = self.load(self.root / step_name(step))
        if found is None:
            raise CheckpointError(
                f"{self.root / step_name(step)}: committed but unreadable; check the file system"
            )
        return found

    def drain(self, timeout: float | None = None) -> list[int]:
        """Wait (at most `timeout` seconds) until every step of the node-local tier is
        durable here: at the job's end, so its last step survives the node. Returns the
        node-local steps that are durable; [] without a node-local tier. CheckpointError,
        naming the steps, on a timeout or a step that cannot be drained."""
        return [] if self.local is None else self.local.drain(timeout)

    # ---- reading -----------------------------------------------------------------------

    def tier_dir(self, root: Path) -> Self:
        """A directory at `root` of this one's class, with its environment and no tier of
        its own: a node-local tier's own steps (node_local.LocalTier)."""
        return type(self)(root, env=self._env, local=False)

    def load(self, path: Path, *, verify_hashes: bool = False) -> Checkpoint | None:
        """The checkpoint at `path`, or None when it is incomplete or does not match its
        manifest. Sizes are always checked; hashes only with `verify_hashes`. Its manifest
        and files are opened as medic_core.user_files opens a user's files (root reads
        them for `medic report`): no symlink followed, no FIFO waited on, only regular files
        of the directory's owner, the manifest at most MANIFEST_LIMIT bytes."""
        return load_step(path, verify_hashes=verify_hashes)

    def checkpoints(self, *, verify_hashes: bool = False) -> list[Checkpoint]:
        """Complete checkpoints, oldest first."""
        found = []
        for path in step_dirs(self.root):
            checkpoint = self.load(path, verify_hashes=verify_hashes)
            if checkpoint is not None:
                found.append(checkpoint)
        return found

    def latest(self, *, verify_hashes: bool = False) -> Checkpoint | None:
        """The newest complete checkpoint, or None (a first run, or nothing usable yet).
        The first call of a restarted run marks when it resumed (see `resumes`).
        With a node-local tier: the newest step complete in either tier, the node-local copy
        when both have it (always verified with its hashes: a torn or altered copy there
        never wins); the result's `tier` says which, `read_s` how long finding it took."""
        began = _monotonic()
        found = None
        for path in reversed(step_dirs(self.root)):
            checkpoint = self.load(path, verify_hashes=verify_hashes)
            if checkpoint is not None:
                found = checkpoint
                break
        if self.local is not None:
            local = self.local.newest(at_least=None if found is None else found.step)
            found = local if local is not None else found
        if found is not None:
            found = replace(found, read_s=_monotonic() - began)
        mark_resume(self.root, self._env, found)
        return found

    def resume_step(self) -> int | None:
        """The step of the newest complete checkpoint: a job resumes after it; None: start."""
        latest = self.latest()
        return latest.step if latest is not None else None

    # ---- history -----------------------------------------------------------------------

    def ledger(self) -> list[LedgerRecord]:
        """The ledger's records, oldest first ([] without one). Read as a user's file
        (medic_core.user_files: no symlink, no FIFO, the owner's, at most LEDGER_LIMIT
        bytes); unreadable: [] (the report then falls back to manifests and marks)."""
        return read_ledger(self.root)

    def history(self) -> tuple[list[LedgerRecord], list[LedgerRecord]]:
        """(commits, resumes), oldest first: the ledger's records, plus the commits whose
        manifests and the resumes whose mark files it lacks (a job from before the ledger, a
        ledger that could not be written). Pruned checkpoints stay in it."""
        return merged_history(self.ledger(), self.checkpoints(), self.resumes())

    def resumes(self) -> list[Resume]:
        """The resume marks of restarted runs, oldest first; unreadable ones are skipped."""
        return read_resumes(self.root)

    # ---- pruning -----------------------------------------------------------------------

    def prune(self, keep: int = 2, *, stale_after: float = STALE_AFTER) -> list[Path]:
        """Remove all but the `keep` newest complete checkpoints, `step-*` directories that
        are not complete, and temporary directories left by a writer that died (its PID is
        gone on this host) or idle for `stale_after` seconds. Returns what was removed
        (`prune_report` also says what was kept and why). A node-local tier is pruned to its
        `keep` newest steps too, but a step there goes only once it is durable."""
        return self.prune_report(keep, stale_after=stale_after).removed

    def prune_report(self, keep: int = 2, *, stale_after: float = STALE_AFTER) -> Pruned:
        """`prune`, saying what it did: each path it removed, and each it would have removed
        but kept, with why. A path is removed only once it and everything in it is verified
        (medic_core.user_files.UserDir.remove_tree: a real directory, nothing in it owned by
        anyone but the directory's owner, a symlink never followed): root pruning a user's
        directory removes nothing the user could not have removed."""
        return prune_report(self, keep, stale_after=stale_after)
