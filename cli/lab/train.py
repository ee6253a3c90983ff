"""A deterministic "training" job for the lab: a SHA-256 chain over STEPS steps, with a
checkpoint after every step through Medic's checkpoint helper. Resumes from the latest
complete checkpoint after a requeue; writes the final state to RESULT when done.

    python -m cli.lab.train CKPT_DIR RESULT STEPS STEP_SECONDS
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

from slurm_hooks.checkpoint import CheckpointDir


def step(state: bytes, n: int) -> bytes:
    return hashlib.sha256(state + n.to_bytes(8, "little")).digest()


def uninterrupted(steps: int) -> str:
    """The result of a run that was never interrupted, for comparison."""
    state = b"medic"
    for n in range(steps):
        state = step(state, n)
    return state.hex()


def run(ckpt_root: Path, result: Path, steps: int, pace: float) -> None:
    ckpts = CheckpointDir(ckpt_root)
    latest = ckpts.latest()
    if latest is None:
        start, state = 0, b"medic"
    else:
        start, state = latest.step + 1, (latest.path / "state").read_bytes()
    host = os.environ.get("SLURMD_NODENAME", "?")
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    with (ckpt_root.parent / "train.log").open("a") as log:
        log.write(f"start step={start} restarts={restarts} node={host}\n")
    for n in range(start, steps):
        state = step(state, n)
        with ckpts.writing(n) as tmp:
            (tmp / "state").write_bytes(state)
        time.sleep(pace)  # the job's own pace, so a fault can land mid-run
    result.write_text(state.hex())


if __name__ == "__main__":
    run(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
