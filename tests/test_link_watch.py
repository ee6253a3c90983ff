"""The link watch (healthd/link_watch.py) on a fixture host tree: it wakes the `ib` check
when a port's up-or-down differs from what the check last judged, including a port that
came back and went down again between two reads, and only over the ports the check judges."""

from __future__ import annotations

from pathlib import Path

from healthd.fixtures import write_host_tree
from healthd.link_watch import Judged, LinkWatch, port_states

DOWN = "1: DOWN\n"


def setup(tmp_path: Path) -> tuple[Path, Path, list[list[str]]]:
    write_host_tree(tmp_path)
    ports = port_states(tmp_path)
    assert ports, "the fixture tree has InfiniBand ports"
    first = sorted(ports)[0]
    hca, port = first.split("/")
    state = tmp_path / f"sys/class/infiniband/{hca}/ports/{port}/state"
    return tmp_path, state, []


def test_without_a_judgement_a_change_between_two_reads_wakes_the_check(tmp_path: Path) -> None:
    root, state, woken = setup(tmp_path)
    watch = LinkWatch(root, woken.append)
    assert not watch.look()  # the first read only learns the ports
    up = state.read_text()
    state.write_text(DOWN)
    assert watch.look() and woken == [["ib"]]
    assert not watch.look()  # nothing new
    state.write_text(up)
    assert watch.look() and len(woken) == 2


def test_a_port_down_again_between_two_reads_is_seen_against_the_checks_judgement(
    tmp_path: Path,
) -> None:
    root, state, woken = setup(tmp_path)
    key = f"{state.parts[-4]}/{state.parts[-2]}"  # .../<hca>/ports/<port>/state
    ports = frozenset(port_states(root))
    judged = Judged(ports, frozenset())
    watch = LinkWatch(root, woken.append, judged=lambda: judged)
    assert not watch.look()  # all up, judged up
    state.write_text(DOWN)
    assert watch.look()  # down, judged up: wake
    judged = Judged(ports, frozenset({key}))  # the check ran: down
    assert not watch.look()
    # It came back and the check judged it up; it went down again before the next read.
    judged = Judged(ports, frozenset())
    assert watch.look() and len(woken) == 2


def test_a_port_the_check_does_not_judge_never_wakes_it(tmp_path: Path) -> None:
    root, state, woken = setup(tmp_path)
    key = f"{state.parts[-4]}/{state.parts[-2]}"
    judged = Judged(frozenset(port_states(root)) - {key}, frozenset())  # left out by its config
    watch = LinkWatch(root, woken.append, judged=lambda: judged)
    state.write_text(DOWN)
    assert not watch.look() and not watch.look() and woken == []


def test_a_node_without_infiniband_never_wakes(tmp_path: Path) -> None:
    woken: list[list[str]] = []
    watch = LinkWatch(tmp_path, woken.append)
    assert not watch.look() and not watch.look() and woken == []
