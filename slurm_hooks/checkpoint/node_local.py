"""The node-local checkpoint tier (`CheckpointDir(local=...)` or MEDIC_CHECKPOINT_LOCAL):
`writing(step)` commits the step in a node-local directory; a background thread then
drains it into the durable directory (copied into a temporary directory there, committed
only when every file's size and sha256 match the node-local manifest). Its cap, eviction of
durable steps, and pruning. docs/resilient-jobs.md, "Tiers"."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from medic_core.user_files import UnsafeFile, UserDir
from slurm_hooks import local_tier
from slurm_hooks.checkpoint.commit import point, staging
from slurm_hooks.checkpoint.layout import (
    LOCAL,
    MANIFEST,
    STEP_PREFIX,
    TRASH_PREFIX,
    Checkpoint,
    CheckpointError,
    StepDirectory,
    check_step,
    step_dirs,
    step_name,
)
from slurm_hooks.checkpoint.prune import Pruned, abandoned

# The node-local tier: its base directory (the job's own directory is `job-<SLURM_JOB_ID>`
# in it) and its cap in bytes (a number, or with K, M, G, T: binary).
LOCAL_ENV = "MEDIC_CHECKPOINT_LOCAL"
LOCAL_CAP_ENV = "MEDIC_CHECKPOINT_LOCAL_CAP"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _parse_cap(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if match is None or int(match.group(1)) == 0:
        raise CheckpointError(
            f"{LOCAL_CAP_ENV}={text!r}: expected a size in bytes above 0, such as 68719476736 "
            "or 64G (K, M, G, T: powers of 1024)"
        )
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def shared_base(base: Path) -> Path:
    """The base directory every job on the node shares (like /tmp): created sticky and open
    to all when missing; an existing one must be a real directory (never a symlink someone
    planted), owned by root or this user, and sticky when others may write in it."""
    base = base.absolute()
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            base.mkdir()
            os.chmod(base, 0o1777, follow_symlinks=False)
        st = os.lstat(base)
    except OSError as exc:
        raise CheckpointError(
            f"{base}: cannot create the node-local checkpoint tier there "
            f"({exc.strerror or exc}); point {LOCAL_ENV} at a directory you can write"
        ) from None
    shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
    if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()) or shared:
        raise CheckpointError(
            f"{base}: not a safe base for the node-local checkpoint tier (a symlink, someone "
            f"else's, or open to all without the sticky bit); point {LOCAL_ENV} elsewhere"
        )
    return base


def own_dir(path: Path) -> None:
    """The job's local tier directory: made 0700 when missing; it must be a real directory
    of this user that nobody else may write in (so nothing can be planted in it)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = os.lstat(path)
    except OSError as exc:
        raise CheckpointError(
            f"{path}: cannot create the node-local checkpoint tier ({exc.strerror or exc}); "
            f"point {LOCAL_ENV} (or local=) at a directory you can write"
        ) from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise CheckpointError(
            f"{path}: the node-local checkpoint tier must be a real directory of uid "
            f"{os.geteuid()} that no one else may write (chmod go-w, or point {LOCAL_ENV} "
            "(or local=) elsewhere)"
        )


def _copy_file(src: Path, dst: Path) -> None:
    """Copy a node-local checkpoint file into a drain's fresh staging directory: never
    following a symlink on either side, never writing into a file that was there."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    source = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(source).st_mode):
            raise CheckpointError(f"{src}: not a regular file; the step cannot be drained")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        target = os.open(dst, flags, 0o644)
        try:
            while os.sendfile(target, source, None, 1 << 30) > 0:
                pass
        finally:
            os.close(target)
    finally:
        os.close(source)


def _tree_bytes(root: Path) -> int:
    """The bytes a local tier's cap counts: every file but Medic's own manifests."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name == MANIFEST:
                continue
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


