"""A queue that is fair across clients: round-robin over the clients with requests waiting.

One first-in-first-out queue shared by every client lets one client's burst of 300 requests
delay every other client's next request behind all 300. Here each client has its own FIFO, and
requests are taken a client at a time in turn:

    waiting:  A: a1 a2 a3 ... a300        turns: A B
              B: b1
    taken:    a1 b1 a2 a3 ...             (B arrived after the burst; it waits for one of A's)

A client that has nothing waiting leaves the rotation and joins at its end with its next request.
Within a client, order is arrival order. A client is any hashable key (server/admission.py and
server/deploy/engine_host.py use the client's address or its X-Client-ID; "" is one client like
any other), so one client gets the single FIFO of before.

Clients may be grouped: a key made by `within(group, member)` ("GROUP MEMBER", one space) is a
client of that group, and the turns go to the groups first, then to the clients of the group whose
turn it is, each group in its own rotation. Any other key is a group of its own. serve's default
`--client-key address-id` groups a host's client ids under its address, so that a host sending
each request under a new id gets one turn among the hosts, not one a request:

    waiting:  10.0.0.2 id:x1 .. id:x30 (one each)      turns: 10.0.0.2 10.0.0.1
              10.0.0.1: v1 v2
    taken:    x1 v1 x2 v2 x3 ...

When a bounded queue is full, `displaceable(client)` names the request that may give its place
to `client`'s: the newest of the client with the most waiting (of several, the one whose turn is
furthest off) in the group with the most waiting, if that group holds at least two more than
`client`'s group (so two greedy groups do not take each other's places in turn); within
`client`'s own group, the same rule between its clients. The caller refuses it (429: the queue
was full) and queues the newcomer: a greedy client's surplus is refused, not an honest client's
first request.

Not thread-safe: its owner holds its own lock (the batcher) or uses it on one thread (admission).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Hashable, Iterable, Iterator, TypeVar

T = TypeVar("T")

SEPARATOR = " "  # between a group and its member in a grouped key; neither ids nor addresses hold one


def within(group: str, member: str) -> str:
    """The key of client `member` of `group` (the module docstring)."""
    return f"{group}{SEPARATOR}{member}"


def group_of(client: Hashable) -> Hashable:
    """The group whose turn `client` shares: GROUP of a `within` key, else the client itself."""
    if isinstance(client, str) and SEPARATOR in client:
        return client.partition(SEPARATOR)[0]
    return client


class _Group:
    """One group's clients: each client's requests, oldest first, and the clients' turns."""

    __slots__ = ("waiting", "turns", "count")

    def __init__(self):
        self.waiting: dict[Hashable, deque] = {}
        self.turns: deque[Hashable] = deque()  # its clients with requests waiting, next first
        self.count = 0

    def __iter__(self) -> Iterator:
        """Its requests in the order its turns would take them."""
        return _in_turn(iter(self.waiting[c]) for c in self.turns)

    def greediest(self) -> Hashable:
        """Its client with the most waiting; of several, the one whose turn is furthest off (a burst
        under many ids gives up its newest first)."""
        return max(reversed(self.turns), key=lambda c: len(self.waiting[c]))


class FairQueue(Generic[T]):
    def __init__(self):
        self._groups: dict[Hashable, _Group] = {}
        self._turns: deque[Hashable] = deque()  # groups with requests waiting, next to be served first
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[T]:
        """Every waiting request in the order `popleft` would take them."""
        return _in_turn(iter(self._groups[g]) for g in self._turns)

    def append(self, client: Hashable, entry: T) -> None:
        name = group_of(client)
        group = self._groups.get(name)
        if group is None:
            group = self._groups[name] = _Group()
            self._turns.append(name)
        mine = group.waiting.get(client)
        if mine is None:
            mine = group.waiting[client] = deque()
            group.turns.append(client)
        mine.append(entry)
        group.count += 1
        self._count += 1

    def peek(self) -> T:
        """The request `popleft` would take next (IndexError if none waits)."""
        if not self._turns:
            raise IndexError("peek at an empty FairQueue")
        group = self._groups[self._turns[0]]
        return group.waiting[group.turns[0]][0]

    def popleft(self) -> T:
        """The oldest request of the client whose turn it is in the group whose turn it is; both go to
        the end of their turns."""
        if not self._turns:
            raise IndexError("pop from an empty FairQueue")
        name = self._turns.popleft()
        group = self._groups[name]
        client = group.turns.popleft()
        mine = group.waiting[client]
        entry = mine.popleft()
        if mine:
            group.turns.append(client)
        else:
            del group.waiting[client]
        group.count -= 1
        if group.count:
            self._turns.append(name)
        else:
            del self._groups[name]
        self._count -= 1
        return entry

    def remove(self, client: Hashable, entry: T) -> bool:
        """Take `entry` (queued by `client`) out; False if it is not waiting."""
        name = group_of(client)
        group = self._groups.get(name)
        mine = group.waiting.get(client) if group is not None else None
        if mine is None:
            return False
        for i, queued in enumerate(mine):
            if queued is entry:
                del mine[i]
                break
        else:
            return False
        group.count -= 1
        self._count -= 1
        if not mine:
            del group.waiting[client]
            group.turns.remove(client)
        if not group.count:
            del self._groups[name]
            self._turns.remove(name)
        return True

    def waiting(self, client: Hashable) -> int:
        """How many requests `client` has waiting."""
        group = self._groups.get(group_of(client))
        mine = group.waiting.get(client) if group is not None else None
        return len(mine) if mine else 0

    def displaceable(self, client: Hashable) -> tuple[Hashable, T] | None:
        """(its client, the request) that may give its place in a full queue to a request of `client`
        (the module docstring), or None: `client` already holds its share."""
        if not self._groups:
            return None
        name = group_of(client)
        own = self._groups.get(name)
        greedy = max(self._groups, key=lambda g: self._groups[g].count)
        if greedy != name and self._groups[greedy].count >= (own.count if own else 0) + 2:
            group = self._groups[greedy]
            worst = group.greediest()
        elif own is not None:  # the greediest group is this client's own (or none holds two more): its clients
            worst = own.greediest()
            if len(own.waiting[worst]) < self.waiting(client) + 2:
                return None
            group = own
        else:
            return None
        return worst, group.waiting[worst][-1]


def _in_turn(queues: Iterable[Iterator]) -> Iterator:
    """Round-robin over iterators: the first of each, then the second of each, ...; an empty one drops out."""
    queues = list(queues)
    while queues:
        alive = []
        for q in queues:
            entry = next(q, _END)
            if entry is not _END:
                yield entry
                alive.append(q)
        queues = alive


_END = object()
