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

When a bounded queue is full, `displaceable(client)` names the request that may give its place
to `client`'s: the newest of the client with the most waiting, if that client holds at least two
more than `client` (so two greedy clients do not take each other's places in turn). The caller
refuses it (429: the queue was full) and queues the newcomer: a greedy client's surplus is refused,
not an honest client's first request.

Not thread-safe: its owner holds its own lock (the batcher) or uses it on one thread (admission).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, Hashable, Iterator, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self):
        self._waiting: dict[Hashable, deque[T]] = {}  # client -> its requests, oldest first
        self._turns: deque[Hashable] = deque()  # clients with requests waiting, next to be served first
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[T]:
        """Every waiting request in the order `popleft` would take them."""
        queues = [iter(self._waiting[c]) for c in self._turns]
        while queues:
            alive = []
            for q in queues:
                entry = next(q, _END)
                if entry is not _END:
                    yield entry
                    alive.append(q)
            queues = alive

    def append(self, client: Hashable, entry: T) -> None:
        mine = self._waiting.get(client)
        if mine is None:
            mine = self._waiting[client] = deque()
            self._turns.append(client)
        mine.append(entry)
        self._count += 1

    def peek(self) -> T:
        """The request `popleft` would take next (IndexError if none waits)."""
        if not self._turns:
            raise IndexError("peek at an empty FairQueue")
        return self._waiting[self._turns[0]][0]

    def popleft(self) -> T:
        """The oldest request of the client whose turn it is; that client goes to the end of the turns."""
        if not self._turns:
            raise IndexError("pop from an empty FairQueue")
        client = self._turns.popleft()
        mine = self._waiting[client]
        entry = mine.popleft()
        if mine:
            self._turns.append(client)
        else:
            del self._waiting[client]
        self._count -= 1
        return entry

    def remove(self, client: Hashable, entry: T) -> bool:
        """Take `entry` (queued by `client`) out; False if it is not waiting."""
        mine = self._waiting.get(client)
        if mine is None:
            return False
        for i, queued in enumerate(mine):
            if queued is entry:
                del mine[i]
                break
        else:
            return False
        self._count -= 1
        if not mine:
            del self._waiting[client]
            self._turns.remove(client)
        return True

    def waiting(self, client: Hashable) -> int:
        """How many requests `client` has waiting."""
        mine = self._waiting.get(client)
        return len(mine) if mine else 0

    def displaceable(self, client: Hashable) -> tuple[Hashable, T] | None:
        """(its client, the request) that may give its place in a full queue to a request of `client`
        (the module docstring), or None: `client` already holds its share."""
        if not self._waiting:
            return None
        greedy = max(self._waiting, key=lambda c: len(self._waiting[c]))
        if len(self._waiting[greedy]) < self.waiting(client) + 2:
            return None
        return greedy, self._waiting[greedy][-1]


_END = object()
