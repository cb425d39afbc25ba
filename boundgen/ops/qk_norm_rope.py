"""Qwen3's per-head q/k RMSNorm followed by RoPE, in one kernel.

    qkv [T, (Nq + 2 Nkv) D] (the fused projection's output), q_weight [D], k_weight [D],
    cos / sin [T, D], eps, num_q_heads, num_kv_heads
    -> q [T, Nq, D], k [T, Nkv, D] (contiguous)
    q = rope(rmsnorm(qkv's q heads, q_weight, eps), cos, sin), k likewise (ops/rmsnorm.py,
    ops/rope.py: `reference` below is exactly that composition)

Why: as separate ops the model launches two norms and two RoPEs a layer (the W1 artifact with
Triton norms and RoPE, 2026-12-01: 4 x 10.3 + 2 x 10.6 us a layer, plus copies), and Inductor's
own fusion of the pair ran at ~0.7 TB/s (40 + 16 us). Here each (token, head) row of q and k is
read once from qkv and written once, normalised and rotated in registers.

Lowerings: "separate" (the default: no fused op, the model applies `rmsnorm` then `rope` as they
are lowered) and "triton" (this kernel; the registered op runs `reference` on CPU).

Triton kernel: one program per BLOCK_T tokens; their q heads, then their k heads, in blocks of
GROUP heads (the largest power of two dividing both counts: Qwen3-0.6B's 16 / 8 make three blocks
of 8), each block [BLOCK_T, GROUP, D/2] per half row. Every block has one shape and layout, so the
tokens' cos / sin and both weights are loaded once a program for all of them, no head is padded,
and no layout is converted. Per row of D:
    rstd = 1 / sqrt_rn(sum(x^2) * (1 / D) + eps)    (1 / D exact: D a power of two)
    n = rnd(w * rnd(x * rstd)),   y1 = rnd(n1 cos1) - rnd(n2 sin1),   y2 = rnd(n2 cos2) + rnd(n1 sin2)
stored rounded to the dtype, rnd being the dtype's rounding kept in FP32: the references' roundings
step by step (ops/rmsnorm.py, ops/rope.py), only the FP32 sum of squares in another order (which
can move rstd by an FP32 ulp and a bf16 value by one). rnd is Veltkamp's split (ops/rounding.py
`rounded_fp`: three FP32 operations, which no compiler fold can remove): the kernel had been bound
by its roundings' instruction issue, 20 integer operations an element at half the FP32 rate
(sm_90 SASS with the launch's alignment hints: 1,168 instructions a one-token program at 28a37ab,
888 now; 29.5 an element at two tokens).
Bytes moved: q and k heads read once from qkv and written once (T (Nq + Nkv) D each), cos / sin
once a token (2 T D), the weights once a program (from L2): 2 x 6 KB + 512 B a W1 token in bf16.
Block sizes (default_config): 2 tokens a program for Qwen3-0.6B, 1,024 elements a half-row block,
8 a thread at 4 warps (one 16-byte load a half row), 94 registers; fixed from the shapes, timed
against the others by `bench.kernels --memory-bound --sweep`.
"""

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import rmsnorm, rope
from boundgen.ops.rounding import round_to, rounded_fp  # by name: Inductor copies a kernel's helpers by name


def split_heads(qkv: torch.Tensor, num_q_heads: int, num_kv_heads: int, head_dim: int):
    """qkv [T, (Nq + 2 Nkv) D] -> views q [T, Nq, D], k [T, Nkv, D], v [T, Nkv, D]."""
    q, k, v = qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    return (q.reshape(-1, num_q_heads, head_dim), k.reshape(-1, num_kv_heads, head_dim),
            v.reshape(-1, num_kv_heads, head_dim))


