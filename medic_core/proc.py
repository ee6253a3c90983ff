"""The one gateway to external programs: argv lists only, a timeout on every call.

A command that outlives its timeout is killed with its whole process group, so a hung
`nvidia-smi` or `scontrol` cannot hang a prolog or the daemon. Nothing here uses a shell.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TAIL_CHARS = 4000


class CommandError(RuntimeError):
    """A command could not be started, timed out, or exited non-zero when asked to check."""

    def __init__(self, result: CommandResult, why: str) -> None:
        self.result = result
        super().__init__(f"{' '.join(result.argv)}: {why}")


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int | None  # None when the command timed out or could not start
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool = False
    start_error: str = ""
    timeout: float | None = None  # the deadline given (a timed-out run names it, not its clock)

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def tail(self, chars: int = TAIL_CHARS) -> str:
        """The end of the combined output, for logs and action records."""
        return (self.stdout + self.stderr)[-chars:]

    def describe_failure(self) -> str:
        if self.start_error:
            return f"could not start: {self.start_error}"
        if self.timed_out:
            if self.timeout is not None:
                return f"timed out after {self.timeout:g}s"
            return f"timed out after {self.seconds:.1f}s"
        message = (self.stderr.strip() or self.stdout.strip()).splitlines()
        detail = message[-1] if message else "no output"
        return f"exit {self.returncode}: {detail}"


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    input_text: str | None = None,
    check: bool = False,
) -> CommandResult:
    """Run argv to completion or until `timeout` seconds pass; never raises for a timeout
    unless `check` is set. A killed command may leave a process in uninterruptible sleep
    (a hung driver): we do not wait for it beyond a short grace period."""
    args = tuple(str(a) for a in argv)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # Output is data (job names, reasons, comments users wrote): bytes that are not
            # UTF-8 become U+FFFD instead of a UnicodeDecodeError that loses everything.
            encoding="utf-8",
            errors="replace",
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        result = CommandResult(args, None, "", "", time.monotonic() - start, start_error=str(exc))
        if check:
            raise CommandError(result, result.describe_failure()) from exc
        return result
    try:
        out, err = proc.communicate(input=input_text, timeout=timeout)
        result = CommandResult(args, proc.returncode, out, err, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        result = CommandResult(
            args, None, out or "", err or "", time.monotonic() - start, True, timeout=timeout
        )
    if check and not result.ok:
        raise CommandError(result, result.describe_failure())
    return result


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start a long-running program detached in its own session (a daemon run in the
    foreground by the lab, say), output appended to `log_path`. Returns its PID."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    return proc.pid
