"""Request contexts: buffers and a stream per in-flight request, all allocated at load.

A context holds host buffers for the packed inputs (pinned when a GPU is used), device
buffers of the same capacity, and its own CUDA stream. The hot path writes the valid prefix
and passes views of logical shape; nothing is allocated per request for the inputs.

A constrained beam program served with CUDA graphs also reads the trie from the context
(`hold_trie`): six device buffers of one fixed length M_cap (artifact/tensors.py TRIE), so that
the graphs captured on the context replay with the same addresses and shapes for every
catalogue and allow-list. `stage_trie` copies a request's trie in, on the context's stream,
before its call:
- the catalogue's four arrays (row_ptr, child_token, edge_keys, node_item) only when the
  context holds another catalogue's (a catalogue was replaced; M x 32 bytes, once per context);
- reach and ends only when they are not the pair the context holds (the catalogue's own is
  copied once; each request with an allow-list brings its own: M x 2 bytes).
Past a catalogue's M the buffers hold the padding of text/catalogue_search.py (nodes without
children or items, edges keyed above every real key), which leaves the search unchanged
(tests/runtime/test_trie_buffers.py). What the context holds is known by weak references to
the tensors it copied: a tensor still alive is the same, unchanged (nothing writes a served
catalogue's tensors), and one freed can no longer be the request's.
"""

from __future__ import annotations

import contextlib
import weakref

import torch

from boundgen.artifact.tensors import TRIE, Trie
from boundgen.text.catalogue_search import PADDING

CATALOGUE_ARRAYS = TRIE[:4]  # a catalogue's own; reach and ends carry a request's allow-list


class RequestContext:
    def __init__(self, max_total_tokens: int, max_samples: int, device: torch.device):
        pin = device.type == "cuda"
        self.device = device
        self.host = {
            "tokens": torch.empty(max_total_tokens, dtype=torch.int64, pin_memory=pin),
            "positions": torch.empty(max_total_tokens, dtype=torch.int64, pin_memory=pin),
            # +2: room for the filler sequence that bucketed padding adds (runtime/graphs.py)
            "cu_seqlens": torch.empty(max_samples + 2, dtype=torch.int32, pin_memory=pin),
        }
        if device.type == "cuda":
            self.dev = {k: torch.empty_like(v, device=device) for k, v in self.host.items()}
            self.stream = torch.cuda.Stream(device=device)
        else:
            self.dev = self.host
            self.stream = None
        self.trie: Trie | None = None  # the trie buffers, [M_cap] each (hold_trie); None: tries passed as given
        self._held: dict[str, weakref.ref | None] = {}  # TRIE name -> the tensor last copied into its buffer

    def stage(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor):
        """Write a packed batch into this context's buffers; return device views of logical shape."""
        n, b = tokens.shape[0], cu_seqlens.shape[0]
        self.host["tokens"][:n].copy_(tokens)
        self.host["positions"][:n].copy_(positions)
        self.host["cu_seqlens"][:b].copy_(cu_seqlens)
        if self.stream is None:
            return self.host["tokens"][:n], self.host["positions"][:n], self.host["cu_seqlens"][:b]
        with torch.cuda.stream(self.stream):
            for key, m in (("tokens", n), ("positions", n), ("cu_seqlens", b)):
                self.dev[key][:m].copy_(self.host[key][:m], non_blocking=True)
        return self.dev["tokens"][:n], self.dev["positions"][:n], self.dev["cu_seqlens"][:b]

    def hold_trie(self, length: int) -> None:
        """Allocate the trie buffers, `length` (M_cap) entries each, holding an empty trie (padding
        only: the root has no children) until `stage_trie` copies one in."""
        def full(value, dtype):
            return torch.full((length,), value, dtype=dtype, device=self.device)

        with self.stream_scope():  # filled on the stream that copies into them next
            self.trie = Trie(row_ptr=full(0, torch.int64),
                             **{name: full(PADDING[name], torch.bool if name in ("reach", "ends") else torch.int64)
                                for name in TRIE[1:]})
        self._held = dict.fromkeys(TRIE)

    def stage_trie(self, trie: Trie) -> Trie:
        """Copy a request's trie (tensors of one length M <= M_cap, on this device) into the buffers
        where they hold other tensors (module docstring); returns the buffers, to pass to the program."""
        buffers, m = self.trie, trie.row_ptr.shape[0]
        if m > buffers.row_ptr.shape[0]:
            raise ValueError(f"a trie of {m} entries does not fit this context's buffers of {buffers.row_ptr.shape[0]}")
        with self.stream_scope():
            if not all(self._holds(name, getattr(trie, name)) for name in CATALOGUE_ARRAYS):
                rest = buffers.row_ptr.shape[0] - m
                buffers.row_ptr[m:].copy_(trie.row_ptr[m - 1:].expand(rest))  # the last offset: no children
                for name in TRIE[1:]:
                    getattr(buffers, name)[m:].fill_(PADDING[name])
                self._copy(buffers, trie, CATALOGUE_ARRAYS, m)
                self._held.update(reach=None, ends=None)  # the new catalogue's reach and ends too
            if not (self._holds("reach", trie.reach) and self._holds("ends", trie.ends)):
                self._copy(buffers, trie, ("reach", "ends"), m)
        return buffers

    def _holds(self, name: str, tensor: torch.Tensor) -> bool:
        held = self._held[name]
        return held is not None and held() is tensor

    def _copy(self, buffers: Trie, trie: Trie, names, m: int) -> None:
        for name in names:
            getattr(buffers, name)[:m].copy_(getattr(trie, name), non_blocking=True)
            self._held[name] = weakref.ref(getattr(trie, name))

    def stream_scope(self):
        """Context manager making this context's stream current (no-op on CPU)."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)