class LocalTier:
    """A job's node-local checkpoint tier (`CheckpointDir(local=...)`): `root/step-*`
    committed as in the durable directory (no ledger), each step then drained to the
    durable directory: copied into a staging directory there and committed only when every
    copied file's size and sha256 match the node-local manifest. A step is durable when
    that commit's rename is; before, it lives only here."""

    def __init__(
        self, durable: StepDirectory, root: Path, cap: int | None, background: bool
    ) -> None:
        self.durable = durable
        own_dir(root.absolute())
        local_tier.register_job_dir(durable._env, root.absolute())
        self.dir = durable.tier_dir(root)  # its own steps
        self.dir._tier, self.dir._ledger = LOCAL, False
        self.root = self.dir.root
        if cap is None and durable._env.get(LOCAL_CAP_ENV):
            cap = _parse_cap(durable._env[LOCAL_CAP_ENV])
        elif cap is None:
            vfs = os.statvfs(self.root)
            cap = vfs.f_frsize * vfs.f_blocks // 2
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise CheckpointError(f"local_cap={cap!r}: expected a size in bytes above 0")
        self.cap = cap
        self.background = background
        self._lock = threading.Condition()
        self._queue: list[int] = []
        self._draining: int | None = None
        self._thread: threading.Thread | None = None
        self._looked_back = False  # steps a killed run left undrained are queued once
        self.failed: dict[int, str] = {}  # step -> why its last drain failed

    # ---- writing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, step: int) -> Iterator[Path]:
        check_step(step)
        durable = self.durable.root / step_name(step)
        if durable.exists():
            raise CheckpointError(
                f"{durable}: step {step} is already checkpointed; write a later step or "
                f"remove {durable}"
            )
        complete = self.complete()
        expected = complete[-1].size if complete else 0
        self._evict(_tree_bytes(self.root) + expected - self.cap)  # room before it is written
        with staging(self.dir, step, before_commit=lambda tmp: self._fit(step, tmp)) as tmp:
            yield tmp
        self._submit(step)

    def _fit(self, step: int, tmp: Path) -> None:
        used = _tree_bytes(self.root)
        if used > self.cap:
            self._evict(used - self.cap)
            used = _tree_bytes(self.root)
        if used > self.cap:
            raise CheckpointError(
                f"{self.root}: step {step} ({_tree_bytes(tmp)} bytes) would fill the node-local "
                f"checkpoint tier to {used} bytes, over its cap of {self.cap} bytes "
                f"({LOCAL_CAP_ENV} or local_cap=); the step was not committed: raise the cap, "
                "or call drain() first so older steps are durable and can be evicted"
            )

    # ---- reading -----------------------------------------------------------------------

    def complete(self) -> list[Checkpoint]:
        """Complete node-local steps (manifest and sizes), oldest first."""
        return [replace(c, tier=LOCAL) for c in self.dir.checkpoints()]

    def newest(self, at_least: int | None) -> Checkpoint | None:
        """The newest node-local step, not older than `at_least`, that matches its manifest's
        hashes, or None."""
        for path in reversed(step_dirs(self.root)):
            if at_least is not None and int(path.name[len(STEP_PREFIX) :]) < at_least:
                return None
            found = self.dir.load(path, verify_hashes=True)
            if found is not None:
                return replace(found, tier=LOCAL)
        return None

    def drained(self, checkpoint: Checkpoint) -> bool:
        """The durable directory holds this step, complete, with the same files and hashes."""
        durable = self.durable.load(self.durable.root / step_name(checkpoint.step))
        return durable is not None and dict(durable.files) == dict(checkpoint.files)

    # ---- draining ----------------------------------------------------------------------

    def _submit(self, step: int) -> None:
        with self._lock:
            self._look_back()
            self.failed.pop(step, None)
            if step not in self._queue and step != self._draining:
                self._queue.append(step)
            if self.background:
                self._start_locked()

    def _start_locked(self) -> None:
        """Start the drain thread when steps wait and none runs. Caller holds the lock."""
        if self._queue and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="medic-checkpoint-drain", daemon=False
            )
            self._thread.start()  # not a daemon: the interpreter waits for it at exit

    def _look_back(self) -> None:
        """Queue complete node-local steps that are not durable (a run killed before their
        drain finished), once per process, oldest first. Caller holds the lock."""
        if self._looked_back:
            return
        self._looked_back = True
        for checkpoint in self.complete():
            if checkpoint.step not in self._queue and not self.drained(checkpoint):
                self._queue.append(checkpoint.step)

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        return
                    step = self._draining = self._queue.pop(0)
                self._drain_logged(step)
        finally:  # also when the thread dies: the next submit or drain() starts another
            with self._lock:
                self._thread = None
                self._lock.notify_all()

    def _drain_logged(self, step: int) -> None:
        try:
            self._drain_step(step)
        except (CheckpointError, OSError) as exc:
            why = str(exc) if isinstance(exc, CheckpointError) else f"{exc.strerror or exc}"
            print(f"medic: step {step} did not drain: {why}", file=sys.stderr)
            with self._lock:
                self.failed[step] = why
        finally:
            with self._lock:
                self._draining = None
                self._lock.notify_all()

    def _drain_step(self, step: int) -> None:
        path = self.root / step_name(step)
        checkpoint = self.dir.load(path)
        if checkpoint is None:
            raise CheckpointError(
                f"{path}: the node-local copy of step {step} is incomplete; it cannot be drained"
            )
        if self.drained(checkpoint):
            return
        stamp = (checkpoint.time, checkpoint.started)
        try:
            with staging(self.durable, step, stamp=stamp, expect=checkpoint.files) as tmp:
                for name in checkpoint.files:
                    point("durable:copying")
                    _copy_file(path / name, tmp / name)
                point("durable:copied")
        except CheckpointError:
            if self.drained(checkpoint):  # another process drained it first
                return
            raise

    def drain(self, timeout: float | None = None) -> list[int]:
        """Wait until every node-local step is durable (the ones a killed run left too);
        returns the node-local steps now durable. CheckpointError, naming the steps, when
        `timeout` seconds pass first or a step cannot be drained."""
        until = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._looked_back = True
            for checkpoint in self.complete():  # retry failed ones, pick up a killed run's
                step = checkpoint.step
                if step in self._queue or step == self._draining or self.drained(checkpoint):
                    continue
                self._queue.append(step)
            self._queue.sort()
            self.failed.clear()
        if self.background:
            with self._lock:
                while self._queue or self._draining is not None:
                    self._start_locked()
                    left = None if until is None else until - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._lock.wait(left)
        else:
            while self._queue and (until is None or time.monotonic() < until):
                with self._lock:
                    step = self._draining = self._queue.pop(0)
                self._drain_logged(step)
        with self._lock:
            pending = sorted(self._busy_locked())
            failed = dict(self.failed)
        if pending:
            raise CheckpointError(
                f"{self.root}: steps {pending} are not durable in {self.durable.root} after "
                f"{timeout} s; call drain() again with a longer timeout (they stay node-local)"
            )
        if failed:
            step = min(failed)
            raise CheckpointError(f"step {step} did not drain: {failed[step]}")
        return [c.step for c in self.complete() if self.drained(c)]

    # ---- pruning and eviction ----------------------------------------------------------

    def _busy(self) -> set[int]:
        with self._lock:
            return self._busy_locked()

    def _busy_locked(self) -> set[int]:
        return {*self._queue, *([self._draining] if self._draining is not None else [])}

    def _evict(self, need: int) -> None:
        """Free at least `need` bytes by removing durable steps, oldest first."""
        if need <= 0:
            return
        busy = self._busy()
        doomed = []
        for checkpoint in self.complete():
            if need <= 0:
                break
            if checkpoint.step not in busy and self.drained(checkpoint):
                doomed.append(checkpoint.path)
                need -= checkpoint.size
        self._remove(doomed, Pruned())

    def prune(self, keep: int, stale_after: float, report: Pruned) -> None:
        """Keep the `keep` newest complete steps and every one not durable yet; remove the
        rest, incomplete step directories and abandoned staging directories."""
        complete = self.complete()
        paths = {c.path for c in complete}
        doomed = [p for p in step_dirs(self.root) if p not in paths]
        busy = self._busy()
        for checkpoint in complete[:-keep]:
            if checkpoint.step not in busy and self.drained(checkpoint):
                doomed.append(checkpoint.path)
            else:
                report.kept.append((checkpoint.path, f"not durable in {self.durable.root} yet"))
        doomed += [p for p in self.root.iterdir() if abandoned(p, stale_after)]
        self._remove(doomed, report)

    def _remove(self, doomed: list[Path], report: Pruned) -> None:
        if not doomed:
            return
        try:
            top = UserDir.open(self.root)
        except UnsafeFile as exc:
            report.kept += [(path, exc.why) for path in sorted(doomed)]
            return
        with top:
            for path in sorted(doomed):
                try:
                    top.remove_tree(path.name, TRASH_PREFIX)
                except UnsafeFile as exc:
                    if path.is_symlink() or path.exists():
                        report.kept.append((path, exc.why))
                else:
                    report.removed.append(path)


# ---- progress heartbeat --------------------------------------------------------------------
