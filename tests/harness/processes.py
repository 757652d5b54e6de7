"""Processes a test started, found and stopped by process id (never `ray stop`, never by name):
other Ray instances on the machine belong to other tests or users.

A process is named by (pid, start time): the start time guards against a pid that the kernel
gave to a new process after the first one ended.
"""

from __future__ import annotations

from pathlib import Path


def process_table() -> dict[int, tuple[int, str, str]]:
    """pid → (parent pid, start time, command line) from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), fields[19], command.strip())
    return table


def with_descendants(
    roots: set[int], table: dict[int, tuple[int, str, str]] | None = None
) -> dict[int, tuple[str, str]]:
    """pid → (start time, command line) of `roots` that are alive and all their descendants."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found = {pid for pid in roots if pid in table}
    frontier = list(found)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return {pid: (table[pid][1], table[pid][2]) for pid in found}


def descendants(root: int) -> dict[int, tuple[str, str]]:
    """pid → (start time, command line) of every process below `root` (not `root` itself)."""
    found = with_descendants({root})
    found.pop(root, None)
    return found


def still_running(processes: dict[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """The processes of `processes` that still run (the same pid with the same start time)."""
    table = process_table()
    return {pid: info for pid, info in processes.items() if table.get(pid, (0, None))[1] == info[0]}
