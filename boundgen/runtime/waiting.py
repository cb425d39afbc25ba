"""Deadlines and cancellation for a caller waiting inside an engine.

A call may carry a deadline (`time.monotonic()` seconds) and a `cancelled` event (the server
sets it when the client goes away). A request still waiting when either fires is not run.
"""

from __future__ import annotations

import math
import numbers
import threading

from boundgen.errors import InvalidInput

# Seconds: how often a caller waiting inside an engine looks at its `cancelled` event (an Event
# cannot wake a thread waiting on something else). Whether a request runs does not depend on it:
# the event is checked again just before a request would run; only the caller's return waits.
CANCEL_POLL_S = 0.05
# Seconds: the longest one wait blocks; a deadline further away is waited for in such slices (a wait
# of 1e10 s overflows the platform's time_t).
MAX_WAIT_S = 3600.0


def checked(deadline, cancelled) -> tuple[float | None, threading.Event | None]:
    """A caller's deadline and `cancelled` as the engine keeps them: +inf is no deadline (None);
    InvalidInput, before anything is queued, for a deadline that is not a number (NaN included) or a
    `cancelled` that is no event (nothing with `is_set`)."""
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, numbers.Real) or math.isnan(deadline):
            raise InvalidInput(f"deadline must be time.monotonic() seconds (a number) or None, got {deadline!r}")
        deadline = None if deadline == math.inf else float(deadline)
    if cancelled is not None and not callable(getattr(cancelled, "is_set", None)):
        raise InvalidInput(f"cancelled must be a threading.Event or None, got {type(cancelled).__name__}")
    return deadline, cancelled


def refusal(now: float, deadline: float | None, cancelled: threading.Event | None) -> str | None:
    """Why a waiting request must not run any more: "expired", "cancelled", or None (it may).
    A request past its deadline is "expired" even if its client has gone too: a client whose own
    deadline (gRPC's) passes cancels at that moment, and which of the two a waiter sees first
    must not decide how the request is counted."""
    if deadline is not None and now >= deadline:
        return "expired"
    return "cancelled" if cancelled is not None and cancelled.is_set() else None


def wait_slice(now: float, deadline: float | None, cancelled: threading.Event | None) -> float | None:
    """How long (seconds, >= 0) a caller waiting inside an engine may block before it looks at its
    deadline and `cancelled` event again; None: until what it waits for happens."""
    slices = [] if deadline is None else [min(max(0.0, deadline - now), MAX_WAIT_S)]
    if cancelled is not None:
        slices.append(CANCEL_POLL_S)
    return min(slices) if slices else None
