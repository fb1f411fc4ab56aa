"""What the bench reads off a router process from outside: its CPU time and resident
memory (``/proc/<pid>/stat`` and ``/proc/<pid>/status``, Linux), and counters from
its ``/metrics``.
"""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

import aiohttp

#: clock ticks per second, the unit of utime and stime in /proc/<pid>/stat
TICKS = os.sysconf("SC_CLK_TCK")
#: open files the bench wants for itself and its children (10,000 clients through a
#: router hold ~20,000 sockets in the router: client side and backend link)
OPEN_FILES = 65536


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """The CPU seconds the process has used so far in user space and in the kernel (10
    ms ticks: good over a batch of a second or so, not over one call)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    # after the command: state(0) ppid ... utime is field 14 of the line, 11 here
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def cpu_time(pid: int) -> float:
    """Seconds the process's threads have run on a CPU so far, to the nanosecond
    (``/proc/<pid>/task/*/schedstat``; :func:`cpu_seconds` counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def migrations(pid: int) -> int:
    """Times the process's threads have been moved from one CPU to another so far
    (``se.nr_migrations`` in ``/proc/<pid>/task/*/sched``; 0 where the kernel does not
    keep it). A move leaves the caches of the CPU it ran on behind."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            for line in (task / "sched").read_text().splitlines():
                if line.startswith("se.nr_migrations"):
                    total += int(line.rpartition(":")[2])
    return total


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def raise_open_files() -> int:
    """Raise RLIMIT_NOFILE as far as allowed (children inherit it); the soft limit now.

    As root the hard limit can go up too; otherwise the soft limit rises to the hard one.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= OPEN_FILES:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, max(hard, OPEN_FILES)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def metric_sum(http: aiohttp.ClientSession, ws_url: str, name: str) -> float:
    """The sum over every label set of the sample ``name`` on the router's /metrics."""
    url = ws_url.removesuffix("/acp").replace("ws://", "http://") + "/metrics"
    async with http.get(url) as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rpartition(" ")[2])
    return total
