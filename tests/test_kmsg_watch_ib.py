"""The kernel log follower wakes the ib check on the mlx5 driver's link lines (level 6, info,
which the warning-level test alone would miss), in /dev/kmsg's exact record format."""

from __future__ import annotations

import pytest

from healthd.kmsg_watch import checks_for_line


@pytest.mark.parametrize(
    "line",
    [
        "6,2301,9123456789,-;mlx5_core 0000:18:00.0 ibp24s0: Link down",
        "6,2302,9123499999,-;mlx5_core 0000:18:00.0 ibp24s0: Link up",
        "6,2303,9123500000,-;mlx5_core 0000:cb:00.0: Module 0, status: unplugged",
        "3,2304,9123500001,-;mlx5_core 0000:cb:00.0: mlx5_port_module_event:1174:(pid 0):"
        " Port module event: module 0, Cable unplugged",
    ],
)
def test_mlx5_link_lines_wake_the_ib_check(line: str) -> None:
    assert checks_for_line(line) == ("ib", "kernel_log")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("6,10,100,-;mlx5_core 0000:18:00.0: firmware version: 28.39.1002", ()),
        ("6,11,101,-;mlx5_core 0000:18:00.0 ibp24s0: renamed from ib0", ()),
        ("4,12,102,-;some driver: Link down later", ("kernel_log",)),
        (
            "3,13,103,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.",
            ("gpu_xid", "kernel_log"),
        ),
    ],
)
def test_other_lines_keep_their_checks(line: str, expected: tuple[str, ...]) -> None:
    assert checks_for_line(line) == expected
