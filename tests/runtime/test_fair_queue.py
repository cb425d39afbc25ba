"""The fair queue: clients in turn, each client's requests in arrival order; the displacement rule."""

import random

import pytest

from boundgen.runtime.fair_queue import FairQueue


def drain(q: FairQueue) -> list:
    return [q.popleft() for _ in range(len(q))]


def test_a_burst_does_not_delay_a_later_client_behind_all_of_it():
    q = FairQueue()
    for i in range(300):
        q.append("A", f"a{i}")
    q.append("B", "b0")
    taken = drain(q)
    assert taken.index("b0") == 1, "B waits for one of A's requests, not for all 300"
    assert [t for t in taken if t.startswith("a")] == [f"a{i}" for i in range(300)]


def test_one_client_is_first_in_first_out():
    q = FairQueue()
    for i in range(5):
        q.append("", i)
    assert drain(q) == [0, 1, 2, 3, 4] and not q


def test_clients_take_turns_and_iteration_is_the_order_of_taking():
    rng = random.Random(0)
    q = FairQueue()
    for i in range(200):
        q.append(rng.choice("ABCD"), i)
        if rng.random() < 0.3:
            q.popleft()
    expected = list(q)
    assert q.peek() == expected[0]
    assert drain(q) == expected


def test_turns_rotate():
    q = FairQueue()
    for client, entry in [("A", "a0"), ("A", "a1"), ("B", "b0"), ("B", "b1"), ("C", "c0")]:
        q.append(client, entry)
    assert drain(q) == ["a0", "b0", "c0", "a1", "b1"]


def test_remove_takes_out_only_that_entry_and_a_client_with_none_leaves_the_turns():
    q = FairQueue()
    a0, a1, b0 = object(), object(), object()
    q.append("A", a0)
    q.append("A", a1)
    q.append("B", b0)
    assert q.remove("A", a1) and not q.remove("A", a1) and not q.remove("C", a1)
    assert q.remove("B", b0) and q.waiting("B") == 0
    assert len(q) == 1 and q.popleft() is a0 and not q
    with pytest.raises(IndexError):
        q.popleft()


def test_the_greediest_clients_newest_request_gives_its_place():
    q = FairQueue()
    for i in range(4):
        q.append("A", f"a{i}")
    q.append("B", "b0")
    assert q.displaceable("C") == ("A", "a3")
    assert q.displaceable("B") == ("A", "a3")
    q.append("B", "b1")
    q.append("B", "b2")
    assert q.displaceable("B") is None, "A holds 4, B 3: B has its share"
    assert q.displaceable("A") is None, "nobody holds two more than A"
    assert FairQueue().displaceable("A") is None
