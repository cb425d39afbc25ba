"""The memory-bound kernels as they were at 28a37ab, before the roofline work, for an A/B on the
GPU against the ops' current kernels (`python -m boundgen.bench.kernels --memory-bound --variant
new,old`): RMSNorm with its ADD / QUANT paths (ops/rmsnorm.py), the fused q/k-norm + RoPE
(ops/qk_norm_rope.py) and SwiGLU + E4M3 (ops/silu_quant.py), their kernels verbatim but renamed,
launched with their launch configs of then. No build uses them; delete once the A/B is recorded.
"""

import torch
import triton
import triton.language as tl

from boundgen.ops import rmsnorm
from boundgen.ops.e4m3 import E4M3, quantize_block
from boundgen.ops.rope import rotate_halves
from boundgen.ops.rounding import round_to, rounded


@triton.jit
def _rmsnorm_kernel_old(x_ptr, w_ptr, out_ptr, eps, num_rows, stride_xt, stride_xn, d_ptr, sum_ptr, stride_dt,
                    stride_ds, scale_ptr, NUM_HEADS: tl.constexpr, HIDDEN: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                    BLOCK_H: tl.constexpr, SOFT_BF16: tl.constexpr, ADD: tl.constexpr, SPLITS: tl.constexpr,
                    QUANT: tl.constexpr):
    # ADD (ops/add_rmsnorm.py): x + d, rounded to x's dtype as torch's add rounds, is written to
    # sum_ptr ([T, H] contiguous) and normalised; else x itself is normalised (d_ptr, sum_ptr unused).
    # SPLITS > 0: d is that many FP32 partial products [S, T, H] (ops/swiglu_down.py), summed in
    # order and rounded to x's dtype first, as the GEMM they replace stores its product.
    # QUANT (ops/add_rmsnorm_quant.py): the normalised row, rounded to x's dtype, is written in E4M3
    # to out_ptr with its FP32 scale to scale_ptr (ops/e4m3.py: amax / 448), not in x's dtype.
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # row = token * N + head
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < HIDDEN
    mask = (rows < num_rows)[:, None] & col_ok[None, :]
    token = (rows // NUM_HEADS).to(tl.int64)
    head = rows % NUM_HEADS
    rows = rows.to(tl.int64)
    x = tl.load(x_ptr + (token * stride_xt + head * stride_xn)[:, None] + cols[None, :],
                mask=mask, other=0.0)  # [R, H]
    if ADD:  # rounded on the bits on every device, so that the norm reads the stored sum
        if SPLITS:
            d = tl.zeros([BLOCK_ROWS, BLOCK_H], tl.float32)
            for s in tl.static_range(SPLITS):
                d += tl.load(d_ptr + s * stride_ds + (token * stride_dt)[:, None] + cols[None, :], mask=mask,
                             other=0.0)
            d = rounded(d, x.dtype, True)
        else:
            d = tl.load(d_ptr + (token * stride_dt)[:, None] + cols[None, :], mask=mask, other=0.0)
        x = round_to(x.to(tl.float32) + d.to(tl.float32), x.dtype, True)
        tl.store(sum_ptr + rows[:, None] * HIDDEN + cols[None, :], x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.div_rn(tl.sum(xf * xf, axis=1), tl.full([BLOCK_ROWS], HIDDEN, tl.float32))
    # eps made FP32 first: Inductor passes a Python float argument as fp64 in AOTI builds.
    var = mean_sq + tl.full([BLOCK_ROWS], eps, tl.float32)
    rstd = tl.div_rn(tl.full([BLOCK_ROWS], 1.0, tl.float32), tl.sqrt_rn(var))  # [R]
    normed = round_to(xf * rstd[:, None], x.dtype, SOFT_BF16)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)  # [H]
    y = w[None, :] * normed.to(tl.float32)
    if QUANT:
        y = rounded(y, x.dtype, True)  # on x's grid on every device (a cast round trip may be folded)
        q, scale = quantize_block(y, SOFT_BF16, True)
        tl.store(out_ptr + rows[:, None] * HIDDEN + cols[None, :], q.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + rows, scale, mask=rows < num_rows)
    else:
        tl.store(out_ptr + rows[:, None] * HIDDEN + cols[None, :],
                 round_to(y, x.dtype, SOFT_BF16), mask=mask)



@triton.jit
def _norm_rope_heads_old(qkv_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, eps, tokens, t_ok, stride_qkv, stride_cos,
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
def _qk_norm_rope_kernel_old(qkv_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, eps, num_tokens,
                         stride_qkv, stride_cos, stride_sin, NUM_Q: tl.constexpr, NUM_KV: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr,
                         SOFT_BF16: tl.constexpr):
    # q heads and k heads each in a block of their own: no padded head is computed where the
    # counts are powers of two (Qwen3-0.6B: 16 and 8, where one block of 24 was padded to 32).
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    t_ok = tokens < num_tokens
    _norm_rope_heads_old(qkv_ptr, wq_ptr, cos_ptr, sin_ptr, q_ptr, eps, tokens, t_ok, stride_qkv, stride_cos, stride_sin,
                     0, NUM_Q, BLOCK_Q, HALF, SOFT_BF16)
    _norm_rope_heads_old(qkv_ptr, wk_ptr, cos_ptr, sin_ptr, k_ptr, eps, tokens, t_ok, stride_qkv, stride_cos, stride_sin,
                     NUM_Q, NUM_KV, BLOCK_KV, HALF, SOFT_BF16)



@triton.jit
def _silu_quant_kernel_old(x_ptr, q_ptr, scale_ptr, num_rows, stride_xt, INTER: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_I: tl.constexpr, SOFT_BF16: tl.constexpr, IEEE_DIV: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    cols = tl.arange(0, BLOCK_I)
    mask = (rows < num_rows)[:, None] & (cols < INTER)[None, :]
    gate_at = x_ptr + rows[:, None] * stride_xt + cols[None, :]
    gate = tl.load(gate_at, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_at + INTER, mask=mask, other=0.0).to(tl.float32)
    if IEEE_DIV:
        silu = tl.div_rn(gate, 1.0 + tl.exp(-gate))
    else:  # an approximate division: its last FP32 bits rarely survive the rounding to x's dtype
        silu = gate / (1.0 + tl.exp(-gate))
    act = rounded(rounded(silu, dtype, SOFT_BF16) * up, dtype, SOFT_BF16)  # 0 where masked
    q, scale = quantize_block(act, SOFT_BF16, IEEE_DIV)
    tl.store(q_ptr + rows[:, None] * INTER + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=rows < num_rows)



def rmsnorm_launch(x, weight, eps, delta=None, quantize=False, block_rows=None, num_warps=None):
    """ops/rmsnorm.py's `launch` of then (2-D x, i.e. [T, H]; default: 2 rows of H 1,024, 4 warps)."""
    hidden, num_rows = x.shape[-1], x.shape[0]
    default_rows, default_warps = rmsnorm.default_config(hidden)
    block_rows, num_warps = block_rows or default_rows, num_warps or default_warps
    out = torch.empty(x.shape, dtype=E4M3 if quantize else x.dtype, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device) if quantize else None
    add = delta is not None
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if add else out
    _rmsnorm_kernel_old[(triton.cdiv(num_rows, block_rows),)](
        x, weight, out, eps, num_rows, x.stride(0), 0, delta if add else x, total, delta.stride(-2) if add else 0, 0,
        scale if quantize else out, NUM_HEADS=1, HIDDEN=hidden, BLOCK_ROWS=block_rows,
        BLOCK_H=triton.next_power_of_2(hidden), SOFT_BF16=x.device.type == "cpu", ADD=add, SPLITS=0, QUANT=quantize,
        num_warps=num_warps)
    if quantize:
        return total, out, scale
    return (total, out) if add else out


def qk_norm_rope_launch(qkv, q_weight, k_weight, cos, sin, eps, num_q_heads, num_kv_heads):
    """ops/qk_norm_rope.py's `launch` of then (Qwen3-0.6B: one token a program, 4 warps)."""
    num_tokens, head_dim = qkv.shape[0], q_weight.shape[0]
    per_token = triton.next_power_of_2(num_q_heads + num_kv_heads) * (head_dim // 2)
    block_t = max(1, 2048 // per_token)
    q = torch.empty((num_tokens, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((num_tokens, num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    _qk_norm_rope_kernel_old[(triton.cdiv(num_tokens, block_t),)](
        qkv, q_weight, k_weight, cos, sin, q, k, eps, num_tokens, qkv.stride(0), cos.stride(0), sin.stride(0),
        NUM_Q=num_q_heads, NUM_KV=num_kv_heads, HALF=head_dim // 2, BLOCK_T=block_t,
        BLOCK_Q=triton.next_power_of_2(num_q_heads), BLOCK_KV=triton.next_power_of_2(num_kv_heads), SOFT_BF16=True,
        num_warps=4)
    return q, k


def silu_quant_launch(x):
    """ops/silu_quant.py's `launch` of then (one row a program, I in one block; 8 warps from 2K)."""
    num_rows, inter = x.shape[0], x.shape[1] // 2
    q = torch.empty((num_rows, inter), dtype=E4M3, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device)
    _silu_quant_kernel_old[(num_rows,)](
        x, q, scale, num_rows, x.stride(0), INTER=inter, BLOCK_T=1, BLOCK_I=triton.next_power_of_2(inter),
        SOFT_BF16=x.device.type == "cpu", IEEE_DIV=x.device.type == "cpu",
        num_warps=8 if triton.next_power_of_2(inter) >= 2048 else 4)
    return q, scale
