"""How long a free request context waits for company after a call (runtime/batcher.py).

After a call of k requests ends, those k clients send their next requests a moment later (a closed
loop, a user's session), and a call of k costs little more than a call of one. So a free context
waits, after a call's end, for as many requests as that call held (and those waiting then), for at
most the company wait; a request that misses it waits for the whole next call instead.

- Fixed (`batch_wait_ms`, the default): the same wait after every call.
- Learned (`batch_wait_learned`): the wait follows how long the company took to come back. After
  each call of k requests, the delays from its end to the next k arrivals are recorded (the
  returning clients, whoever they are: served clients behind one proxy share one peer address);
  the wait is the 90th percentile of the last WINDOW such delays plus MARGIN_S, never less than
  the fixed wait and never more than the last call took (waiting longer than a call never pays: a
  request that misses it waits at most that long) nor MAX_BATCH_WAIT_MS. Unless the delays are
  spread (their 90th percentile over SPREAD times their 10th): then the arrivals come at their own
  pace (an open loop: nobody comes back), waiting for the slowest would only add latency, and the
  fixed wait holds.

Why: served, a client's way back (the answer's encoding, the link and gRPC out, the client, gRPC
and the link in, tokenizing) took 3 ms on one H200 host and 4.6 ms at c=4 on an H100 host
(2026-12-06): with a fixed 5 ms wait the latter's calls held 3.3 of 4 requests and each request
waited 4.9 ms in the queue. A closed loop of four clients against this batcher with a ~10 ms call
(scripts/company_wait.py; docs/benchmarks.md, "H100 hosts (47c233d, 2026-12-06)") shows the cliff:
5 ms back against a fixed 5 ms wait gives calls of 2.64 and a mean of 23.2 ms, a fixed 8 ms wait
3.98 and 17.3 ms, the learned wait 3.82 and 17.8 ms; in an open loop (100-300 requests a second) the
learned wait stays the fixed one (a mean within 0.2 ms of it) where a fixed 8 ms wait costs 1-2 ms.
Off by default until a served A/B on the GPU.

Not thread-safe: the batcher calls it holding its lock.
"""

from __future__ import annotations

from collections import deque

from boundgen.artifact.manifest import MAX_BATCH_WAIT_MS

WINDOW = 64  # delays remembered
MIN_SAMPLES = 8  # before which the fixed wait holds
QUANTILE = 0.9
MARGIN_S = 0.0005
SPREAD = 3.0  # the 90th percentile of the delays over their 10th beyond which they are no company


class CompanyWait:
    def __init__(self, fixed_s: float, learned: bool = False):
        """`fixed_s`: the wait after a call (0: none, unless learned); `learned`: follow the delays (above)."""
        self.fixed_s, self.learned = max(0.0, float(fixed_s)), bool(learned)
        self._delays: deque[float] = deque(maxlen=WINDOW)
        self._ended = float("-inf")  # when the last call ended
        self._took = 0.0  # how long it took
        self._returns = 0  # arrivals still counted as its returning company

    def call_ended(self, now: float, requests: int, took_s: float) -> None:
        """A call of `requests` ended at `now` after `took_s` seconds: the next `requests` arrivals are its company."""
        self._ended, self._took, self._returns = now, max(0.0, took_s), requests

    def arrived(self, now: float) -> None:
        """A request arrived at `now`: recorded as a delay while the last call's company is still coming."""
        if not self.learned or self._returns <= 0:
            return
        self._returns -= 1
        delay = now - self._ended
        if 0.0 <= delay <= MAX_BATCH_WAIT_MS / 1e3:  # later than any wait could be: not company
            self._delays.append(delay)

    def seconds(self) -> float:
        """The wait after the last call's end (0: take the batch at once)."""
        if not self.learned or len(self._delays) < MIN_SAMPLES:
            return self.fixed_s
        ranked = sorted(self._delays)
        high = ranked[min(len(ranked) - 1, int(QUANTILE * len(ranked)))]
        low = ranked[int((1 - QUANTILE) * len(ranked))]
        if low * SPREAD < high:  # not a company coming back together: arrivals at their own pace
            return self.fixed_s
        return max(self.fixed_s, min(high + MARGIN_S, self._took, MAX_BATCH_WAIT_MS / 1e3))
