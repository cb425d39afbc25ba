"""Selective FP8: a model's MLP projections in E4M3 (`boundgen build --fp8 mlp`), or its MLP and
attention projections (`--fp8 mlp,attn`).

What the original system did (section 3.4 of its article): the MLP's gate/up and down projections
run in FP8, everything numerically sensitive stays as it was (attention and its softmax state, the
norms, the label softmax, the scores). `mlp,attn` puts the attention's qkv and output projections
in E4M3 too; the attention itself, the q/k norms and RoPE stay as they were. Here:

- weights: quantized once at build, one FP32 scale per output channel (row of [N, K]):
  scale = amax(|row|) / 448, w_q = round(w / scale) in E4M3 (`quantize_rows`);
- activations: quantized on the fly, one scale per token row, the same way (ops/e4m3.py): by
  Inductor after the kernel that produces them, or in that kernel itself: the gate/up input in the
  residual add + norm's (`--lowering add_rmsnorm_quant=triton`; with "mlp,attn" the qkv input
  too, in the input norm's kernel, the first layer's plain RMSNorm included), the down input in
  SwiGLU's (`--lowering silu_quant=triton`, one pass over the row); the output projection's input
  (the attention's output) always by Inductor after the attention kernel: the attention's programs
  each write one head of a row, so a row's amax would need a pass of its own anyway;
- a bias (Qwen2's qkv projection, Qwen3's with `attention_bias`): added to the bf16 product, as a
  separate add (one rounding more than a GEMM epilogue's; the same on CUDA and in the emulation,
  and left for Inductor to fuse into the op that reads the product);
- the product: `torch._scaled_mm` (rowwise scales, bf16 out) on CUDA; elsewhere the same
  arithmetic emulated in FP32 (dequantize, matmul, round to the model dtype), which is what the
  CPU tests and CPU builds run.

Bf16 models only: rowwise `_scaled_mm` writes bf16. Measured on the H200 (docs/benchmarks.md,
2026-12-01, `bench.gemms`): with the activation already in E4M3 the W1 gate_up GEMM takes 32 / 59
/ 110 us at 2,250 / 4,500 / 9,000 tokens against 42 / 81 / 156 in bf16, down 20 / 31 / 51 against
21 / 39 / 75; with the activation's quantization as separate torch ops in the timed call FP8 is
2-5x slower. In a W1 build Inductor's quantizing kernels take 14.5% of the GPU time, and the build
still serves 6.7% more than bf16; with both quantizations fused into the producing kernels, 13.4%
more (228.0 against 201.0 QPS within the budget, one run, 0e668eb).
"""

from __future__ import annotations

import torch
from torch import nn

from boundgen.errors import ConfigError
from boundgen.ops.e4m3 import E4M3, E4M3_MAX, quantize_rows  # noqa: F401 (re-exported for callers and tests)

PROJECTIONS = {  # mode -> the projections it puts in E4M3, by module (layer.<module>.<projection>)
    "none": (),
    "mlp": (("mlp", "gate_up_proj"), ("mlp", "down_proj")),
    "mlp,attn": (("mlp", "gate_up_proj"), ("mlp", "down_proj"), ("self_attn", "qkv_proj"), ("self_attn", "o_proj")),
}
MODES = tuple(PROJECTIONS)


class FP8Linear(nn.Module):
    """An nn.Linear whose weight is E4M3 with per-output-channel scales; the input is quantized per
    row at each call. Output in the original weight's dtype; the bias, if any, kept in that dtype
    and added to the product."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight_q, weight_scale = quantize_rows(linear.weight.detach())
        self.register_buffer("weight_q", weight_q)  # [N, K] E4M3
        self.register_buffer("weight_scale", weight_scale)  # [N, 1] FP32
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())  # [N]
        self.out_dtype = linear.weight.dtype

    @property
    def in_features(self) -> int:
        return self.weight_q.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight_q.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantized(*quantize_rows(x))

    def quantized(self, x_q: torch.Tensor, x_scale: torch.Tensor) -> torch.Tensor:
        """The product of an input already in E4M3 rows (x_q [M, K], x_scale [M, 1] FP32), as a
        producing kernel with the quantization fused writes it (ops/silu_quant.py)."""
        if x_q.is_cuda:
            out = torch._scaled_mm(x_q, self.weight_q.t(), scale_a=x_scale, scale_b=self.weight_scale.t(),
                                   out_dtype=self.out_dtype)
        else:
            out = emulated_scaled_mm(x_q, x_scale, self.weight_q, self.weight_scale, self.out_dtype)
        return out if self.bias is None else out + self.bias


def emulated_scaled_mm(x_q, x_scale, w_q, w_scale, out_dtype) -> torch.Tensor:
    """`torch._scaled_mm(x_q, w_q.t(), x_scale, w_scale.t())` in FP32: the reference of the CUDA
    path up to the order of its FP32 sums."""
    return ((x_q.float() * x_scale) @ (w_q.float() * w_scale).t()).to(out_dtype)


def check_mode(mode: str, dtype: str | None = None) -> None:
    """A known mode, and (with `dtype`) one that the model dtype allows."""
    if mode not in MODES:
        raise ConfigError(f"fp8 must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    if dtype is not None and mode != "none" and dtype != "bfloat16":
        raise ConfigError(f"--fp8 {mode} needs --dtype bfloat16 (rowwise FP8 GEMMs write bf16); got {dtype}")


def quantize(model: nn.Module, mode: str) -> nn.Module:
    """Put the projections `mode` names in FP8, in place ("none": leave the model as it is)."""
    check_mode(mode)
    if mode == "none":
        return model
    for layer in model.layers:
        for module_name, projection in PROJECTIONS[mode]:
            module = getattr(layer, module_name)
            setattr(module, projection, FP8Linear(getattr(module, projection)))
    return model
