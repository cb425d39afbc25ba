"""Rotary position embedding (rotate-half form, as HF Qwen2/Qwen3).

inv_freq[i] = 1 / theta^(2i / D); angle[t, i] = position[t] * inv_freq[i] in FP32;
cos/sin [T, D] = cos/sin(cat(angle, angle)) cast to the activation dtype;
y = x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]).
x [T, N, D] -> y [T, N, D] contiguous. Bytes moved: read x, cos, sin; write y.

Triton kernel: one program per (token block, head block), each row split in its two halves:
    y[:D/2] = x1 * cos[:D/2] - x2 * sin[:D/2],   y[D/2:] = x2 * cos[D/2:] + x1 * sin[D/2:]
with each product and the sum rounded to x's dtype, as the reference's three torch ops round
(products in FP32, which is exact for bf16/fp16 operands): bf16/fp16 results equal the
reference's bit for bit. bf16 rounding is done on the bits (`round_to` with SOFT_BF16) on every
device: with plain casts the H200 build matched a single rounding of the FP32 sum instead (2026-11-29:
up to ~15,500 bf16 ulp where x*cos and r*sin nearly cancel, abs error <= 1 ulp of the terms;
the same numbers come out of a CPU simulation of one rounding), i.e. the intermediate
round trips were folded away. Integer rounding cannot be folded. cos/sin rows are loaded once per token block and shared by its heads.
x may be any view with a contiguous head dim (the model passes a slice of the fused qkv output
reshaped to [T, N, D]); cos/sin need a contiguous last dim.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops.rounding import round_to, rounded


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """[D/2] FP32, computed as HF computes it (int64 arange -> float, then divide)."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta ** exponent)


