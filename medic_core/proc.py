"""The one gateway to external programs: argv lists only, a timeout on every call.

A command that outlives its timeout is killed with its whole process group, so a hung
`nvidia-smi` or `scontrol` cannot hang a prolog or the daemon. Nothing here uses a shell.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    dropped: int = 0  # bytes of output read and thrown away past run_capped's limit

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


def _kill_group(proc: subprocess.Popen[Any]) -> None:
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


def run_capped(
    argv: Sequence[str],
    *,
    timeout: float,
    limit: int,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> CommandResult:
    """`run` for a command whose output is not ours to trust (a site's own check): at most
    `limit` bytes of stdout and of stderr are kept (the first ones; the rest is read and
    counted in `dropped`, so the command never blocks on a full pipe), decoded as UTF-8 with
    bad bytes as U+FFFD. At `timeout` seconds the whole process group is killed, whether the
    command is still writing, silent, or has exited with a child holding its pipes open."""
    args = tuple(str(a) for a in argv)
    start = time.monotonic()
    deadline = start + timeout
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(args, None, "", "", time.monotonic() - start, start_error=str(exc))
    assert proc.stdout is not None and proc.stderr is not None
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    kept = {out_fd: bytearray(), err_fd: bytearray()}
    dropped = 0
    timed_out = False
    returncode: int | None = None
    try:
        with selectors.DefaultSelector() as selector:
            for fd in kept:
                selector.register(fd, selectors.EVENT_READ)
            while selector.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    buf = kept[key.fd]
                    room = max(0, limit - len(buf))
                    buf += chunk[:room]
                    dropped += max(0, len(chunk) - room)
        if not timed_out:
            try:
                returncode = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            _kill_group(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)  # a process in uninterruptible sleep is left behind
    finally:
        proc.stdout.close()
        proc.stderr.close()
    out, err = bytes(kept[out_fd]), bytes(kept[err_fd])
    return CommandResult(
        args,
        returncode,
        out.decode("utf-8", errors="replace"),
        err.decode("utf-8", errors="replace"),
        time.monotonic() - start,
        timed_out,
        timeout=timeout if timed_out else None,
        dropped=dropped,
    )


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
