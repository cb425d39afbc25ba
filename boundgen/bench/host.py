"""The host a bench ran on, recorded with every result: a QPS means little without the CPU that
drove the load (and, over a network target, the cores the server was given).

/proc/cpuinfo's first 'model name' (platform.processor() where there is none), os.cpu_count()
logical cores, the cores this process may run on (sched_getaffinity: a taskset or a container
limit shows here) -> `HostRecord` -> the result JSON's "host" and report.py's host line.
"""

from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostRecord:
    cpu_model: str
    logical_cores: int  # os.cpu_count()
    bench_cores: str  # the cores this bench process may use, as a list of ranges ("0-7,16")
    bench_core_count: int
    client_procs: int  # load-generating processes (1: threads in the bench process itself)
    server_cores: str | None = None  # as given by --server-cores; the bench cannot see the server

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The first 'model name' of /proc/cpuinfo, else platform.processor(), else 'unknown'."""
    try:
        for line in Path(cpuinfo).read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def available_cores() -> set[int]:
    """The cores this process may run on (all of os.cpu_count() where sched_getaffinity is missing)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def core_ranges(cores) -> str:
    """{0, 1, 2, 3, 8, 10, 11} -> '0-3,8,10-11'."""
    out, run = [], []
    for c in sorted(cores):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def parse_cores(text: str) -> set[int]:
    """'0-3,8,10-11' -> {0, 1, 2, 3, 8, 10, 11} (core_ranges' inverse); ValueError on a malformed list."""
    cores = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        lo, hi = int(first), int(last or first)
        if lo < 0 or hi < lo:
            raise ValueError(f"a core range must be N or N-M with 0 <= N <= M, got {part!r}")
        cores.update(range(lo, hi + 1))
    return cores


def host_record(client_procs: int = 1, server_cores: str | None = None,
                cpuinfo: str | Path = "/proc/cpuinfo") -> HostRecord:
    cores = available_cores()
    return HostRecord(cpu_model=cpu_model(cpuinfo), logical_cores=os.cpu_count() or len(cores),
                      bench_cores=core_ranges(cores), bench_core_count=len(cores), client_procs=client_procs,
                      server_cores=server_cores)
