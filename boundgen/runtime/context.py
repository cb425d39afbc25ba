"""Request contexts: buffers and a stream per in-flight request, all allocated at load.

A context holds host buffers for the packed inputs (pinned when a GPU is used), device
buffers of the same capacity, and its own CUDA stream. The hot path writes the valid prefix
and passes views of logical shape; nothing is allocated per request for the inputs.
"""

from __future__ import annotations

import contextlib

import torch


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

    def stream_scope(self):
        """Context manager making this context's stream current (no-op on CPU)."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)
