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

Triton kernel: one program per block of BLOCK_T tokens, the token's q heads, then its k heads,
each group in a block of its own (a row is a (token, head) pair), each row in its two halves.
Rounding is the references' step by step, on the bits (ops/rounding.py `rounded`, SOFT_BF16 on
the GPU too, so that no cast round trip is folded away; intermediates kept in FP32, since the
kernel was bound by its roundings' conversions: 19.3 against 14.6 us at T 2,250 on the H200):
FP32 sum of squares (the two halves' sums added: the order differs from the reference's, which
can move the FP32 rstd by an ulp and a bf16 value by one), rstd = 1 / sqrt_rn(mean + eps),
normed rounded to the dtype, times the weight rounded to the dtype, then RoPE's two products
each rounded and their sum rounded. Bytes: q and k read once, written once; cos / sin once per
token and head group (from L1 the second time); the weights once per program and group.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import rmsnorm, rope
from boundgen.ops.rope import rotate_halves  # by name: Inductor copies a kernel's helpers by name
from boundgen.ops.rounding import rounded


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
def _norm_rope_heads(qkv_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, eps, tokens, t_ok, stride_qkv, stride_cos,
                     stride_sin, FIRST: tl.constexpr, NUM: tl.constexpr, BLOCK: tl.constexpr, HALF: tl.constexpr,
                     SOFT_BF16: tl.constexpr):
    """Heads FIRST .. FIRST + NUM of the tokens' qkv rows (BLOCK: NUM padded to a power of two):
    RMSNorm of each head with weight w, then RoPE, written to out [T, NUM, 2 HALF]."""
    dtype = qkv_ptr.dtype.element_ty
    heads = tl.arange(0, BLOCK)
    offs = tl.arange(0, HALF)
    mask = t_ok[:, None, None] & (heads < NUM)[None, :, None]  # [T, N, 1]
    x_at = (qkv_ptr + tokens[:, None, None] * stride_qkv + (FIRST + heads[None, :, None]) * (2 * HALF)
            + offs[None, None, :])
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)  # [T, N, D/2]
    x2 = tl.load(x_at + HALF, mask=mask, other=0.0).to(tl.float32)

    # RMSNorm over each row (both halves), as ops/rmsnorm.py rounds.
    sum_sq = tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)  # [T, N]
    mean_sq = tl.div_rn(sum_sq, tl.full(sum_sq.shape, 2 * HALF, tl.float32))
    var = mean_sq + tl.full(sum_sq.shape, eps, tl.float32)
    rstd = tl.div_rn(tl.full(sum_sq.shape, 1.0, tl.float32), tl.sqrt_rn(var))[:, :, None]
    w1 = tl.load(w_ptr + offs).to(tl.float32)[None, None, :]
    w2 = tl.load(w_ptr + HALF + offs).to(tl.float32)[None, None, :]
    n1 = rounded(w1 * rounded(x1 * rstd, dtype, SOFT_BF16), dtype, SOFT_BF16)
    n2 = rounded(w2 * rounded(x2 * rstd, dtype, SOFT_BF16), dtype, SOFT_BF16)

    # RoPE (rotate-half), as ops/rope.py rounds.
    y1, y2 = rotate_halves(n1, n2, cos_ptr, sin_ptr, tokens, stride_cos, stride_sin, t_ok, HALF, HALF, dtype,
                           SOFT_BF16)
    out_at = out_ptr + (tokens[:, None, None] * NUM + heads[None, :, None]) * (2 * HALF) + offs[None, None, :]
    tl.store(out_at, y1, mask=mask)
    tl.store(out_at + HALF, y2, mask=mask)


