"""Choice of implementation per replaceable op.

Each op module in `ops/` defines `reference` (the semantics, plain torch) and
`IMPLEMENTATIONS` (lowering name -> callable with the reference's signature; a fused op's default
is None: not fused, the model composes the ops it fuses; trie_mask lowers its in-place form,
`apply_reference`'s signature). An `OpLowering`
names one lowering per op; `resolve()` turns it into the callables the model calls. The build
records the lowering in the artifact's manifest.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, fields
from typing import Callable

from boundgen.errors import ConfigError


@dataclass(frozen=True)
class OpLowering:
    rmsnorm: str = "torch"
    rope: str = "torch"
    cos_sin: str = "torch"
    packed_attention: str = "torch"
    prefix_attention: str = "torch"
    silu_mul: str = "torch"
    vocab_topk: str = "torch"
    trie_mask: str = "torch"  # constrained beam search: a catalogue's mask, in place on the log-probs
    trie_topk: str = "torch"  # a constrained decode step's top K over its allowed tokens ("separate": mask, top K)
    qk_norm_rope: str = "separate"  # no fused op: the model applies rmsnorm, then rope
    add_rmsnorm: str = "separate"  # no fused op: the model adds the residual, then applies rmsnorm
    rope_kv_write: str = "separate"  # no fused op: a decode step applies rope, then writes K/V with index_copy_
    decode_attention: str = "separate"  # no fused op: a decode step runs rope_kv_write, then prefix_attention
    swiglu_down: str = "separate"  # no fused op: a decode step applies silu_mul, then down_proj
    silu_quant: str = "separate"  # no fused op: an FP8 MLP quantizes silu_mul's output
    add_rmsnorm_quant: str = "separate"  # no fused op: an FP8 MLP quantizes the post-attention norm's output
    packed_attention_qk: str = "separate"  # no fused op: a prefill applies qk_norm_rope (or its ops), then attention

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """The ops lowered to other than their default, as "op=impl, ..." ("torch reference" if none)."""
        return describe(self.to_dict())

    @classmethod
    def from_dict(cls, raw: dict | None) -> "OpLowering":
        raw = dict(raw or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ConfigError(f"unknown ops in lowering: {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        return cls(**raw)

    def resolve(self) -> "Ops":
        return Ops(**{f.name: implementation(f.name, getattr(self, f.name)) for f in fields(self)})


@dataclass(frozen=True)
class Ops:
    rmsnorm: Callable
    rope: Callable
    cos_sin: Callable
    packed_attention: Callable
    prefix_attention: Callable
    silu_mul: Callable
    vocab_topk: Callable
    trie_mask: Callable
    trie_topk: Callable | None  # None: not fused
    qk_norm_rope: Callable | None  # None: not fused
    add_rmsnorm: Callable | None  # None: not fused
    rope_kv_write: Callable | None  # None: not fused
    decode_attention: Callable | None  # None: not fused
    swiglu_down: Callable | None  # None: not fused
    silu_quant: Callable | None  # None: not fused
    add_rmsnorm_quant: Callable | None  # None: not fused
    packed_attention_qk: Callable | None  # None: not fused


def describe(lowering: dict) -> str:
    """A manifest's or config's lowering dict -> the ops lowered to other than their default."""
    defaults = OpLowering().to_dict()
    return ", ".join(f"{k}={v}" for k, v in lowering.items() if v != defaults.get(k, "torch")) or "torch reference"


def implementation(op: str, lowering: str) -> Callable:
    module = importlib.import_module(f"boundgen.ops.{op}")
    table = module.IMPLEMENTATIONS
    if lowering not in table:
        raise ConfigError(f"op {op} has no lowering {lowering!r}; available: {', '.join(sorted(table))}")
    return table[lowering]


REFERENCE = OpLowering()
