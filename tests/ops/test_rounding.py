"""round_to: FP32 -> bf16/fp16 rounding to nearest even in a kernel, under the interpreter as on
the GPU (the interpreter's own bf16 cast truncates); `rounded`, the same value kept in FP32."""

import pytest
import torch
import triton
import triton.language as tl

from boundgen.ops.rounding import round_to, rounded, rounded_fp
from tests.ops.kernel_testing import KERNEL_DEVICE, needs_kernel


@triton.jit
def _round_kernel(x_ptr, out_ptr, N: tl.constexpr, SOFT_BF16: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, round_to(tl.load(x_ptr + offs), out_ptr.dtype.element_ty, SOFT_BF16))


@triton.jit
def _rounded_kernel(x_ptr, out_ptr, N: tl.constexpr, DTYPE: tl.constexpr, SOFT_BF16: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, rounded(tl.load(x_ptr + offs), DTYPE, SOFT_BF16))


def _inputs(dtype):
    """FP32 values: random, products of two `dtype` values, exact ties of `dtype`, inf, NaN, zeros, limits."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(1024, generator=gen).to(dtype).float() for _ in range(2))
    ties = (torch.randint(-3000, 3000, (512,), generator=gen).to(dtype).float() + 0.5) * 2.0 ** -7
    x = torch.cat([torch.randn(1024, generator=gen) * 100, a * b, ties,
                   torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 3.4e38,
                                 65519.0, 65520.0])])
    return torch.nn.functional.pad(x, (0, 4096 - x.numel())).to(KERNEL_DEVICE)


@needs_kernel
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_rounded_is_the_bf16_value_in_fp32():
    """The soft path (every device) and the cast path (the GPU's) give torch's bf16 values, in FP32."""
    x = _inputs(torch.bfloat16)
    expected = x.to(torch.bfloat16).float()
    for soft in (True, False) if x.device.type == "cuda" else (True,):
        out = torch.empty_like(x)
        _rounded_kernel[(1,)](x, out, N=x.numel(), DTYPE=tl.bfloat16, SOFT_BF16=soft)
        same = (out == expected) | (out.isnan() & expected.isnan())
        assert bool(same.all()), (soft, x[~same][:5], out[~same][:5], expected[~same][:5])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # numpy, 3.4e38 -> fp16 (inf)
def test_round_to_matches_torch_cast(dtype):
    x = _inputs(dtype)
    out = torch.empty(x.shape, dtype=dtype, device=KERNEL_DEVICE)
    _round_kernel[(1,)](x, out, N=x.numel(), SOFT_BF16=x.device.type == "cpu")
    expected = x.to(dtype)
    same = (out == expected) | (out.isnan() & expected.isnan())
    assert bool(same.all()), (x[~same][:5], out[~same][:5], expected[~same][:5])


@triton.jit
def _rounded_fp_kernel(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, rounded_fp(tl.load(x_ptr + offs), tl.bfloat16))


@needs_kernel
def test_rounded_fp_is_the_bf16_value_in_fp32():
    """Veltkamp's split gives torch's bf16 values for zero and normal FP32 below 2^111: random
    magnitudes, products of two bf16 values, exact ties (to even both ways), the range's ends."""
    x = _inputs(torch.bfloat16)
    x = torch.where(x.isfinite() & (x.abs() < 2.0 ** 111), x, torch.zeros_like(x))
    edges = torch.tensor([2.0 ** -126, -(2.0 ** -126), 2.0 ** 110 * 1.999, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8,
                          -(1.0 + 2 ** -8), 255.5, 256.5], device=x.device)
    x = torch.cat([x[:-edges.numel()], edges])
    out = torch.empty_like(x)
    _rounded_fp_kernel[(1,)](x, out, N=x.numel())
    assert torch.equal(out, x.to(torch.bfloat16).float()), (x[out != x.to(torch.bfloat16).float()][:5])


@triton.jit
def _rounded_fp16_kernel(x_ptr, fp_ptr, soft_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    tl.store(fp_ptr + offs, rounded_fp(x, tl.float16))
    tl.store(soft_ptr + offs, rounded(x, tl.float16, True))


@needs_kernel
def test_rounded_fp_and_the_soft_path_are_the_fp16_value_in_fp32():
    """fp16 in FP32 arithmetic (a cast round trip may be folded away on the GPU): torch's fp16 values
    over fp16's finite range, normal and subnormal: random magnitudes, products of two fp16 values,
    exact ties of both grids (to even both ways), the ends of each range, FP32 subnormals."""
    gen = torch.Generator().manual_seed(1)
    a, b = (torch.randn(1024, generator=gen).half().float() for _ in range(2))
    magnitudes = torch.randn(1024, generator=gen) * 2.0 ** torch.randint(-30, 16, (1024,), generator=gen)
    normal_ties = (torch.randint(-3000, 3000, (256,), generator=gen).float() + 0.5) * 2.0 ** -10
    subnormal_ties = (torch.randint(-1023, 1023, (256,), generator=gen).float() + 0.5) * 2.0 ** -24
    edges = torch.tensor([65504.0, -65504.0, 65519.0, 2.0 ** -14, 2.0 ** -14 * (1 - 2 ** -12), -(2.0 ** -14),
                          2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 3 * 2.0 ** -25, 2.0 ** -126, 1e-40, -1e-40,
                          -(2.0 ** -26), 0.0, -0.0])
    x = torch.cat([magnitudes.clamp(-65519, 65519), a * b, normal_ties, subnormal_ties, edges])
    x = torch.nn.functional.pad(x, (0, 4096 - x.numel())).to(KERNEL_DEVICE)
    fp, soft = torch.empty_like(x), torch.empty_like(x)
    _rounded_fp16_kernel[(1,)](x, fp, soft, N=x.numel())
    expected = x.half().float().view(torch.int32)  # bit for bit: a zero's sign too
    for out in (fp.view(torch.int32), soft.view(torch.int32)):
        wrong = out != expected
        assert not bool(wrong.any()), (x[wrong][:5], out[wrong][:5].view(torch.float32))
