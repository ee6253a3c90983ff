"""`medic-prolog`: Slurm hook; exits 0 until its issue gives it a verdict."""

from __future__ import annotations


def main() -> int:
    return 0
