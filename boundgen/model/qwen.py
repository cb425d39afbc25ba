"""Qwen2 / Qwen3 decoder in packed layout: tokens [T], no padding, no batch dimension.

Two entry points, both plain torch plus `ops`:
- `prefill(tokens, positions, cu_seqlens)`: packed block-diagonal causal pass over B sequences
  of T tokens in all; returns final-normed hidden states [T, H] and, if asked, each layer's K/V.
- `decode(tokens, positions, prefix_kv, suffix_kv, step, cu_seqlens, width)`: one step of R x W
  beams, each over its request's prompt K/V (R prompts packed) and its own suffix K/V; writes
  this step's K/V into suffix slot `step` (a tensor: one traced step serves every step).

Parameter names follow HF's, except that q/k/v and gate/up projections are fused at load
(`qkv_proj`, `gate_up_proj`): one matmul each, as every fast path wants.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from boundgen.model import fp8
from boundgen.model.config import ModelConfig
from boundgen.ops import rope as rope_op
from boundgen.ops import swiglu_down
from boundgen.ops.lowering import REFERENCE, Ops
from boundgen.ops.qk_norm_rope import split_heads


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(cfg.head_dim))
            self.k_norm = nn.Parameter(torch.ones(cfg.head_dim))

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: Ops,
                x_scale: torch.Tensor | None = None):
        """x [T, H] -> q [T, Nq, D], k [T, Nkv, D], v [T, Nkv, D] with qk-norm and RoPE applied.
        With `x_scale` [T, 1], x is already in E4M3 rows (`norm_for`)."""
        cfg = self.cfg
        qkv = apply_linear(self.qkv_proj, x, x_scale)
        q, k, v = split_heads(qkv, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm and ops.qk_norm_rope is not None:  # fused
            q, k = ops.qk_norm_rope(qkv, self.q_norm, self.k_norm, cos, sin, cfg.rms_norm_eps, cfg.num_heads,
                                    cfg.num_kv_heads)
            return q, k, v
        if cfg.qk_norm:
            q = ops.rmsnorm(q, self.q_norm, cfg.rms_norm_eps)
            k = ops.rmsnorm(k, self.k_norm, cfg.rms_norm_eps)
        return ops.rope(q, cos, sin), ops.rope(k, cos, sin), v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: Ops, decoding: bool = False, x_scale: torch.Tensor | None = None):
        """The MLP's output [T, H]; in a decode step with `swiglu_down` lowered, its FP32 split-K
        partial products [S, T, H] instead (ops/swiglu_down.py), which `add_norm` sums. With
        `x_scale`, x is already in E4M3 rows (an FP8 MLP's input, ops/add_rmsnorm_quant.py)."""
        gate_up = apply_linear(self.gate_up_proj, x, x_scale)
        if isinstance(self.down_proj, fp8.FP8Linear):  # its input in E4M3 rows (model/fp8.py)
            if ops.silu_quant is not None:
                return self.down_proj.quantized(*ops.silu_quant(gate_up))
            return self.down_proj(ops.silu_mul(gate_up))
        if decoding and ops.swiglu_down is not None:
            return ops.swiglu_down(gate_up, self.down_proj.weight)
        return self.down_proj(ops.silu_mul(gate_up))


class Layer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.input_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.mlp = MLP(cfg)

    def attn_in(self, h, delta, cos, sin, ops: Ops):
        """The residual stream h plus the previous block's output `delta` (None: nothing to add),
        normalised and projected: returns (h, q, k, v)."""
        h, x, x_scale = norm_for(self.self_attn.qkv_proj, h, delta, self.input_layernorm, self.cfg.rms_norm_eps, ops)
        return (h, *self.self_attn.project(x, cos, sin, ops, x_scale))

    def attend_packed(self, h, delta, cos, sin, cu_seqlens, scale: float, max_seqlen: int | None, ops: Ops):
        """`attn_in` and packed attention in a prefill that keeps no K/V, for a model with a q/k norm
        where `packed_attention_qk` is lowered: the attention normalises and rotates q and k as it
        loads them from the qkv product (ops/packed_attention_qk.py). Returns (h, attention output)."""
        cfg, attn = self.cfg, self.self_attn
        h, x, x_scale = norm_for(attn.qkv_proj, h, delta, self.input_layernorm, cfg.rms_norm_eps, ops)
        return h, ops.packed_attention_qk(apply_linear(attn.qkv_proj, x, x_scale), attn.q_norm, attn.k_norm, cos, sin,
                                          cfg.rms_norm_eps, cu_seqlens, scale, cfg.num_heads, cfg.num_kv_heads,
                                          max_seqlen=max_seqlen)

    def attn_in_step(self, h, delta, cos, sin, suffix_k, suffix_v, step, layer: int, ops: Ops):
        """`attn_in` for a beam decode step, which also writes this step's k and v into slot
        `step` of this layer's suffix K/V (suffix_k/v: every layer's, written in place): returns
        (h, q). One kernel from the qkv GEMM to the attention where lowered so
        (ops/rope_kv_write.py; not with a q/k norm)."""
        cfg = self.cfg
        if ops.rope_kv_write is None or cfg.qk_norm:
            h, q, k, v = self.attn_in(h, delta, cos, sin, ops)
            suffix_k[layer].index_copy_(1, step, k[:, None])
            suffix_v[layer].index_copy_(1, step, v[:, None])
            return h, q
        qkv_proj = self.self_attn.qkv_proj
        h, x, x_scale = norm_for(qkv_proj, h, delta, self.input_layernorm, cfg.rms_norm_eps, ops)
        return h, ops.rope_kv_write(apply_linear(qkv_proj, x, x_scale), cos, sin, suffix_k, suffix_v, step, layer,
                                    cfg.num_heads, cfg.num_kv_heads)

    def attend_step(self, h, delta, cos, sin, prefix_k, prefix_v, suffix_k, suffix_v, step, cu_seqlens, layer: int,
                    width: int, scale: float, ops: Ops):
        """`attn_in_step` and the prefix attention in one kernel, where `decode_attention` is lowered
        (ops/decode_attention.py; not with a q/k norm): returns (h, attention output)."""
        cfg, qkv_proj = self.cfg, self.self_attn.qkv_proj
        h, x, x_scale = norm_for(qkv_proj, h, delta, self.input_layernorm, cfg.rms_norm_eps, ops)
        return h, ops.decode_attention(apply_linear(qkv_proj, x, x_scale), cos, sin, prefix_k, prefix_v, suffix_k,
                                       suffix_v, step, cu_seqlens, layer, width, scale, cfg.num_heads,
                                       cfg.num_kv_heads)

    def attn_out(self, h, attn, ops: Ops, decoding: bool = False):
        """The attention's output projection added to h, then the MLP: returns (h, the MLP's
        output, not yet added: the next norm adds it)."""
        delta = self.self_attn.o_proj(attn.reshape(attn.shape[0], -1))  # FP8: quantized by rows in the call
        h, x, x_scale = norm_for(self.mlp.gate_up_proj, h, delta, self.post_attention_layernorm,
                                 self.cfg.rms_norm_eps, ops)
        return h, self.mlp(x, ops, decoding, x_scale)


def add_norm(h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float, ops: Ops):
    """(h + delta, rmsnorm of it): the residual add and the norm after it, fused where lowered so
    (ops/add_rmsnorm.py), else the add and `ops.rmsnorm`, as HF computes them. delta may be
    split-K partial products [S, T, H] (ops/swiglu_down.py): summed first."""
    if delta is None:
        return h, ops.rmsnorm(h, weight, eps)
    if ops.add_rmsnorm is not None:
        return ops.add_rmsnorm(h, delta, weight, eps)
    h = h + (swiglu_down.total(delta, h.dtype) if delta.dim() == 3 else delta)
    return h, ops.rmsnorm(h, weight, eps)


def norm_for(linear: nn.Module, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float,
             ops: Ops):
    """`add_norm` for the input of `linear`: (h, x, x_scale). Where `linear` is FP8 (model/fp8.py)
    and its input's quantization is fused into the norm (ops/add_rmsnorm_quant.py), x is in E4M3
    rows with their FP32 scales x_scale [T, 1]; else x is the norm's output and x_scale None."""
    if ops.add_rmsnorm_quant is not None and isinstance(linear, fp8.FP8Linear):
        return ops.add_rmsnorm_quant(h, delta, weight, eps)
    return (*add_norm(h, delta, weight, eps, ops), None)


def apply_linear(linear: nn.Module, x: torch.Tensor, x_scale: torch.Tensor | None) -> torch.Tensor:
    """linear(x), or with `x_scale` the FP8 product of x already in E4M3 rows (`norm_for`)."""
    return linear(x) if x_scale is None else linear.quantized(x, x_scale)


class QwenModel(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops | None = None):
        super().__init__()
        self.cfg = cfg
        self.ops = ops or REFERENCE.resolve()
        self.scale = cfg.head_dim ** -0.5
        self.embed_tokens = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Parameter(torch.zeros(cfg.vocab_size, cfg.hidden_size))
        self.register_buffer("inv_freq", rope_op.inv_freq(cfg.head_dim, cfg.rope_theta), persistent=False)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """[V, H] rows of the LM head (the embedding when tied)."""
        return self.embed_tokens if self.cfg.tie_word_embeddings else self.lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    def _embed(self, tokens, positions):
        h = F.embedding(tokens, self.embed_tokens)
        cos, sin = self.ops.cos_sin(positions, self.inv_freq, h.dtype)
        return h, cos, sin

    def prefill(self, tokens: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor,
                keep_kv: bool = False, max_seqlen: int | None = None):
        """tokens/positions [T], cu_seqlens [B+1] int32 -> (hidden [T, H], kv or None).

        kv, when kept, is (k, v) each [n_layers, T, Nkv, D]. max_seqlen: the caller's bound on a
        real sequence's tokens, for the attention lowerings that size their grid by it
        (ops/packed_attention.py); None: no bound. With `packed_attention_qk` lowered, a model with a
        q/k norm that keeps no K/V attends with the fused kernel (`Layer.attend_packed`).
        """
        ops = self.ops
        h, cos, sin = self._embed(tokens, positions)
        ks, vs, delta = [], [], None
        # q/k norm, RoPE and attention in one kernel where lowered so (no rotated k to keep)
        fused = ops.packed_attention_qk is not None and self.cfg.qk_norm and not keep_kv
        for layer in self.layers:
            if fused:
                h, attn = layer.attend_packed(h, delta, cos, sin, cu_seqlens, self.scale, max_seqlen, ops)
            else:
                h, q, k, v = layer.attn_in(h, delta, cos, sin, ops)
                if keep_kv:
                    ks.append(k)
                    vs.append(v)
                attn = ops.packed_attention(q, k, v, cu_seqlens, self.scale, max_seqlen=max_seqlen)
            h, delta = layer.attn_out(h, attn, ops)
        _, h = add_norm(h, delta, self.norm, self.cfg.rms_norm_eps, ops)
        return h, ((torch.stack(ks), torch.stack(vs)) if keep_kv else None)

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, prefix_k: torch.Tensor,
               prefix_v: torch.Tensor, suffix_k: torch.Tensor, suffix_v: torch.Tensor, step: torch.Tensor,
               cu_seqlens: torch.Tensor | None = None, width: int | None = None):
        """One beam step of R requests of `width` (W) beams each. tokens/positions [R*W], request
        by request; prefix_k/v [n_layers, T, Nkv, D], the R prompts packed as `cu_seqlens`
        [R+1] int32 says (None: one request owning all T rows, W = R*W); suffix_k/v
        [n_layers, R*W, S, Nkv, D]; step [1] int64 < S: this step's K/V are written in place
        into slot `step`, slots [0, step] attended, later slots ignored whatever they hold.
        Returns final-normed hidden [R*W, H]."""
        ops = self.ops
        if cu_seqlens is None:
            cu_seqlens = torch.tensor([0, prefix_k.shape[1]], dtype=torch.int32, device=tokens.device)
            width = tokens.shape[0]
        h, cos, sin = self._embed(tokens, positions)
        delta = None
        fused = ops.decode_attention is not None and not self.cfg.qk_norm  # RoPE, K/V write, attention: one kernel
        for i, layer in enumerate(self.layers):
            if fused:
                h, attn = layer.attend_step(h, delta, cos, sin, prefix_k[i], prefix_v[i], suffix_k, suffix_v, step,
                                            cu_seqlens, i, width, self.scale, ops)
            else:
                h, q = layer.attn_in_step(h, delta, cos, sin, suffix_k, suffix_v, step, i, ops)
                attn = ops.prefix_attention(q, prefix_k[i], prefix_v[i], suffix_k[i], suffix_v[i], step, cu_seqlens,
                                            width, self.scale)
            h, delta = layer.attn_out(h, attn, ops, decoding=True)
        return add_norm(h, delta, self.norm, self.cfg.rms_norm_eps, ops)[1]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, H] -> logits [M, V] in the model dtype (as HF computes them)."""
        return F.linear(hidden, self.lm_head_weight)
