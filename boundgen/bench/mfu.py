"""Effective MFU: the seed's "mixed-precision effective MFU", as docs ARCHITECTURE.md defines it.

    effective MFU = QPS x (F_bf16 / P_bf16 + F_fp8 / P_fp8)

F is the *logical* matmul work of one request (FMA = 2 FLOPs): the linear layers, the LM head
and attention. Not counted: padding or tile rounding, quantisation and scales, elementwise ops,
norms, softmax / log-softmax, top-k and beam bookkeeping, tokenisation, transfers.

Per token, per layer (hidden H, q size Q = N_q x D, kv size K = N_kv x D, intermediate I):
    qkv_proj 2 H (Q + 2K)   o_proj 2 Q H   gate_up_proj 2 H (2I)   down_proj 2 I H
Attention: a query at position j attends to keys 0..j (causal, itself included), and each
(query, key) pair costs 4 D FLOPs per query head (Q K^T and P V): a prefill of n tokens is
n (n + 1) / 2 pairs - the causal half of the n x n square, diagonal included.
LM head: 2 H V per row (V = full vocabulary).

Request shapes:
- score: linear work over sum(L_i) packed tokens, attention per sample, and the LM head at one
  row per sample over the full vocabulary. Choice: our score program multiplies only the label
  rows (B x H x L), but we count the full-vocabulary row as the seed does, so numbers compare
  with the seed's and with the peer, which computes all V logits at the last position.
- beam (prompt P, width W, N_gen steps): the prompt once (P tokens, P (P + 1) / 2 pairs); then
  W x (N_gen - 1) decode tokens, the token of decode step k (k = 1..N_gen-1) attending to P + k
  keys; the LM head at 1 + W x (N_gen - 1) rows.

Precision: attention is always BF16; each linear group listed in `fp8_groups` (names of the
model's parameters: qkv_proj, o_proj, gate_up_proj, down_proj, lm_head; aliases "attn" and
"mlp") counts at the FP8 peak. H200 dense peaks: 989 TFLOP/s BF16, 1979 TFLOP/s FP8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

H200_PEAKS = {"bf16": 989e12, "fp8": 1979e12}  # dense FLOP/s
# Dense peaks of the GPUs whose numbers we know, by a part of their device name; MFU is shown only
# against one of these (on a CPU, or another GPU, a percentage of the H200 would mean nothing).
KNOWN_PEAKS = {"H200": H200_PEAKS, "H100": H200_PEAKS}  # the H200 is the H100's compute with more memory


def peaks_for(device_name: str | None) -> dict | None:
    """The dense peaks of the device `device_name` names ("NVIDIA H200", "cpu", ...); None if unknown."""
    for key, peaks in KNOWN_PEAKS.items():
        if device_name and key in device_name:
            return peaks
    return None
LINEAR_GROUPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
GROUP_ALIASES = {"attn": ("qkv_proj", "o_proj"), "mlp": ("gate_up_proj", "down_proj")}


@dataclass(frozen=True)
class ModelShape:
    """The sizes that decide matmul work. Anything with these attributes (ModelConfig) converts."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int

    def __post_init__(self):
        for name, value in vars(self).items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelShape.{name} must be a positive integer, got {value!r}")

    @classmethod
    def of(cls, cfg) -> "ModelShape":
        """From a `boundgen.model.config.ModelConfig` (or anything with the same attribute names)."""
        return cls(cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                   cfg.intermediate_size, cfg.vocab_size)

    def linear_flops_per_token(self) -> dict[str, int]:
        """Per token, all layers, by linear group (LM head excluded: it runs on selected rows)."""
        h, q, kv, i, n = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size, self.num_layers
        return {
            "qkv_proj": n * 2 * h * (q + 2 * kv),
            "o_proj": n * 2 * q * h,
            "gate_up_proj": n * 2 * h * 2 * i,
            "down_proj": n * 2 * i * h,
        }

    @property
    def attention_flops_per_pair(self) -> int:
        return self.num_layers * self.num_heads * 4 * self.head_dim

    @property
    def lm_head_flops_per_row(self) -> int:
        return 2 * self.hidden_size * self.vocab_size


# The workload shapes of ARCHITECTURE.md (the demo presets of the same names).
SHAPES = {
    "qwen3-0.6b": ModelShape(hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128,
                             intermediate_size=3072, vocab_size=151936),
    "qwen2.5-0.5b": ModelShape(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                               intermediate_size=4864, vocab_size=151936),
}


@dataclass(frozen=True)
class RequestFlops:
    """Logical FLOPs of one request by group: the linear groups, "lm_head" and "attention"."""

    by_group: dict

    @property
    def total(self) -> float:
        return float(sum(self.by_group.values()))

    def split(self, fp8_groups: Iterable[str] = ()) -> tuple[float, float]:
        """(F_bf16, F_fp8) when the named linear groups run in FP8."""
        fp8 = expand_groups(fp8_groups)
        f8 = float(sum(v for k, v in self.by_group.items() if k in fp8))
        return self.total - f8, f8

    def peak_seconds(self, fp8_groups: Iterable[str] = (), peaks: dict = H200_PEAKS) -> float:
        """F_bf16 / P_bf16 + F_fp8 / P_fp8: the request's time at peak; x QPS = effective MFU."""
        bf16, fp8 = self.split(fp8_groups)
        return bf16 / peaks["bf16"] + fp8 / peaks["fp8"]


def expand_groups(groups: Iterable[str]) -> set[str]:
    out = set()
    for g in groups:
        if g in GROUP_ALIASES:
            out.update(GROUP_ALIASES[g])
        elif g in LINEAR_GROUPS:
            out.add(g)
        else:
            known = ", ".join(LINEAR_GROUPS + tuple(GROUP_ALIASES))
            raise ValueError(f"unknown FP8 linear group {g!r}; expected one of {known}")
    return out


def _flops(shape: ModelShape, tokens: int, pairs: int, lm_rows: int) -> RequestFlops:
    by_group = {k: v * tokens for k, v in shape.linear_flops_per_token().items()}
    by_group["lm_head"] = shape.lm_head_flops_per_row * lm_rows
    by_group["attention"] = shape.attention_flops_per_pair * pairs
    return RequestFlops(by_group)


def score_flops(shape: ModelShape, lengths: Sequence[int]) -> RequestFlops:
    """A score request of samples with these token counts (LM head: one full-vocab row per sample)."""
    if not lengths or any(n <= 0 for n in lengths):
        raise ValueError(f"score lengths must be a non-empty list of positive token counts, got {list(lengths)}")
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    return _flops(shape, sum(lengths), pairs, len(lengths))


def beam_flops(shape: ModelShape, prompt_len: int, width: int, steps: int) -> RequestFlops:
    """A beam request: prompt once, W x (N_gen - 1) decode tokens, LM head at 1 + W x (N_gen - 1) rows."""
    if prompt_len <= 0 or width <= 0 or steps <= 0:
        raise ValueError(f"beam shape must be positive, got prompt_len={prompt_len} width={width} steps={steps}")
    decode = width * (steps - 1)
    pairs = prompt_len * (prompt_len + 1) // 2 + width * sum(prompt_len + k for k in range(1, steps))
    return _flops(shape, prompt_len + decode, pairs, 1 + decode)


def effective_mfu(qps: float, flops: RequestFlops, fp8_groups: Iterable[str] = (),
                  peaks: dict = H200_PEAKS) -> float:
    """The seed's effective MFU, as a fraction (0.058 = 5.8%)."""
    return qps * flops.peak_seconds(fp8_groups, peaks)
