"""A beam decode step's RoPE of q and k and its K/V write into the suffix slot, in one kernel.

    qkv [B, (Nq + 2 Nkv) D] (the fused projection's output, B = R x W beams), cos / sin [B, D],
    suffix_k / suffix_v [L, B, S, Nkv, D] (every layer's suffix K/V, written in place), step [1]
    int64, layer -> q [B, Nq, D] (contiguous), with suffix_k[layer, :, step] = rope(k) and
    suffix_v[layer, :, step] = v (`reference` below is exactly the model's separate form:
    ops/rope.py twice, two index_copy_)

The op takes the whole buffers and the layer index, not the layer's view: AOTInductor (torch
2.13, CPU) passes a mutated view whose offset is symbolic to an opaque op at offset 0, so the
writes landed in layer 0 (a package with dynamic shapes; a test keeps the whole-buffer form).

Why: a decode layer of a Qwen2 model (no q/k norm) launched five small kernels between the qkv
GEMM and the prefix attention in the beam artifact of 2026-12-01 (b4ff011): RoPE of q, RoPE of k,
and three gathers / index copies that write k and v into slot `step` (docs/benchmarks.md). At
M = 100 rows each is 2-3 us of launch-bound work, 24 layers x 4 decode steps a call. Here each
beam row of qkv is read once; q is written roped, k roped and v as is straight into the slot.

Lowerings: "separate" (the default: no fused op, the model applies `rope` and index_copy_) and
"triton" (this kernel; the registered op runs `reference` on CPU). Models with a q/k norm (Qwen3)
keep the separate form: the norm comes first there (ops/qk_norm_rope.py).

Triton kernel: one program per block of BLOCK_T rows, all Nq + Nkv roped heads of each row in
their two halves, then the row's Nkv v heads. RoPE rounds as ops/rope.py: each product rounded
to the dtype, their sum rounded, with `round_to` on the bits (SOFT_BF16, on the GPU too, so that
no round trip is folded away): bf16 results equal the reference's bit for bit. The slot index is
read from `step` on the device (one compiled step serves every step). Bytes: qkv read once, q
written once, one slot of suffix_k and suffix_v written.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import rope
from boundgen.ops.rope import rotate_halves  # by name: Inductor copies a kernel's helpers by name
from boundgen.ops.qk_norm_rope import split_heads


def reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, suffix_k: torch.Tensor,
              suffix_v: torch.Tensor, step: torch.Tensor, layer: int, num_q_heads: int,
              num_kv_heads: int) -> torch.Tensor:
    q, k, v = split_heads(qkv, num_q_heads, num_kv_heads, suffix_k.shape[-1])
    suffix_k[layer].index_copy_(1, step, rope.reference(k, cos, sin)[:, None])
    suffix_v[layer].index_copy_(1, step, v[:, None])
    return rope.reference(q, cos, sin)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _rope_kv_write_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, sk_ptr, sv_ptr, step_ptr, layer, num_rows, stride_qkv,
                          stride_cos, stride_sin, stride_kl, stride_kb, stride_ks, stride_vl, stride_vb, stride_vs,
                          NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HALF: tl.constexpr, BLOCK_T: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_KV: tl.constexpr, SOFT_BF16: tl.constexpr):
    dtype = qkv_ptr.dtype.element_ty
    rows = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    heads = tl.arange(0, BLOCK_N)  # q heads, then k heads
    offs = tl.arange(0, HALF)
    r_ok = rows < num_rows
    mask = r_ok[:, None, None] & (heads < NUM_Q + NUM_KV)[None, :, None]  # [T, N, 1]
    step = tl.load(step_ptr)
    # tl.cast, not .to: Triton specialises an int argument equal to 1 into a constant (layer 1).
    sk_ptr += tl.cast(layer, tl.int64) * stride_kl  # this layer's [B, S, Nkv, D]
    sv_ptr += tl.cast(layer, tl.int64) * stride_vl

    x_at = qkv_ptr + rows[:, None, None] * stride_qkv + heads[None, :, None] * (2 * HALF) + offs[None, None, :]
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)  # [T, N, D/2]
    x2 = tl.load(x_at + HALF, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = rotate_halves(x1, x2, cos_ptr, sin_ptr, rows, stride_cos, stride_sin, r_ok, HALF, HALF, dtype,
                           SOFT_BF16)

    is_q = (heads < NUM_Q)[None, :, None]
    q_at = q_ptr + (rows[:, None, None] * NUM_Q + heads[None, :, None]) * (2 * HALF) + offs[None, None, :]
    tl.store(q_at, y1, mask=mask & is_q)
    tl.store(q_at + HALF, y2, mask=mask & is_q)
    k_at = (sk_ptr + rows[:, None, None] * stride_kb + step * stride_ks
            + (heads[None, :, None] - NUM_Q) * (2 * HALF) + offs[None, None, :])
    k_mask = mask & (heads >= NUM_Q)[None, :, None]
    tl.store(k_at, y1, mask=k_mask)
    tl.store(k_at + HALF, y2, mask=k_mask)

    kv = tl.arange(0, BLOCK_KV)
    dims = tl.arange(0, 2 * HALF)
    v_mask = r_ok[:, None, None] & (kv < NUM_KV)[None, :, None]
    v = tl.load(qkv_ptr + rows[:, None, None] * stride_qkv + (NUM_Q + NUM_KV + kv[None, :, None]) * (2 * HALF)
                + dims[None, None, :], mask=v_mask, other=0.0)
    tl.store(sv_ptr + rows[:, None, None] * stride_vb + step * stride_vs + kv[None, :, None] * (2 * HALF)
             + dims[None, None, :], v, mask=v_mask)


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(qkv, cos, sin, suffix_k, suffix_v, step, layer, num_q_heads, num_kv_heads) -> None:
    head_dim = suffix_k.shape[-1] if suffix_k.dim() == 5 else -1
    rows = qkv.shape[0] if qkv.dim() == 2 else -1
    if rows < 0 or head_dim < 2 or head_dim & (head_dim - 1) \
            or qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"rope_kv_write: expected qkv [B, (Nq + 2 Nkv) D] and suffix_k [L, B, S, Nkv, D] with D a "
                         f"power of two; got qkv {tuple(qkv.shape)}, suffix_k {tuple(suffix_k.shape)}, "
                         f"Nq {num_q_heads}, Nkv {num_kv_heads}")
    if suffix_v.shape != suffix_k.shape or suffix_k.shape[1] != rows or suffix_k.shape[3] != num_kv_heads:
        raise ValueError(f"rope_kv_write: suffix_k and suffix_v must both be [L, B={rows}, S, Nkv={num_kv_heads}, "
                         f"D]; got {tuple(suffix_k.shape)}, {tuple(suffix_v.shape)}")
    if not 0 <= layer < suffix_k.shape[0]:
        raise ValueError(f"rope_kv_write: layer {layer} is not one of the buffers' {suffix_k.shape[0]} layers")
    if tuple(cos.shape) != (rows, head_dim) or tuple(sin.shape) != (rows, head_dim):
        raise ValueError(f"rope_kv_write: cos / sin must be [B, D] = [{rows}, {head_dim}]; got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")
    if tuple(step.shape) != (1,) or step.dtype != torch.int64:
        raise ValueError(f"rope_kv_write: step must be a [1] int64 tensor; got {step.dtype} {tuple(step.shape)}")
    tensors = (qkv, cos, sin, suffix_k, suffix_v)
    if qkv.dtype not in SUPPORTED_DTYPES or any(t.dtype != qkv.dtype for t in tensors):
        raise ValueError(f"rope_kv_write: qkv, cos, sin and the suffix K/V must share one dtype of bfloat16, "
                         f"float16, float32; got {[t.dtype for t in tensors]}")
    if any(t.stride(-1) != 1 for t in (qkv, cos, sin)) or any(
            t.stride(4) != 1 or t.stride(3) != head_dim for t in (suffix_k, suffix_v)):
        raise ValueError("rope_kv_write: the last dim of qkv, cos and sin must be contiguous, and each suffix "
                         "slot's [Nkv, D] too")
    if len({t.device for t in (*tensors, step)}) != 1:
        raise ValueError("rope_kv_write: every tensor must be on one device")


def default_config(num_heads: int, head_dim: int) -> tuple[int, int]:
    """(BLOCK_T, num_warps): rows up to 512 half-row elements a program (Qwen2.5-0.5B: 16 roped
    heads x 32 = 512: one row). Fixed, not autotuned: deterministic builds. On the H200
    (2026-12-01, `bench_rope_kv_write(rows, block_ts=(1, 2, 4, 8))`) one row a program took 2.0 /
    2.1 / 2.5 / 3.2 us at 100 / 200 / 400 / 800 rows against 2.9 / 2.9 / 2.9 / 3.7 for four: a
    decode step's few hundred rows need every program they can get."""
    per_row = triton.next_power_of_2(num_heads) * (head_dim // 2)
    return max(1, 512 // per_row), 4


def launch(qkv, cos, sin, suffix_k, suffix_v, step, layer: int, num_q_heads: int, num_kv_heads: int,
           block_t: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Run the Triton kernel; same signature, result and writes as `reference`. The launch config
    is overridable for tests and benchmarks."""
    _check(qkv, cos, sin, suffix_k, suffix_v, step, layer, num_q_heads, num_kv_heads)
    rows, head_dim = qkv.shape[0], suffix_k.shape[-1]
    default_t, default_warps = default_config(num_q_heads + num_kv_heads, head_dim)
    block_t, num_warps = block_t or default_t, num_warps or default_warps
    q = torch.empty((rows, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    wrap_triton(_rope_kv_write_kernel)[(triton.cdiv(rows, block_t),)](
        qkv, cos, sin, q, suffix_k, suffix_v, step, layer, rows, qkv.stride(0), cos.stride(0), sin.stride(0),
        suffix_k.stride(0), suffix_k.stride(1), suffix_k.stride(2), suffix_v.stride(0), suffix_v.stride(1),
        suffix_v.stride(2),
        NUM_Q=num_q_heads, NUM_KV=num_kv_heads, HALF=head_dim // 2, BLOCK_T=block_t,
        BLOCK_N=triton.next_power_of_2(num_q_heads + num_kv_heads), BLOCK_KV=triton.next_power_of_2(num_kv_heads),
        SOFT_BF16=True, num_warps=num_warps)
    return q


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export (its writes declared); the kernel on CUDA, the
# reference on CPU.

@triton_op("boundgen::rope_kv_write", mutates_args={"suffix_k", "suffix_v"})
def rope_kv_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, suffix_k: torch.Tensor,
                  suffix_v: torch.Tensor, step: torch.Tensor, layer: int, num_q_heads: int,
                  num_kv_heads: int) -> torch.Tensor:
    return launch(qkv, cos, sin, suffix_k, suffix_v, step, layer, num_q_heads, num_kv_heads)


rope_kv_write.register_kernel("cpu")(reference)


@rope_kv_write.register_fake
def _(qkv, cos, sin, suffix_k, suffix_v, step, layer, num_q_heads, num_kv_heads):
    return qkv.new_empty((qkv.shape[0], num_q_heads, suffix_k.shape[-1]))


# Lowerings by name ("separate": no fused op, the model applies rope and index_copy_ as lowered).
IMPLEMENTATIONS = {"separate": None, "triton": rope_kv_write}
