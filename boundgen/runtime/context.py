"""Request contexts: buffers and a stream per in-flight request, all allocated at load.

A context holds host buffers for the packed inputs (pinned when a GPU is used), device
buffers of the same capacity, and its own CUDA stream. The hot path writes the valid prefix
and passes views of logical shape; nothing is allocated per request for the inputs.

A constrained beam program served with CUDA graphs also reads the trie from the context
(`hold_trie`): device buffers of one fixed length M_cap (artifact/tensors.py TRIE), the four
catalogue arrays [M_cap] and reach, ends [R_cap, M_cap] (a row per request a call may hold), so
that the graphs captured on the context replay with the same addresses and shapes for every
catalogue and allow-list. `stage_trie` copies a call's tries in, on the context's stream,
before the call (its requests share one catalogue: the engine's rule):
- the catalogue's four arrays (row_ptr, child_token, edge_keys, node_item) only when the
  context holds another catalogue's (a catalogue was replaced; M x 32 bytes, once per context);
- request r's reach and ends into row r, only when they are not the pair that row holds (the
  catalogue's own, or a subset's, is copied once a row); a request with an allow-list has its
  list derived into its row instead (runtime/catalogue.py `derive_rows`), copied from nowhere.
Past a catalogue's M the buffers hold the padding of text/catalogue_search.py (nodes without
children or items, edges keyed above every real key), which leaves the search unchanged
(tests/runtime/test_trie_buffers.py). What the context holds is known by weak references to
the tensors it copied: a tensor still alive is the same, unchanged (nothing writes a served
catalogue's tensors), and one freed can no longer be the request's.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Sequence

import torch

from boundgen.artifact.tensors import FILTERS, TRIE, Trie
from boundgen.text.catalogue_search import PADDING

CATALOGUE_ARRAYS = tuple(name for name in TRIE if name not in FILTERS)  # a catalogue's own


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
        self.trie: Trie | None = None  # the trie buffers (hold_trie); None: tries passed as given
        self._held: dict[str, weakref.ref | None] = {}  # catalogue array name -> the tensor last copied in
        self._rows: list[tuple[weakref.ref, weakref.ref] | None] = []  # per row: the reach, ends copied in

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

    def hold_trie(self, length: int, rows: int) -> None:
        """Allocate the trie buffers, `length` (M_cap) entries each, reach and ends on `rows` (R_cap)
        rows, holding an empty trie (padding only: the root has no children) until `stage_trie`
        copies one in."""
        def full(name, value):
            shape = (rows, length) if name in FILTERS else (length,)
            return torch.full(shape, value, dtype=torch.bool if name in FILTERS else torch.int64, device=self.device)

        with self.stream_scope():  # filled on the stream that copies into them next
            self.trie = Trie(row_ptr=full("row_ptr", 0), **{name: full(name, PADDING[name]) for name in TRIE[1:]})
        self._held = dict.fromkeys(CATALOGUE_ARRAYS)
        self._rows = [None] * rows

    def stage_trie(self, tries: Sequence[Trie], derived: Sequence[int] = ()) -> Trie:
        """Copy a call's tries (one a request, in call order; one catalogue, tensors of one length
        M <= M_cap on this device, reach and ends [M]) into the buffers where they hold other
        tensors (module docstring); returns the buffers, reach and ends cut to the call's rows.
        derived: rows the caller writes itself (a request's allow-list, derived into its row:
        runtime/catalogue.py `derive_rows`), not copied, and held by nothing after."""
        buffers, m, rows = self.trie, tries[0].row_ptr.shape[0], len(tries)
        if m > buffers.row_ptr.shape[0]:
            raise ValueError(f"a trie of {m} entries does not fit this context's buffers of {buffers.row_ptr.shape[0]}")
        if rows > len(self._rows):
            raise ValueError(f"a call of {rows} requests does not fit this context's {len(self._rows)} trie rows")
        with self.stream_scope():
            trie = tries[0]
            if not all(self._holds(name, getattr(trie, name)) for name in CATALOGUE_ARRAYS):
                rest = buffers.row_ptr.shape[0] - m
                buffers.row_ptr[m:].copy_(trie.row_ptr[m - 1:].expand(rest))  # the last offset: no children
                for name in TRIE[1:]:
                    getattr(buffers, name)[..., m:].fill_(PADDING[name])
                for name in CATALOGUE_ARRAYS:
                    self._copy(name, getattr(buffers, name)[:m], getattr(trie, name))
                    self._held[name] = weakref.ref(getattr(trie, name))
                self._rows = [None] * len(self._rows)  # every row takes the new catalogue's reach and ends
            for row in derived:
                self._rows[row] = None
            for row, trie in enumerate(tries):
                if row in derived:
                    continue
                held = self._rows[row]
                if held is None or held[0]() is not trie.reach or held[1]() is not trie.ends:
                    for name in FILTERS:
                        self._copy(name, getattr(buffers, name)[row, :m], getattr(trie, name))
                    self._rows[row] = (weakref.ref(trie.reach), weakref.ref(trie.ends))
        return buffers._replace(reach=buffers.reach[:rows], ends=buffers.ends[:rows])

    def _holds(self, name: str, tensor: torch.Tensor) -> bool:
        held = self._held[name]
        return held is not None and held() is tensor

    @staticmethod
    def _copy(name: str, buffer: torch.Tensor, tensor: torch.Tensor) -> None:
        """One array into (part of) its buffer, on the current stream (name: which, for tests)."""
        buffer.copy_(tensor, non_blocking=True)

    def stream_scope(self):
        """Context manager making this context's stream current (no-op on CPU)."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)