@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, eps, num_tokens,
                         stride_qkv, stride_cos, stride_sin, NUM_Q: tl.constexpr, NUM_KV: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
                         SOFT_BF16: tl.constexpr):
    # q heads and k heads each in a block of their own: no padded head is computed where the
    # counts are powers of two (Qwen3-0.6B: 16 and 8, where one block of 24 was padded to 32).
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    t_ok = tokens < num_tokens
    _norm_rope_heads(qkv_ptr, wq_ptr, cos_ptr, sin_ptr, q_ptr, eps, tokens, t_ok, stride_qkv, stride_cos, stride_sin,
                     0, NUM_Q, BLOCK_Q, HALF, SOFT_BF16)
    _norm_rope_heads(qkv_ptr, wk_ptr, cos_ptr, sin_ptr, k_ptr, eps, tokens, t_ok, stride_qkv, stride_cos, stride_sin,
                     NUM_Q, NUM_KV, BLOCK_KV, HALF, SOFT_BF16)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads) -> None:
    head_dim = q_weight.shape[0] if q_weight.dim() == 1 else -1
    if qkv.dim() != 2 or head_dim < 2 or head_dim % 2 or head_dim & (head_dim - 1) \
            or qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"qk_norm_rope: expected qkv [T, (Nq + 2 Nkv) D] with D a power of two = the weights' "
                         f"length; got qkv {tuple(qkv.shape)}, q_weight {tuple(q_weight.shape)}, "
                         f"Nq {num_q_heads}, Nkv {num_kv_heads}")
    if tuple(k_weight.shape) != (head_dim,) or tuple(cos.shape) != (qkv.shape[0], head_dim) \
            or tuple(sin.shape) != (qkv.shape[0], head_dim):
        raise ValueError(f"qk_norm_rope: k_weight must be [{head_dim}] and cos / sin [T, {head_dim}]; got "
                         f"k_weight {tuple(k_weight.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}")
    tensors = (qkv, q_weight, k_weight, cos, sin)
    if qkv.dtype not in SUPPORTED_DTYPES or any(t.dtype != qkv.dtype for t in tensors):
        raise ValueError(f"qk_norm_rope: every tensor must share one dtype of bfloat16, float16, float32; got "
                         f"{[t.dtype for t in tensors]}")
    if any(t.stride(-1) != 1 for t in tensors) or len({t.device for t in tensors}) != 1:
        raise ValueError("qk_norm_rope: every tensor's last dim must be contiguous, all on one device")


def default_config(num_heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_T, num_warps): tokens up to ~2K half-row elements a program, the heads counted as
    their power of two (Qwen3-0.6B: 24 counted as 32, x 64 = 2,048: one token; on the H200 one
    token a program took 14.6 us at T 2,250, two 14.2 but more at T 100 and 9,000, 96fb5df).
    Fixed, not autotuned: deterministic builds."""
    per_token = triton.next_power_of_2(num_heads) * (head_dim // 2)
    return max(1, 2048 // per_token), 4


def launch(qkv, q_weight, k_weight, cos, sin, eps: float, num_q_heads: int, num_kv_heads: int,
           block_t: int | None = None, num_warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernel; same signature and result as `reference` (ties of the sum order
    aside). The launch config is overridable for tests and benchmarks."""
    _check(qkv, q_weight, k_weight, cos, sin, num_q_heads, num_kv_heads)
    num_tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    default_t, default_warps = default_config(num_q_heads + num_kv_heads, head_dim)
    block_t, num_warps = block_t or default_t, num_warps or default_warps
    q = torch.empty((num_tokens, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((num_tokens, num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    wrap_triton(_qk_norm_rope_kernel)[(triton.cdiv(num_tokens, block_t),)](
        qkv, q_weight, k_weight, cos, sin, q, k, eps, num_tokens, qkv.stride(0), cos.stride(0), sin.stride(0),
        NUM_Q=num_q_heads, NUM_KV=num_kv_heads, HALF=head_dim // 2, BLOCK_T=block_t,
        BLOCK_Q=triton.next_power_of_2(num_q_heads), BLOCK_KV=triton.next_power_of_2(num_kv_heads), SOFT_BF16=True,
        num_warps=num_warps)
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
