"""Deadlines and cancellation for a caller waiting inside an engine.

A call may carry a deadline (`time.monotonic()` seconds) and a `cancelled` event (the server
sets it when the client goes away). A request still waiting when either fires is not run.
"""

from __future__ import annotations

import threading

# Seconds: how often a caller waiting inside an engine looks at its `cancelled` event (an Event
# cannot wake a thread waiting on something else). Whether a request runs does not depend on it:
# the event is checked again just before a request would run; only the caller's return waits.
CANCEL_POLL_S = 0.05


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
    slices = [] if deadline is None else [max(0.0, deadline - now)]
    if cancelled is not None:
        slices.append(CANCEL_POLL_S)
    return min(slices) if slices else None
