"""RMSNorm: y = w * (x / sqrt(mean(x^2) + eps)), statistics in FP32, as HF Qwen2RMSNorm.

x [T, H] (or [T, N, D] for the per-head q/k norm of Qwen3), w [H] -> y of x's shape, contiguous.
Bytes moved: read x and w, write y. The normalised value is cast back to the input dtype before
the weight multiply, exactly as HF does, so that bf16 results match the peer bit for bit in the
common case.

Triton kernel: one program per block of rows (a row is one token, or one (token, head) of a
[T, N, D] input), the whole row in registers.
- x may be any view with a contiguous last dim (the q/k norm reads a slice of the fused qkv output
  reshaped to [T, N, D]): rows are addressed through the token and head strides, never copied.
- Same rounding as `reference`: sum of squares in FP32, rstd = 1 / sqrt(mean + eps) with
  IEEE-rounded sqrt and division (as torch's CPU rsqrt), normalised value rounded to x's dtype,
  then w * that in FP32, rounded to x's dtype. Only the order of the FP32 sum differs, so bf16
  results equal the reference's or differ by one ulp where the FP32 rstd differs in its last bit.
  mean = sum * (1 / H) where H is a power of two (the same correctly rounded value as the division).
- The weight is loaded first, a copy a row in the rows' layout (from L1): loaded after the row's
  reduction as an [H] vector it cost a memory round trip and a layout conversion after a barrier.
Bytes moved: x read, y written (T H each), the weight once a program (from L2); ADD: delta read
and the sum written too (4 T H: 8 KB a W1 token of H 1,024 in bf16); QUANT: y in E4M3 (T H bytes)
and a 4-byte scale a row. Block sizes (default_config): ~2K elements a program, 2 rows of H 1,024
at 4 warps, 16 a thread (two 16-byte loads a row): among the best of a sweep on the H200 (b58b127,
docs/benchmarks.md: 3.6-5.1 TB/s warm for add_rmsnorm at 2,250-9,000 tokens), enough programs
(1,125 at 2,250 tokens) to fill 132 SMs several times over.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops.e4m3 import E4M3, quantize_block
from boundgen.ops.rounding import round_to, rounded


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(dtype)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, out_ptr, eps, num_rows, stride_xt, stride_xn, d_ptr, sum_ptr, stride_dt,
                    stride_ds, scale_ptr, NUM_HEADS: tl.constexpr, HIDDEN: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                    BLOCK_H: tl.constexpr, SOFT_BF16: tl.constexpr, ADD: tl.constexpr, SPLITS: tl.constexpr,
                    QUANT: tl.constexpr):
    # ADD (ops/add_rmsnorm.py): x + d, rounded to x's dtype as torch's add rounds, is written to
    # sum_ptr ([T, H] contiguous) and normalised; else x itself is normalised (d_ptr, sum_ptr unused).
    # SPLITS > 0: d is that many FP32 partial products [S, T, H] (ops/swiglu_down.py), summed in
    # order and rounded to x's dtype first, as the GEMM they replace stores its product.
    # QUANT (ops/add_rmsnorm_quant.py, ops/rmsnorm_quant.py): the normalised row, rounded to x's
    # dtype, is written in E4M3 to out_ptr with its FP32 scale to scale_ptr (ops/e4m3.py: amax / 448),
    # not in x's dtype.
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # row = token * N + head
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < HIDDEN
    mask = (rows < num_rows)[:, None] & col_ok[None, :]
    token = (rows // NUM_HEADS).to(tl.int64)
    head = rows % NUM_HEADS
    rows = rows.to(tl.int64)
    # The weight first, a copy a row (from L1) in the rows' own layout: loaded after the reduction
    # it was one more memory round trip after a barrier, and as [H] a layout conversion, i.e.
    # another barrier, on every program's critical path.
    w = tl.load(w_ptr + (rows * 0)[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)  # [R, H]
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
    if (HIDDEN & (HIDDEN - 1)) == 0:  # 1 / H exact: the product is the correctly rounded quotient
        mean_sq = tl.sum(xf * xf, axis=1) * (1.0 / HIDDEN)
    else:
        mean_sq = tl.div_rn(tl.sum(xf * xf, axis=1), tl.full([BLOCK_ROWS], HIDDEN, tl.float32))
    # eps made FP32 first: Inductor passes a Python float argument as fp64 in AOTI builds.
    var = mean_sq + tl.full([BLOCK_ROWS], eps, tl.float32)
    rstd = tl.div_rn(tl.full([BLOCK_ROWS], 1.0, tl.float32), tl.sqrt_rn(var))  # [R]
    normed = round_to(xf * rstd[:, None], x.dtype, SOFT_BF16)
    y = w * normed.to(tl.float32)
    if QUANT:
        y = rounded(y, x.dtype, True)  # on x's grid on every device (a cast round trip may be folded)
        q, scale = quantize_block(y, SOFT_BF16, True)
        tl.store(out_ptr + rows[:, None] * HIDDEN + cols[None, :], q.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + rows, scale, mask=rows < num_rows)
    else:
        tl.store(out_ptr + rows[:, None] * HIDDEN + cols[None, :],
                 round_to(y, x.dtype, SOFT_BF16), mask=mask)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() not in (2, 3):
        raise ValueError(f"rmsnorm: expected x [T, H] or [T, N, D]; got shape {tuple(x.shape)}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"rmsnorm: weight must be [{x.shape[-1]}] (x's last dim); got "
                         f"{tuple(weight.shape)}")
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"rmsnorm: x and weight must share one dtype of bfloat16, float16, "
                         f"float32; got x {x.dtype}, weight {weight.dtype}")
    if x.stride(-1) != 1 or weight.stride(0) != 1:
        raise ValueError(f"rmsnorm: the last dim of x and weight must be contiguous (stride 1); "
                         f"got strides x {x.stride()}, weight {weight.stride()}")
    if x.device != weight.device:
        raise ValueError(f"rmsnorm: x and weight must be on one device; got x {x.device}, "
                         f"weight {weight.device}")


def _check_delta(x: torch.Tensor, delta: torch.Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(f"add_rmsnorm: x must be [T, H]; got shape {tuple(x.shape)}")
    if delta.dim() == 3:  # partial products (ops/swiglu_down.py)
        if delta.shape[1:] != x.shape or delta.dtype != torch.float32 or not delta.is_contiguous():
            raise ValueError(f"add_rmsnorm: partial products must be [S, T, H] float32 contiguous with [T, H] = "
                             f"x's {tuple(x.shape)}; got {tuple(delta.shape)} {delta.dtype} strides {delta.stride()}")
    elif delta.shape != x.shape or delta.dtype != x.dtype or delta.stride(-1) != 1:
        raise ValueError(f"add_rmsnorm: delta must be like x [T, H] {tuple(x.shape)} {x.dtype} with a contiguous "
                         f"last dim; got {tuple(delta.shape)} {delta.dtype} strides {delta.stride()}")
    if delta.device != x.device:
        raise ValueError(f"add_rmsnorm: delta must be on x's device {x.device}; got {delta.device}")


def default_config(hidden: int) -> tuple[int, int]:
    """(BLOCK_ROWS, num_warps): ~2K elements per program (a row of H 1024 is 2 rows per program,
    a head of D 128 is 16). Fixed, not autotuned: deterministic builds."""
    block_h = triton.next_power_of_2(hidden)
    return max(1, min(64, 2048 // block_h)), (8 if block_h >= 4096 else 4)


def launch(x: torch.Tensor, weight: torch.Tensor, eps: float, block_rows: int | None = None,
           num_warps: int | None = None, delta: torch.Tensor | None = None, quantize: bool = False):
    """Run the Triton kernel; same signature and result as `reference`. The launch config is
    overridable for tests (small blocks exercise many programs on tiny inputs) and benchmarks.
    With `delta` (x's shape, [T, H], or FP32 partial products [S, T, H] of it): the residual add
    first, and (x + delta, the norm of it), as ops/add_rmsnorm.py's reference. With `quantize`
    (x [T, H]): the norm in E4M3 rows and their FP32 scales [T, 1], after x + delta with a delta
    ((x + delta, q, scale): ops/add_rmsnorm_quant.py's reference), else (q, scale):
    ops/rmsnorm_quant.py's."""
    _check(x, weight)
    if delta is not None:
        _check_delta(x, delta)
    if quantize and x.dim() != 2:
        raise ValueError(f"rmsnorm_quant: x must be [T, H] to be quantized by rows; got shape {tuple(x.shape)}")
    hidden = x.shape[-1]
    num_heads = x.shape[1] if x.dim() == 3 else 1
    stride_xn = x.stride(1) if x.dim() == 3 else 0
    num_rows = x.shape[0] * num_heads
    default_rows, default_warps = default_config(hidden)
    block_rows, num_warps = block_rows or default_rows, num_warps or default_warps
    out = torch.empty(x.shape, dtype=E4M3 if quantize else x.dtype, device=x.device)
    scale = torch.empty((num_rows, 1), dtype=torch.float32, device=x.device) if quantize else None
    grid = (triton.cdiv(num_rows, block_rows),)
    add = delta is not None
    parts = delta.shape[0] if add and delta.dim() == 3 else 0
    total = torch.empty(x.shape, dtype=x.dtype, device=x.device) if add else out
    wrap_triton(_rmsnorm_kernel)[grid](
        x, weight, out, eps, num_rows, x.stride(0), stride_xn, delta if add else x, total,
        delta.stride(-2) if add else 0, delta.stride(0) if parts else 0, scale if quantize else out,
        NUM_HEADS=num_heads, HIDDEN=hidden, BLOCK_ROWS=block_rows, BLOCK_H=triton.next_power_of_2(hidden),
        SOFT_BF16=x.device.type == "cpu", ADD=add, SPLITS=parts, QUANT=quantize, num_warps=num_warps)
    if quantize:
        return (total, out, scale) if add else (out, scale)
    return (total, out) if add else out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::rmsnorm", mutates_args=())
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return launch(x, weight, eps)


rmsnorm.register_kernel("cpu")(reference)


@rmsnorm.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "triton": rmsnorm}
