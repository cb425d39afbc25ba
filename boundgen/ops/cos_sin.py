"""RoPE's cos / sin tables for a call's positions, in one kernel.

    positions [T] int, inv_freq [D/2] FP32 -> (cos, sin) each [T, D] in `dtype`, contiguous:
    angle[t, i] = float(positions[t]) * inv_freq[i], both halves of a row alike (as HF's
    cat(angle, angle)), each value rounded once to `dtype`. `reference` is ops/rope.py's `cos_sin`,
    what the model computes without this op.

Why: every layer's RoPE kernel reads the same cos / sin. Computed in the graph they are a cheap
pointwise value, which Inductor does not store once for its readers but recomputes into a buffer of
its own for each opaque kernel that reads it (ir.py `should_realize_on_reuse`: only past
`realize_reads_threshold` reads). The beam step's C++ wrapper on the H200 (2026-12-01) computed
cos / sin 24 times a decode step in ~10 launches, W1's 28 times a request in 8. A kernel's output is
a buffer: computed once, passed to every layer as it is.

Lowerings: "torch" (the reference, as before) and "triton" (this kernel; the registered op runs the
reference on CPU).

Triton kernel: one program per block of BLOCK_T rows, a row's D/2 angles in FP32 (the product is
the reference's, which Inductor also computes as one FP32 multiply), `tl.cos` / `tl.sin` as
Inductor's compile of the reference calls them, each stored into both halves. bf16 rounding goes
through `round_to` (the interpreter truncates casts). Bytes: positions read once, cos and sin
written once.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import rope
from boundgen.ops.rounding import round_to

reference = rope.cos_sin


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _cos_sin_kernel(pos_ptr, inv_freq_ptr, cos_ptr, sin_ptr, num_rows, HALF: tl.constexpr,
                    BLOCK_T: tl.constexpr, SOFT_BF16: tl.constexpr):
    dtype = cos_ptr.dtype.element_ty
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    cols = tl.arange(0, HALF)
    row_ok = rows < num_rows
    position = tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.float32)
    angle = position[:, None] * tl.load(inv_freq_ptr + cols)[None, :]  # [T, D/2]
    cos = round_to(tl.cos(angle), dtype, SOFT_BF16)
    sin = round_to(tl.sin(angle), dtype, SOFT_BF16)
    at = rows[:, None] * (2 * HALF) + cols[None, :]
    mask = row_ok[:, None]
    tl.store(cos_ptr + at, cos, mask=mask)
    tl.store(cos_ptr + at + HALF, cos, mask=mask)
    tl.store(sin_ptr + at, sin, mask=mask)
    tl.store(sin_ptr + at + HALF, sin, mask=mask)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> None:
    if positions.dim() != 1 or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cos_sin: expected positions [T] int32 or int64; got {positions.dtype} "
                         f"{tuple(positions.shape)}")
    half = inv_freq.shape[0] if inv_freq.dim() == 1 else 0
    if inv_freq.dtype != torch.float32 or half < 1 or half & (half - 1):
        raise ValueError(f"cos_sin: expected inv_freq [D/2] float32 with D/2 a power of two; got "
                         f"{inv_freq.dtype} {tuple(inv_freq.shape)}")
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"cos_sin: dtype must be bfloat16, float16 or float32; got {dtype}")
    if positions.device != inv_freq.device:
        raise ValueError(f"cos_sin: positions and inv_freq must be on one device; got {positions.device}, "
                         f"{inv_freq.device}")


def launch(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype,
           block_t: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the Triton kernel; same signature and result as `reference`. `block_t` (rows a program)
    is overridable for tests."""
    _check(positions, inv_freq, dtype)
    rows, half = positions.shape[0], inv_freq.shape[0]
    cos = torch.empty((rows, 2 * half), dtype=dtype, device=positions.device)
    sin = torch.empty_like(cos)
    wrap_triton(_cos_sin_kernel)[(triton.cdiv(rows, block_t),)](
        positions, inv_freq.contiguous(), cos, sin, rows, HALF=half, BLOCK_T=block_t,
        SOFT_BF16=positions.device.type == "cpu", num_warps=1)
    return cos, sin


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::cos_sin", mutates_args=())
def cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(positions, inv_freq, dtype)


cos_sin.register_kernel("cpu")(reference)


@cos_sin.register_fake
def _(positions, inv_freq, dtype):
    cos = positions.new_empty((positions.shape[0], 2 * inv_freq.shape[0]), dtype=dtype)
    return cos, torch.empty_like(cos)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "triton": cos_sin}
