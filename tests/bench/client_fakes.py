"""Picklable fake targets and requests for client-process tests: a spawned process imports this
module to build them from a TargetSpec."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from boundgen.bench.loadgen import Clock


@dataclass(frozen=True)
class Req:
    index: int
    texts: tuple = ("abc",)
    samples: int = 1


class SleepTarget:
    """Answers every request after `delay_s`."""

    def __init__(self, delay_s: float = 0.002):
        self.delay_s = delay_s

    def __call__(self, request):
        time.sleep(self.delay_s)
        return None


class StopTarget:
    """Stops its whole process (SIGSTOP) at the first request: a client that hangs for good."""

    def __call__(self, request):
        os.kill(os.getpid(), signal.SIGSTOP)


class BrokenTarget:
    def __init__(self):
        raise RuntimeError("no such server")


def clock_now() -> float:
    return Clock().now()
