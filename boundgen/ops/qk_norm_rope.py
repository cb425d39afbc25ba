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

Triton kernel: one program per block of BLOCK_T tokens, all Nq + Nkv heads of each token (a row
is a (token, head) pair; q heads first, as in qkv), each row in its two halves. Rounding is the
references' step by step, with `round_to` on the bits (SOFT_BF16, on the GPU too, so that no cast
round trip is folded away): FP32 sum of squares (the two halves' sums added: the order differs
from the reference's, which can move the FP32 rstd by an ulp and a bf16 value by one), rstd =
1 / sqrt_rn(mean + eps), normed rounded to the dtype, times the weight rounded to the dtype, then
RoPE's two products each rounded and their sum rounded. Bytes: q and k read once, written once;
cos / sin once per token; the weights once per program.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import rmsnorm, rope
from boundgen.ops.rope import rotate_halves  # by name: Inductor copies a kernel's helpers by name
from boundgen.ops.rounding import round_to


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
def _qk_norm_rope_kernel(qkv_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, eps, num_tokens,
                         stride_qkv, stride_cos, stride_sin, NUM_Q: tl.constexpr, NUM_KV: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
                         SOFT_BF16: tl.constexpr):
    dtype = qkv_ptr.dtype.element_ty
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    heads = tl.arange(0, BLOCK_N)  # q heads, then k heads
    offs = tl.arange(0, HALF)
    t_ok = tokens < num_tokens
    is_q = heads < NUM_Q
    mask = t_ok[:, None, None] & (heads < NUM_Q + NUM_KV)[None, :, None]  # [T, N, 1]

    x_at = qkv_ptr + tokens[:, None, None] * stride_qkv + heads[None, :, None] * (2 * HALF) + offs[None, None, :]
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)  # [T, N, D/2]
    x2 = tl.load(x_at + HALF, mask=mask, other=0.0).to(tl.float32)

    # RMSNorm over each row (both halves), as ops/rmsnorm.py rounds.
    sum_sq = tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)  # [T, N]
    mean_sq = tl.div_rn(sum_sq, tl.full([BLOCK_T, BLOCK_N], 2 * HALF, tl.float32))
    var = mean_sq + tl.full([BLOCK_T, BLOCK_N], eps, tl.float32)
    rstd = tl.div_rn(tl.full([BLOCK_T, BLOCK_N], 1.0, tl.float32), tl.sqrt_rn(var))[:, :, None]
    wq1 = tl.load(wq_ptr + offs).to(tl.float32)[None, None, :]
    wq2 = tl.load(wq_ptr + HALF + offs).to(tl.float32)[None, None, :]
    wk1 = tl.load(wk_ptr + offs).to(tl.float32)[None, None, :]
    wk2 = tl.load(wk_ptr + HALF + offs).to(tl.float32)[None, None, :]
    q_head = is_q[None, :, None]
    w1 = tl.where(q_head, wq1, wk1)
    w2 = tl.where(q_head, wq2, wk2)
    n1 = round_to(w1 * round_to(x1 * rstd, dtype, SOFT_BF16).to(tl.float32), dtype, SOFT_BF16).to(tl.float32)
    n2 = round_to(w2 * round_to(x2 * rstd, dtype, SOFT_BF16).to(tl.float32), dtype, SOFT_BF16).to(tl.float32)

    # RoPE (rotate-half), as ops/rope.py rounds.
    y1, y2 = rotate_halves(n1, n2, cos_ptr, sin_ptr, tokens, stride_cos, stride_sin, t_ok, HALF, HALF, dtype,
                                SOFT_BF16)

    q_at = q_ptr + (tokens[:, None, None] * NUM_Q + heads[None, :, None]) * (2 * HALF) + offs[None, None, :]
    q_mask = mask & q_head
    tl.store(q_at, y1, mask=q_mask)
    tl.store(q_at + HALF, y2, mask=q_mask)
    k_at = (k_ptr + (tokens[:, None, None] * NUM_KV + (heads[None, :, None] - NUM_Q)) * (2 * HALF)
            + offs[None, None, :])
    k_mask = mask & (heads >= NUM_Q)[None, :, None]
    tl.store(k_at, y1, mask=k_mask)
    tl.store(k_at + HALF, y2, mask=k_mask)


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
    """(BLOCK_T, num_warps): tokens up to ~2K half-row elements a program (Qwen3-0.6B: 24 heads
    padded to 32 x 64 = 2,048: one token). Fixed, not autotuned: deterministic builds."""
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
        BLOCK_N=triton.next_power_of_2(num_q_heads + num_kv_heads), SOFT_BF16=True, num_warps=num_warps)
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
