"""The fair queue: clients in turn, each client's requests in arrival order; the displacement rule."""

import random

import pytest

from boundgen.runtime.fair_queue import FairQueue, within


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


def test_a_hosts_many_clients_share_its_turn_among_the_hosts():
    q = FairQueue()
    for i in range(30):  # one host sends each request under a new id
        q.append(within("10.0.0.2", f"id:x{i}"), f"x{i}")
    q.append("10.0.0.1", "v0")
    q.append(within("10.0.0.1", "id:w"), "w0")
    q.append("10.0.0.1", "v1")
    taken = drain(q)
    assert taken[:6] == ["x0", "v0", "x1", "w0", "x2", "v1"], "hosts alternate; within a host its clients do"
    assert [t for t in taken if t.startswith("x")] == [f"x{i}" for i in range(30)]


def test_grouped_keys_iterate_in_the_order_of_taking():
    rng = random.Random(1)
    q = FairQueue()
    for i in range(300):
        q.append(rng.choice(["A", within("A", "id:1"), within("A", "id:2"), within("B", "id:1"), "C"]), i)
        if rng.random() < 0.3:
            q.popleft()
    expected = list(q)
    assert q.peek() == expected[0]
    assert drain(q) == expected


def test_remove_from_a_group_keeps_its_other_clients_turns():
    q = FairQueue()
    a, b, c = object(), object(), object()
    q.append(within("H", "id:1"), a)
    q.append(within("H", "id:2"), b)
    q.append("G", c)
    assert not q.remove("H", a), "the group's own key is another client of it"
    assert q.remove(within("H", "id:1"), a) and q.waiting(within("H", "id:1")) == 0
    assert q.waiting(within("H", "id:2")) == 1 and len(q) == 2
    assert q.popleft() is b and q.popleft() is c and not q
    assert not q.remove(within("H", "id:2"), b)


def test_a_greedy_group_gives_its_place_even_when_each_of_its_clients_holds_one():
    q = FairQueue()
    for i in range(5):
        q.append(within("10.0.0.2", f"id:x{i}"), f"x{i}")
    assert q.displaceable("10.0.0.1") == (within("10.0.0.2", "id:x4"), "x4"), "the burst's host holds 5, this one 0"
    assert q.displaceable(within("10.0.0.2", "id:new")) is None, "one a client within its own host: no greedier one"
    q.append(within("10.0.0.2", "id:x0"), "x0b")
    q.append(within("10.0.0.2", "id:x0"), "x0c")
    assert q.displaceable(within("10.0.0.2", "id:new")) == (within("10.0.0.2", "id:x0"), "x0c")
    q2 = FairQueue()
    for i in range(3):
        q2.append(within("H", "id:a"), i)
    q2.append("G", "g0")
    q2.append(within("G", "id:b"), "b0")
    assert q2.displaceable(within("G", "id:c")) is None, "H holds 3, G 2: G has its share among the hosts"
    q2.append("G", "g1")
    assert q2.displaceable(within("G", "id:c")) == ("G", "g1"), "within G, its greediest client gives way"