def reference(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor, eps: float, num_q_heads: int, num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, _ = split_heads(qkv, num_q_heads, num_kv_heads, q_weight.shape[0])
    return (rope.reference(rmsnorm.reference(q, q_weight, eps), cos, sin),
            rope.reference(rmsnorm.reference(k, k_weight, eps), cos, sin))


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def norm_rope_halves(x1, x2, w1, w2, cos1, cos2, sin1, sin2, eps, dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """Rows' halves x1, x2 [..., D/2] (FP32 values of `dtype`) RMS-normalised over the last axis and
    rotated -> (y1, y2) in `dtype`: the module docstring's rounding sequence. This kernel's and the
    fused attention's (ops/packed_attention_qk.py) one q/k norm + RoPE, so that both round alike."""
    # RMSNorm of each row, as ops/rmsnorm.py rounds (1 / D: a power of two, exact).
    mean_sq = tl.sum(x1 * x1 + x2 * x2, axis=-1) * (1.0 / (2 * x1.shape[-1]))  # [...]
    var = mean_sq + tl.full(mean_sq.shape, eps, tl.float32)  # eps made FP32 first (an fp64 in AOTI builds)
    rstd = tl.expand_dims(tl.div_rn(tl.full(mean_sq.shape, 1.0, tl.float32), tl.sqrt_rn(var)), -1)
    n1 = rounded_fp(w1 * rounded_fp(x1 * rstd, dtype), dtype)
    n2 = rounded_fp(w2 * rounded_fp(x2 * rstd, dtype), dtype)
    # RoPE (rotate-half), as ops/rope.py rounds: each product, then their sum (the final cast).
    y1 = rounded_fp(n1 * cos1, dtype) - rounded_fp(n2 * sin1, dtype)
    y2 = rounded_fp(n2 * cos2, dtype) + rounded_fp(n1 * sin2, dtype)
    return round_to(y1, dtype, SOFT_BF16), round_to(y2, dtype, SOFT_BF16)  # SOFT_BF16: the interpreter's cast truncates


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, eps, num_tokens,
                         stride_qkv, stride_cos, stride_sin, NUM_Q: tl.constexpr, NUM_KV: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_T: tl.constexpr, GROUP: tl.constexpr,
                         SOFT_BF16: tl.constexpr):
    # BLOCK_T tokens; their q then k heads in blocks of GROUP heads ([BLOCK_T, GROUP, HALF] per half
    # row), GROUP dividing both head counts: every block has one shape and layout, no padded head,
    # and the tokens' cos / sin and both weights are loaded once for all of them.
    dtype = qkv_ptr.dtype.element_ty
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    t_ok = (tokens < num_tokens)[:, None, None]  # [T, 1, 1]
    heads = tl.arange(0, GROUP)[None, :, None]
    offs = tl.arange(0, HALF)[None, None, :]
    # cos / sin in the blocks' own shape (each head's copy from L1): no layout conversion.
    cos_at = cos_ptr + tokens[:, None, None] * stride_cos + heads * 0 + offs
    sin_at = sin_ptr + tokens[:, None, None] * stride_sin + heads * 0 + offs
    cos1 = tl.load(cos_at, mask=t_ok, other=0.0).to(tl.float32)  # [T, GROUP, D/2]
    cos2 = tl.load(cos_at + HALF, mask=t_ok, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_at, mask=t_ok, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_at + HALF, mask=t_ok, other=0.0).to(tl.float32)
    wq1 = tl.load(wq_ptr + offs).to(tl.float32)  # [1, 1, D/2]
    wq2 = tl.load(wq_ptr + HALF + offs).to(tl.float32)
    wk1 = tl.load(wk_ptr + offs).to(tl.float32)
    wk2 = tl.load(wk_ptr + HALF + offs).to(tl.float32)
    x_row = qkv_ptr + tokens[:, None, None] * stride_qkv + offs
    for g in tl.static_range((NUM_Q + NUM_KV) // GROUP):
        if g * GROUP < NUM_Q:  # a block of q heads
            w1, w2 = wq1, wq2
            out_at = q_ptr + (tokens[:, None, None] * NUM_Q + g * GROUP + heads) * (2 * HALF) + offs
        else:
            w1, w2 = wk1, wk2
            out_at = k_ptr + (tokens[:, None, None] * NUM_KV + g * GROUP - NUM_Q + heads) * (2 * HALF) + offs
        x_at = x_row + (g * GROUP + heads) * (2 * HALF)
        x1 = tl.load(x_at, mask=t_ok, other=0.0).to(tl.float32)  # [T, GROUP, D/2]
        x2 = tl.load(x_at + HALF, mask=t_ok, other=0.0).to(tl.float32)
        y1, y2 = norm_rope_halves(x1, x2, w1, w2, cos1, cos2, sin1, sin2, eps, dtype, SOFT_BF16)
        tl.store(out_at, y1, mask=t_ok)
        tl.store(out_at + HALF, y2, mask=t_ok)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_inputs(qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads, op: str = "qk_norm_rope",
                 min_head_dim: int = 2) -> None:
    """ValueError naming `op` unless qkv [T, (Nq + 2 Nkv) D], the weights [D] and cos / sin [T, D] fit
    (D a power of two >= `min_head_dim`), share one dtype and device, and have contiguous last dims
    (this op's and ops/packed_attention_qk.py's inputs)."""
    head_dim = q_weight.shape[0] if q_weight.dim() == 1 else -1
    if qkv.dim() != 2 or head_dim < max(2, min_head_dim) or head_dim & (head_dim - 1) \
            or qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"{op}: expected qkv [T, (Nq + 2 Nkv) D] with D a power of two >= {max(2, min_head_dim)} "
                         f"= the weights' length; got qkv {tuple(qkv.shape)}, q_weight {tuple(q_weight.shape)}, "
                         f"Nq {num_q_heads}, Nkv {num_kv_heads}")
    if tuple(k_weight.shape) != (head_dim,) or tuple(cos.shape) != (qkv.shape[0], head_dim) \
            or tuple(sin.shape) != (qkv.shape[0], head_dim):
        raise ValueError(f"{op}: k_weight must be [{head_dim}] and cos / sin [T, {head_dim}]; got "
                         f"k_weight {tuple(k_weight.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
    tensors = (qkv, q_weight, k_weight, cos, sin)
    if qkv.dtype not in SUPPORTED_DTYPES or any(t.dtype != qkv.dtype for t in tensors):
        raise ValueError(f"{op}: qkv, the weights and cos / sin must share one dtype of bfloat16, float16, "
                         f"float32; got {[t.dtype for t in tensors]}")
    if any(t.stride(-1) != 1 for t in tensors):
        raise ValueError(f"{op}: the last dim of qkv, the weights and cos / sin must be contiguous (stride 1); got "
                         f"strides {[t.stride() for t in tensors]}")
    if len({t.device for t in tensors}) != 1:
        raise ValueError(f"{op}: all inputs must be on one device; got {[str(t.device) for t in tensors]}")


def head_group(num_q_heads: int, num_kv_heads: int) -> int:
    """Heads a block: the largest power of two dividing both counts (Qwen3-0.6B's 16 / 8: 8)."""
    both = math.gcd(num_q_heads, num_kv_heads)
    return both & -both


def default_config(num_q_heads: int, num_kv_heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_T, num_warps): tokens for ~1K elements a half-row block (Qwen3-0.6B: 2 tokens of
    8 heads x 64, 8 a thread at 4 warps: one 16-byte load a half row), at most 256 tokens.
    Fixed, not autotuned: deterministic builds."""
    per_token = head_group(num_q_heads, num_kv_heads) * (head_dim // 2)
    return max(1, min(256, 1024 // per_token)), 4


def launch(qkv, q_weight, k_weight, cos, sin, eps: float, num_q_heads: int, num_kv_heads: int,
           block_t: int | None = None, num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernel; same signature and result as `reference` (ties of the sum order
    aside). The launch config is overridable for tests and benchmarks."""
    check_inputs(qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads)
    num_tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    default_t, default_warps = default_config(num_q_heads, num_kv_heads, head_dim)
    block_t, num_warps = block_t or default_t, num_warps or default_warps
    q = torch.empty((num_tokens, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((num_tokens, num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    wrap_triton(_qk_norm_rope_kernel)[(triton.cdiv(num_tokens, block_t),)](
        qkv, q_weight, k_weight, cos, sin, q, k, eps, num_tokens, qkv.stride(0), cos.stride(0), sin.stride(0),
        NUM_Q=num_q_heads, NUM_KV=num_kv_heads, HALF=head_dim // 2, BLOCK_T=block_t,
        GROUP=head_group(num_q_heads, num_kv_heads), SOFT_BF16=qkv.device.type == "cpu", num_warps=num_warps)
    return q, k


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::qk_norm_rope", mutates_args=())
def qk_norm_rope(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, eps: float, num_q_heads: int,
                 num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(qkv, q_weight, k_weight, cos, sin, eps, num_q_heads, num_kv_heads)


qk_norm_rope.register_kernel("cpu")(reference)


@qk_norm_rope.register_fake
def _(qkv, q_weight, k_weight, cos, sin, eps, num_q_heads, num_kv_heads):
    head_dim = q_weight.shape[0]
    return (qkv.new_empty((qkv.shape[0], num_q_heads, head_dim)),
            qkv.new_empty((qkv.shape[0], num_kv_heads, head_dim)))


# Lowerings by name ("separate": no fused op, the model composes rmsnorm and rope as lowered).
IMPLEMENTATIONS = {"separate": None, "triton": qk_norm_rope}
