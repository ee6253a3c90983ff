"""`medic-healthd`: the node daemon (built out in the healthd issue)."""

from __future__ import annotations

import sys


def main() -> int:
    print("medic-healthd: not implemented yet", file=sys.stderr)
    return 0
