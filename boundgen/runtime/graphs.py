"""CUDA graphs per shape bucket for the program.

Small models at our sizes are launch-bound: a request is hundreds of short kernels. A graph
per input shape, captured on first use and replayed afterwards, removes the launch cost.
Inputs are views into a request context's preallocated device buffers, so their addresses are
stable per context; graphs are cached per (context buffers, shapes), share one memory pool per
context (a context runs one request at a time), and their outputs stay valid until the
context's next request, after the CPU has copied them. A constrained beam program's trie inputs
are the context's trie buffers too, of one fixed length M_cap (runtime/context.py `hold_trie`):
a request's catalogue and allow-list are copied into them before the replay, so one graph per
shape serves every catalogue that fits, replaced or not, and every allow-list.

Requests have a different token count each time; `pad_batch` rounds the packed batch up to a
token bucket, so a bounded set of graphs covers every request, and the engine captures them all
at warm-up (`warm_batches`; a constrained program: when its first catalogue is set, which
serving does before warm-up), never while serving:
- score: tokens to a multiple of the bucket in one filler sequence, then empty sequences up to
  max_samples + 1 (one shape per bucket; the filler costs its tokens and one score row);
- beam: tokens to a multiple of the bucket as a tail after the last prompt, of no request
  (cu_seqlens ends before it), and the request count as it is (one graph per (tokens, R) for
  R = 1 .. max_requests). A filler *request* would cost W beams of decoding, as much as a real
  one (docs/benchmarks.md, 2026-11-29); tail tokens cost one prompt pass over a few tokens.
Padding never changes real results: attention is block-diagonal per sequence (tail tokens are
their own causal segment in the reference and are never attended by a real row), beams are
selected per request, and padded rows come last and are dropped.
"""

from __future__ import annotations

import threading

import torch


def bucket_size(num_tokens: int, bucket: int, max_tokens: int) -> int:
    """Smallest multiple of `bucket` >= num_tokens, capped at max_tokens."""
    return min(-(-num_tokens // bucket) * bucket, max_tokens)


def pad_batch(tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, padded_tokens: int,
              padded_samples: int):
    """Append `padded_tokens - T` tokens, then empty sequences up to `padded_samples` sequences.
    With padded_samples > B the new tokens are a filler sequence (score); with padded_samples = B
    they are a tail of no sequence (beam). Returns new CPU tensors."""
    n, b = tokens.shape[0], cu_seqlens.shape[0] - 1
    fill = padded_tokens - n
    tokens = torch.cat((tokens, torch.zeros(fill, dtype=tokens.dtype)))
    positions = torch.cat((positions, torch.arange(fill, dtype=positions.dtype)))
    extra = padded_samples - b
    cu = torch.cat((cu_seqlens, torch.full((extra,), padded_tokens, dtype=cu_seqlens.dtype)))
    return tokens, positions, cu


class GraphRunner:
    """Wraps a runner; replays a captured graph for each (context buffers, input shapes) seen."""

    def __init__(self, runner, max_graphs: int = 512):
        self.runner = runner
        self.max_graphs = max_graphs
        self._graphs: dict = {}
        self._pools: dict = {}
        self._capture_lock = threading.Lock()

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, *trie: torch.Tensor):
        """trie: a constrained program's TRIE tensors, the context's buffers (runtime/context.py)."""
        inputs = (tokens, positions, cu_seqlens, *trie)
        if tokens.device.type != "cuda":
            return self.runner(*inputs)
        key = tuple((t.data_ptr(), t.shape[0]) for t in inputs)
        entry = self._graphs.get(key)
        if entry is None:
            if len(self._graphs) >= self.max_graphs:
                return self.runner(*inputs)
            entry = self._capture(key, inputs)
        graph, outputs = entry
        graph.replay()
        return outputs

    def _capture(self, key, inputs):
        stream = torch.cuda.current_stream()
        with self._capture_lock:
            self.runner(*inputs)  # warm-up: lazy initialisation outside the graph
            stream.synchronize()
            pool = self._pools.setdefault(inputs[0].data_ptr(), torch.cuda.graph_pool_handle())  # one a context
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
                outputs = self.runner(*inputs)
            self._graphs[key] = (graph, outputs)
        return graph, outputs

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)
