"""What the node-local checkpoint tier buys (issue 28): the visible stall of a commit per tier
and the reload after a restart, with synthetic checkpoints of a stated size per node.

Tiers, as the library (slurm_hooks.checkpoint) runs them on one node:

* local: tmpfs (--local-dir, default /dev/shm), as `MEDIC_CHECKPOINT_LOCAL` would be;
* durable: a directory on this machine's disk (--durable-dir) whose every byte of Medic's and
  the job's I/O goes through a rate limiter at --durable-mbps (MB/s, 10^6 bytes; default 200,
  one node's share when 1,000 nodes write or read a 200 GB/s parallel filesystem at once),
  standing in for a parallel filesystem: the job's writes into it, the commit's
  sha256 read-back, the drain's copy, and the reload's reads. Metadata calls (mkdir, rename,
  fsync) are not limited: a real parallel filesystem's are slower.

For each size: a commit with the local tier on (the stall the job sees: its write into tmpfs,
fsync, hashing, manifest, rename; then the time until the background drain made the step
durable) and one with the tier off (the job writes to the durable tier directly); then the
reload, `latest()` plus the job reading every byte back: (a) an application restart on the
same node (from the local tier, hash-verified), (b) a node loss (another node's empty local
tier: from durable; peer replicas are not built, so this is also case (c), a lost peer).

Also an extrapolation to --model-bytes (default 5.7e12: 14 bytes per parameter of a 405B
model) over --model-nodes nodes: the durable tier at --model-pfs-gbps aggregate, the local
tier at the rate measured here per node (each node holds its share). Prints one JSON object.

Run: .venv/bin/python -m bench.checkpoint_tiers [--sizes 1,2,4,8] [--durable-mbps 200]
(the default size, 0.25 GiB, takes about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from slurm_hooks import checkpoint as ck
from slurm_hooks.checkpoint import commit, node_local

GIB = 1 << 30
CHUNK = 16 << 20  # bytes per write or read of the synthetic checkpoint
FILES = 4  # a checkpoint is this many equal files (model and optimizer shards, say)


class Limiter:
    """At most `bytes_per_s` through it, over every thread that uses it (a token bucket
    with no burst): each caller waits until the bytes so far fit the rate."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.lock = threading.Lock()
        self.free_at = time.monotonic()

    def take(self, n: int) -> None:
        with self.lock:
            start = max(self.free_at, time.monotonic())
            self.free_at = start + n / self.rate
            wait = self.free_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # the stand-in's bandwidth: time is what it limits


class Durable:
    """The rate-limited durable tier: the library's own I/O under `root` goes through it."""

    def __init__(self, root: Path, limiter: Limiter) -> None:
        self.root = root
        self.limiter = limiter

    def under(self, path: Path) -> bool:
        return Path(path).is_relative_to(self.root)

    def write(self, path: Path, size: int, block: bytes) -> None:
        with open(path, "wb") as f:
            left = size
            while left > 0:
                piece = block[: min(left, len(block))]
                if self.under(path):
                    self.limiter.take(len(piece))
                f.write(piece)
                left -= len(piece)

    def read_all(self, path: Path) -> int:
        total = 0
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                if self.under(path):
                    self.limiter.take(len(chunk))
                total += len(chunk)
        return total


@contextlib.contextmanager
def limited_library(durable: Durable) -> Iterator[None]:
    """The library's hashing and drain copy, rate-limited where they touch the durable tier."""
    real_sha, real_copy = commit._sha256, node_local._copy_file

    def sha256(path: Path) -> str:
        if not durable.under(path):
            return real_sha(path)
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                durable.limiter.take(len(chunk))
                digest.update(chunk)
        return digest.hexdigest()

    def copy(src: Path, dst: Path) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with open(src, "rb") as source, open(dst, "xb") as target:
            while chunk := source.read(CHUNK):
                durable.limiter.take(len(chunk))
                target.write(chunk)

    commit._sha256, node_local._copy_file = sha256, copy  # type: ignore[assignment]
    try:
        yield
    finally:
        commit._sha256, node_local._copy_file = real_sha, real_copy  # type: ignore[assignment]