def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """positions [T] int -> (cos, sin) each [T, D] in `dtype`."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((angles, angles), dim=-1)  # [T, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, N, D], cos/sin [T, D] -> [T, N, D]."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    return x * cos + _rotate_half(x) * sin


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def rotate_halves(x1, x2, cos_ptr, sin_ptr, rows, stride_cos, stride_sin, row_ok, HALF: tl.constexpr,
                  BLOCK_HALF: tl.constexpr, dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """RoPE of rows' halves x1, x2 [T, N, BLOCK_HALF] in FP32 (values of `dtype`; BLOCK_HALF the
    power of two >= D/2), cos / sin rows [T, D] loaded once for all N heads -> (y1, y2) in
    `dtype`, each product and the sum rounded as `reference` rounds them. This kernel's and the
    fused kernels' (ops/qk_norm_rope.py, ops/rope_kv_write.py) one RoPE."""
    offs = tl.arange(0, BLOCK_HALF)
    mask = row_ok[:, None] & (offs < HALF)[None, :]  # [T, D/2]
    cos_at = cos_ptr + rows[:, None] * stride_cos + offs[None, :]
    sin_at = sin_ptr + rows[:, None] * stride_sin + offs[None, :]
    cos1 = tl.load(cos_at, mask=mask, other=0.0).to(tl.float32)[:, None, :]
    cos2 = tl.load(cos_at + HALF, mask=mask, other=0.0).to(tl.float32)[:, None, :]
    sin1 = tl.load(sin_at, mask=mask, other=0.0).to(tl.float32)[:, None, :]
    sin2 = tl.load(sin_at + HALF, mask=mask, other=0.0).to(tl.float32)[:, None, :]
    y1 = round_to(rounded(x1 * cos1, dtype, SOFT_BF16) + rounded(-x2 * sin1, dtype, SOFT_BF16), dtype, SOFT_BF16)
    y2 = round_to(rounded(x2 * cos2, dtype, SOFT_BF16) + rounded(x1 * sin2, dtype, SOFT_BF16), dtype, SOFT_BF16)
    return y1, y2


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, num_tokens, stride_xt, stride_xn,
                 stride_ct, stride_st, NUM_HEADS: tl.constexpr, HALF: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 SOFT_BF16: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_HALF)
    t_ok = tokens < num_tokens
    mask_td = t_ok[:, None] & (offs_d < HALF)[None, :]  # [T, D/2]
    mask = mask_td[:, None, :] & (heads < NUM_HEADS)[None, :, None]  # [T, N, D/2]

    x_at = (x_ptr + tokens[:, None, None] * stride_xt + heads[None, :, None] * stride_xn
            + offs_d[None, None, :])
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)  # [T, N, D/2]
    x2 = tl.load(x_at + HALF, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = rotate_halves(x1, x2, cos_ptr, sin_ptr, tokens, stride_ct, stride_st, t_ok, HALF, BLOCK_HALF, dtype,
                           SOFT_BF16)
    out_at = (out_ptr + (tokens[:, None, None] * NUM_HEADS + heads[None, :, None]) * (2 * HALF)
              + offs_d[None, None, :])
    tl.store(out_at, y1, mask=mask)
    tl.store(out_at + HALF, y2, mask=mask)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if x.dim() != 3 or x.shape[2] % 2:
        raise ValueError(f"rope: expected x [T, N, D] with an even head dim D; got shape "
                         f"{tuple(x.shape)}")
    expected = (x.shape[0], x.shape[2])
    if tuple(cos.shape) != expected or tuple(sin.shape) != expected:
        raise ValueError(f"rope: cos and sin must be [T, D] = {list(expected)}; got cos "
                         f"{tuple(cos.shape)}, sin {tuple(sin.shape)}")
    if x.dtype not in SUPPORTED_DTYPES or cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError(f"rope: x, cos and sin must share one dtype of bfloat16, float16, "
                         f"float32; got x {x.dtype}, cos {cos.dtype}, sin {sin.dtype}")
    if x.stride(2) != 1 or cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError(f"rope: the last dim of x, cos and sin must be contiguous (stride 1); "
                         f"got strides x {x.stride()}, cos {cos.stride()}, sin {sin.stride()}")
    if not (x.device == cos.device == sin.device):
        raise ValueError(f"rope: x, cos and sin must be on one device; got x {x.device}, "
                         f"cos {cos.device}, sin {sin.device}")


def default_config(num_heads: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_N, num_warps): all heads of a token in one program (up to 16), tokens
    added up to ~1K half-row elements per program (Qwen3 q: 2 tokens x 16 heads x 64; Qwen2
    q: 4 x 16 x 32). Fixed, not autotuned: deterministic builds."""
    block_n = min(16, triton.next_power_of_2(num_heads))
    per_token = block_n * triton.next_power_of_2(head_dim // 2)
    return max(1, min(64, 1024 // per_token)), block_n, 4


def launch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, block_t: int | None = None,
           block_n: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Run the Triton kernel; same signature and result as `reference`. The launch config is
    overridable for tests (small blocks exercise many programs on tiny inputs) and benchmarks."""
    _check(x, cos, sin)
    num_tokens, num_heads, head_dim = x.shape
    default_t, default_n, default_warps = default_config(num_heads, head_dim)
    block_t, block_n = block_t or default_t, block_n or default_n
    num_warps = num_warps or default_warps
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(num_tokens, block_t), triton.cdiv(num_heads, block_n))
    wrap_triton(_rope_kernel)[grid](
        x, cos, sin, out, num_tokens, x.stride(0), x.stride(1), cos.stride(0), sin.stride(0),
        NUM_HEADS=num_heads, HALF=head_dim // 2, BLOCK_T=block_t, BLOCK_N=block_n,
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2), SOFT_BF16=True, num_warps=num_warps)
    return out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::rope", mutates_args=())
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return launch(x, cos, sin)


rope.register_kernel("cpu")(reference)


@rope.register_fake
def _(x, cos, sin):
    return x.new_empty(x.shape)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "triton": rope}
