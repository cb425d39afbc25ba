"""How a gRPC call cancelled under the server is counted: the client's own deadline ends the call
on the client first, and the server, whose deadline is later by the time the call took to arrive,
sees a cancellation a little before its deadline. That is the deadline's doing, not the client's."""

from __future__ import annotations

from boundgen.server.kserve.grpc_service import DEADLINE_SLACK_S, ended_by_deadline, expired


class Context:
    def __init__(self, remaining):
        self.remaining = remaining

    def time_remaining(self):
        return self.remaining


def test_a_cancellation_just_before_the_deadline_is_the_deadlines():
    assert ended_by_deadline(Context(DEADLINE_SLACK_S / 2))
    assert ended_by_deadline(Context(-1.0))
    assert not expired(Context(DEADLINE_SLACK_S / 2))  # the exact check, before answering, stays exact


def test_a_cancellation_well_before_the_deadline_or_without_one_is_the_clients():
    assert not ended_by_deadline(Context(2 * DEADLINE_SLACK_S))
    assert not ended_by_deadline(Context(None))