def _job_write(durable: Durable, tmp: Path, size: int, block: bytes) -> None:
    for i in range(FILES):
        durable.write(tmp / f"shard-{i}.bin", size // FILES, block)


def _reload(durable: Durable, ckpt: ck.CheckpointDir) -> dict[str, Any]:
    """latest() (find and verify), then the job reading every byte back."""
    began = time.monotonic()
    found = ckpt.latest()
    assert found is not None, "no checkpoint to reload"
    found_s = time.monotonic() - began
    read = sum(durable.read_all(found.path / name) for name in found.files)
    total = time.monotonic() - began
    return {
        "tier": found.tier,
        "latest_s": round(found_s, 3),
        "read_s": round(total - found_s, 3),
        "reload_s": round(total, 3),
        "bytes": read,
    }


def measure(size: int, local_base: Path, durable: Durable, block: bytes) -> dict[str, Any]:
    job = f"{size}"
    # The library registers job-<id> for the epilog's sweep: here, in the bench's own directory.
    env = {"SLURM_JOB_ID": job, "MEDIC_PROGRESS_DIR": str(local_base)}
    durable_dir = durable.root / f"tiered-{job}"
    local = local_base / f"job-{job}"
    out: dict[str, Any] = {"bytes": size}
    try:
        tiered = ck.CheckpointDir(durable_dir, env=env, local=local, local_cap=4 * size)
        began = time.monotonic()
        with tiered.writing(1) as tmp:
            _job_write(durable, tmp, size, block)
        stall = time.monotonic() - began
        tiered.drain(timeout=3600)
        out["local_tier"] = {
            "stall_s": round(stall, 3),
            "durable_after_s": round(time.monotonic() - began, 3),
        }
        direct_dir = durable.root / f"direct-{job}"
        direct = ck.CheckpointDir(direct_dir, env=env, local=False)
        began = time.monotonic()
        with direct.writing(1) as tmp:
            _job_write(durable, tmp, size, block)
        out["durable_only"] = {"stall_s": round(time.monotonic() - began, 3)}
        shutil.rmtree(direct_dir)
        restarted = {**env, "SLURM_RESTART_COUNT": "1"}
        same_node = ck.CheckpointDir(durable_dir, env=restarted, local=local)
        out["reload_same_node"] = _reload(durable, same_node)
        other = local_base / f"other-{job}" / f"job-{job}"
        new_node = ck.CheckpointDir(durable_dir, env=restarted, local=other)
        out["reload_node_lost"] = _reload(durable, new_node)
    finally:
        for path in (durable_dir, local, local_base / f"other-{job}"):
            shutil.rmtree(path, ignore_errors=True)
    return out


def extrapolate(
    results: list[dict[str, Any]], model_bytes: float, nodes: int, pfs_gbps: float
) -> dict[str, Any]:
    """The biggest size's measured local rates, per node, against a parallel filesystem at
    `pfs_gbps` GB/s in all: a checkpoint of `model_bytes` over `nodes` nodes."""
    biggest = max(results, key=lambda r: r["bytes"])
    share = model_bytes / nodes
    local_commit = biggest["bytes"] / biggest["local_tier"]["stall_s"]
    local_reload = biggest["bytes"] / biggest["reload_same_node"]["reload_s"]
    pfs = pfs_gbps * 1e9
    return {
        "model_bytes": model_bytes,
        "nodes": nodes,
        "bytes_per_node": share,
        "pfs_gbps_aggregate": pfs_gbps,
        "durable_commit_s": round(model_bytes / pfs, 1),
        "durable_reload_s": round(model_bytes / pfs, 1),
        "local_commit_stall_s": round(share / local_commit, 1),
        "local_reload_s": round(share / local_reload, 1),
        "local_rates_from_bytes": biggest["bytes"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint_tiers")
    parser.add_argument("--sizes", default="0.25", help="GiB per node, comma-separated (1,2,4,8)")
    parser.add_argument(
        "--durable-mbps", type=float, default=200.0, help="MB/s per node (the durable tier)"
    )
    parser.add_argument("--local-dir", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--durable-dir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--model-bytes", type=float, default=5.7e12)
    parser.add_argument("--model-nodes", type=int, default=1024)
    parser.add_argument("--model-pfs-gbps", type=float, default=5.0)
    args = parser.parse_args(argv)
    try:
        sizes = [int(float(s) * GIB) // FILES * FILES for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes {args.sizes!r}: expected GiB numbers such as 1,2,4,8")
    if any(s < FILES for s in sizes) or args.durable_mbps <= 0:
        parser.error("--sizes and --durable-mbps must be above 0")
    block = os.urandom(CHUNK)
    local_base = Path(tempfile.mkdtemp(prefix="medic-bench-", dir=args.local_dir))
    durable_root = Path(tempfile.mkdtemp(prefix="medic-bench-", dir=args.durable_dir))
    durable = Durable(durable_root, Limiter(args.durable_mbps * 1e6))
    results = []
    try:
        with limited_library(durable):
            for size in sizes:
                results.append(measure(size, local_base, durable, block))
    finally:
        shutil.rmtree(local_base, ignore_errors=True)
        shutil.rmtree(durable_root, ignore_errors=True)
    report = {
        "durable_mbps": args.durable_mbps,
        "local_dir": str(args.local_dir),
        "durable_dir": str(args.durable_dir),
        "files_per_checkpoint": FILES,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "sizes": results,
        "extrapolated": extrapolate(
            results, args.model_bytes, args.model_nodes, args.model_pfs_gbps
        ),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
