"""SwiGLU and the MLP's down projection of a beam decode step, as split-K partial products.

    x [T, 2I] (gate then up, `gate_up_proj`'s output), weight [H, I] (`down_proj`'s)
    -> partials [S, T, H] FP32, S = cdiv(I, K_SPLIT), with
    partials[s] = activation(x)[:, ks] @ weight[:, ks].T over the s-th K_SPLIT columns of I,
    activation(x) = silu(gate) * up in FP32 rounded once to x's dtype (`activation` below), and
    `total(partials, dtype)` = down_proj(activation(x)) up to the order of the FP32 sums.

Why: a decode step has few rows (R x W beams, 100-800), and cuBLAS runs its down projection
(K = I = 4,864 for Qwen2.5-0.5B) as a split-K GEMM plus a reduction kernel, after Inductor's
SwiGLU kernel: three launches of ~4.4 us each in a CUDA graph (docs/benchmarks.md), 96 of each
a W2 call. Here SwiGLU is the GEMM's prologue and the partial products are summed by the next
residual add + RMSNorm (ops/add_rmsnorm.py, which takes them in place of the product): one
launch where there were three. A prefill's thousands of tokens stay with cuBLAS (the model
calls this op in decode steps only).

Triton kernel: one program per (block of BLOCK_M rows, block of BLOCK_N outputs, K_SPLIT
columns of I). It loads gate and up tiles, computes the activation as Inductor's compile of
`silu_mul.reference` does (HF rounds silu to the dtype before the product: an ulp apart at
times), and accumulates its dot with the weight tile in FP32 (IEEE in FP32: no TF32, and an
IEEE division in silu); it writes its FP32 partial product. Every program of a row block
recomputes the activation of its K_SPLIT columns: BLOCK_N trades that against the partials'
size. The split count is fixed by I and K_SPLIT, not by T, so that one compiled step serves
every batch size R.

Measured on the H200 (docs/benchmarks.md, 2026-12-01): the MLP tail with this kernel took 15.2
us at 100 rows against 14.2 for Inductor's SwiGLU, cuBLAS and the add + norm, and 2.3x their
time at 800 rows (the recomputed activation, short K loops, the partials' bytes): off by default.
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops.rounding import round_to

K_SPLIT = 320  # columns of I a program reduces: S = 16 partial products at I = 4,864


def splits(inter: int, k_split: int = K_SPLIT) -> int:
    return triton.cdiv(inter, k_split)


def activation(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in FP32, rounded once to x's dtype: what Inductor's compile of
    `silu_mul.reference` computes (HF rounds silu to the dtype first; the product differs from
    that by an ulp at times)."""
    gate, up = x.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def reference(x: torch.Tensor, weight: torch.Tensor, k_split: int = K_SPLIT) -> torch.Tensor:
    act = activation(x).float()
    w = weight.float()
    return torch.stack([a @ b.T for a, b in zip(act.split(k_split, dim=1), w.split(k_split, dim=1))])


def total(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The down projection's output from its partial products [S, T, H]: summed in split order
    (FP32), rounded to `dtype` as a GEMM rounds its output."""
    return functools.reduce(torch.add, partials.unbind(0)).to(dtype)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _swiglu_down_kernel(x_ptr, w_ptr, out_ptr, num_rows, stride_xt, INTER: tl.constexpr, HIDDEN: tl.constexpr,
                        K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        IEEE: tl.constexpr, SOFT_BF16: tl.constexpr):
    dtype = x_ptr.dtype.element_ty
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(2)
    row_ok = rows < num_rows
    col_ok = cols < HIDDEN
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        ks = split * K_SPLIT + k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < INTER
        gate_at = x_ptr + rows[:, None] * stride_xt + ks[None, :]
        mask = row_ok[:, None] & k_ok[None, :]
        gate = tl.load(gate_at, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gate_at + INTER, mask=mask, other=0.0).to(tl.float32)
        if IEEE:
            act = tl.div_rn(gate, 1.0 + tl.exp(-gate)) * up  # [M, K]
        else:  # the division's last FP32 bit hardly ever survives the rounding below
            act = gate / (1.0 + tl.exp(-gate)) * up
        act = round_to(act, dtype, SOFT_BF16)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * INTER + ks[:, None],
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)  # [K, N]
        if SOFT_BF16:  # the interpreter, whose bf16 dots are wrong (TOOLCHAIN.md): the same products in FP32
            acc = tl.dot(act.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
        elif IEEE:
            acc = tl.dot(act, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(act, w, acc)
    tl.store(out_ptr + split.to(tl.int64) * num_rows * HIDDEN + rows[:, None] * HIDDEN + cols[None, :], acc,
             mask=row_ok[:, None] & col_ok[None, :])


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEFAULT_CONFIG = (64, 128, 64, 4, 3)  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages: the best at 100 rows


def _check(x: torch.Tensor, weight: torch.Tensor, k_split: int, block_k: int) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != 2 * weight.shape[1]:
        raise ValueError(f"swiglu_down: expected x [T, 2I] (gate then up) and weight [H, I]; got x "
                         f"{tuple(x.shape)}, weight {tuple(weight.shape)}")
    if x.dtype not in SUPPORTED_DTYPES or weight.dtype != x.dtype:
        raise ValueError(f"swiglu_down: x and weight must share one dtype of bfloat16, float16, float32; "
                         f"got x {x.dtype}, weight {weight.dtype}")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError(f"swiglu_down: x's last dim and weight must be contiguous; got strides x {x.stride()}, "
                         f"weight {weight.stride()}")
    if x.device != weight.device:
        raise ValueError(f"swiglu_down: x and weight must be on one device; got x {x.device}, weight {weight.device}")
    if k_split % block_k:
        raise ValueError(f"swiglu_down: k_split {k_split} must be a multiple of block_k {block_k}")


def launch(x: torch.Tensor, weight: torch.Tensor, k_split: int = K_SPLIT,
           config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """Run the Triton kernel; same signature and result as `reference`. `config` (BLOCK_M,
    BLOCK_N, BLOCK_K, num_warps, num_stages) and `k_split` are overridable for tests and the
    kernel benchmark (bench/kernels.py `bench_swiglu_down`)."""
    block_m, block_n, block_k, num_warps, num_stages = config or DEFAULT_CONFIG
    _check(x, weight, k_split, block_k)
    num_rows, (hidden, inter) = x.shape[0], weight.shape
    parts = splits(inter, k_split)
    out = torch.empty((parts, num_rows, hidden), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(num_rows, block_m), triton.cdiv(hidden, block_n), parts)
    wrap_triton(_swiglu_down_kernel)[grid](
        x, weight, out, num_rows, x.stride(0), INTER=inter, HIDDEN=hidden, K_SPLIT=k_split, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32, SOFT_BF16=x.device.type == "cpu",
        num_warps=num_warps, num_stages=num_stages)
    return out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::swiglu_down", mutates_args=())
def swiglu_down(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return launch(x, weight)


@swiglu_down.register_kernel("cpu")
def _(x, weight):
    return reference(x, weight)


@swiglu_down.register_fake
def _(x, weight):
    return x.new_empty((splits(weight.shape[1]), x.shape[0], weight.shape[0]), dtype=torch.float32)


# Lowerings by name; the build config picks one per op and records it in the manifest. "separate":
# no fused op, the model applies silu_mul and down_proj as they are lowered.
IMPLEMENTATIONS = {"separate": None, "triton": swiglu_down}
