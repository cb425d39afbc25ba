"""A beam decode layer's attention in one kernel: RoPE of q and k, the write of k and v into the
step's suffix slot, and the shared-prefix attention (ops/rope_kv_write.py, then
ops/prefix_attention.py, fused).

    qkv [B, (Nq + 2 Nkv) D] (the fused projection's output, B = R x W beams), cos / sin [B, D],
    k_prefix / v_prefix [T, Nkv, D] (this layer's K/V of the R packed prompts), suffix_k / suffix_v
    [L, B, S, Nkv, D] (every layer's suffix K/V, written in place), step [1] int64 in [0, S),
    cu_seqlens [R+1] int32, layer, width W, scale, Nq, Nkv -> out [B, Nq, D]
    with suffix_k[layer, :, step] = rope(k), suffix_v[layer, :, step] = v, and out the attention
    of rope(q) over the beam's prompt and slots [0, step] of its suffix.

`reference` is the two ops one after the other, as the model runs them without this lowering.

Why: a decode layer launched `rope_kv_write` and `prefix_attention` back to back, 24 layers x 4
decode steps of a W2 call: 96 launches of a few microseconds of work each, and in a CUDA graph a
launch costs ~4 us of a call whatever it does (docs/benchmarks.md). The rotated q never leaves
the kernel here, and this step's k and v are used from registers.

Lowerings: "separate" (the default: no fused op, the model calls the two ops as lowered) and
"triton" (this kernel; the registered op runs `reference` on CPU). Models with a q/k norm (Qwen3)
keep the separate form: the norm comes first there (ops/qk_norm_rope.py).

Measured (one H100, 2026-12-07, docs/benchmarks.md): **slower, so off.** At W2's shapes in a
CUDA graph the kernel takes 7.4 us against 6.2 for the pair at one request (100 beams) and 21.1
against 11.8 at eight; a call of one / eight W2 requests 7.28 / 13.93 ms against 7.20 / 13.16
with 96 kernels fewer, and W2 359.5 against 411.0 QPS within the budget in process. The launches
it saves cost ~1 us each, less than the rotations it takes on: each program rotates its 16 rows
of q and its beams' k once per query head that reads them (rope_kv_write: one row a program over
the whole grid), with 251 registers a thread (two programs an SM; prefix_attention 161).

Triton kernel: prefix_attention's (one program per block of BEAMS beams and a K/V head, its rows
the beams' query heads of that K/V head; ops/prefix_attention.py says why), which loads its rows
of q from qkv and rotates them with rope_kv_write's helper (rope.rotate_halves, the same
roundings: q is rope_kv_write's bit for bit), rotates its beams' k of this K/V head, and writes k
and v into slot `step` (the first row of each beam's group writes: each (beam, K/V head) has one
program, so nothing else reads or writes that slot meanwhile). It attends to the prompt and to
slots [0, step) as prefix_attention does (its helpers) and to slot `step` from registers, in the
same order: under the interpreter its output and writes are the separate pair's bit for bit;
compiled (an H100), its writes are and its output is within a bf16 ulp of theirs.
"""

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from boundgen.ops import prefix_attention, rope_kv_write
from boundgen.ops.prefix_attention import _attend_position, _attend_prompts  # by name: Inductor copies helpers
from boundgen.ops.rope import rotate_halves


def reference(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor,
              v_prefix: torch.Tensor, suffix_k: torch.Tensor, suffix_v: torch.Tensor, step: torch.Tensor,
              cu_seqlens: torch.Tensor, layer: int, width: int, scale: float, num_q_heads: int,
              num_kv_heads: int) -> torch.Tensor:
    q = rope_kv_write.reference(qkv, cos, sin, suffix_k, suffix_v, step, layer, num_q_heads, num_kv_heads)
    return prefix_attention.reference(q, k_prefix, v_prefix, suffix_k[layer], suffix_v[layer], step, cu_seqlens,
                                      width, scale)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _rotated_rows(at, rows, ok, cos_ptr, sin_ptr, stride_cos, stride_sin, ROWS: tl.constexpr,
                  HALF: tl.constexpr, dtype: tl.constexpr, SOFT_BF16: tl.constexpr):
    """RoPE of the head vectors at `at` [ROWS] (their halves at at and at + HALF), row i at the
    position of beam rows[i] (its cos / sin row): [ROWS, 2 HALF] in `dtype`, rounded as
    ops/rope.py rounds; rows not `ok` are 0."""
    offs = tl.arange(0, HALF)
    x1 = tl.load(at[:, None] + offs[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(at[:, None] + HALF + offs[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
    y1, y2 = rotate_halves(x1[:, None, :], x2[:, None, :], cos_ptr, sin_ptr, rows, stride_cos, stride_sin, ok,
                           HALF, HALF, dtype, SOFT_BF16)  # [ROWS, 1, HALF] each
    # [y1 | y2] per row: join gives [ROWS, 1, HALF, 2], the halves then go first
    y = tl.permute(tl.join(y1, y2), (0, 1, 3, 2))
    return tl.reshape(y, (ROWS, 2 * HALF))


@triton.jit
def _decode_attention_kernel(
        qkv_ptr, cos_ptr, sin_ptr, kp_ptr, vp_ptr, sk_ptr, sv_ptr, step_ptr, cu_ptr, out_ptr, layer, num_beams,
        width, qk_scale,
        stride_qkv, stride_cos, stride_sin, stride_kpl, stride_kph, stride_vpl, stride_vph,
        stride_kl, stride_kb, stride_ks, stride_vl, stride_vb, stride_vs, stride_ow, stride_oh,
        NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, GROUP_PAD: tl.constexpr, BEAMS: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, SOFT_BF16: tl.constexpr):
    dtype = qkv_ptr.dtype.element_ty
    GROUP: tl.constexpr = NUM_Q // NUM_KV
    ROWS: tl.constexpr = BEAMS * GROUP_PAD
    HALF: tl.constexpr = HEAD_DIM // 2
    kv_head = tl.program_id(1)
    rows = tl.arange(0, ROWS)  # row = beam in block * GROUP_PAD + head in group
    beam = tl.program_id(0) * BEAMS + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    beam_ok = beam < num_beams
    row_ok = beam_ok & (rows % GROUP_PAD < GROUP)
    beam64 = beam.to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    step = tl.load(step_ptr)

    # This step's q (the row's head), rotated; its k (the row's beam's, this K/V head) too, and v as it is.
    row_at = qkv_ptr + beam64 * stride_qkv  # [R]
    q = _rotated_rows(row_at + head * HEAD_DIM, beam64, row_ok, cos_ptr, sin_ptr, stride_cos, stride_sin, ROWS, HALF,
                      dtype, SOFT_BF16)  # [R, D]
    k_new = _rotated_rows(row_at + (NUM_Q + kv_head) * HEAD_DIM, beam64, beam_ok, cos_ptr, sin_ptr, stride_cos,
                          stride_sin, ROWS, HALF, dtype, SOFT_BF16)
    v_new = tl.load(row_at[:, None] + (NUM_Q + NUM_KV + kv_head) * HEAD_DIM + offs_d[None, :],
                    mask=beam_ok[:, None], other=0.0)
    # tl.cast, not .to: Triton specialises an int argument equal to 1 into a constant (layer 1).
    sk_ptr += tl.cast(layer, tl.int64) * stride_kl + kv_head * HEAD_DIM  # this layer's [B, S, Nkv, D], this head
    sv_ptr += tl.cast(layer, tl.int64) * stride_vl + kv_head * HEAD_DIM
    writes = (beam_ok & (rows % GROUP_PAD == 0))[:, None]  # into slot `step`: one row a beam writes
    tl.store(sk_ptr + beam64[:, None] * stride_kb + step * stride_ks + offs_d[None, :], k_new, mask=writes)
    tl.store(sv_ptr + beam64[:, None] * stride_vb + step * stride_vs + offs_d[None, :], v_new, mask=writes)

    # The prompt: each row's rows [start, end) of the packed prompts; pad beams take the last beam's.
    request = tl.minimum(beam, num_beams - 1) // width
    start = tl.load(cu_ptr + request)
    end = tl.load(cu_ptr + request + 1)
    acc, l_i, m_i = _attend_prompts(q, kp_ptr + kv_head * stride_kph, vp_ptr + kv_head * stride_vph, stride_kpl,
                                    stride_vpl, start, end, offs_d, qk_scale, ROWS, HEAD_DIM, BLOCK_N, IEEE)

    # The suffix: slots [0, step) of the row's own beam from the buffer, then slot `step` from registers.
    qf = q.to(tl.float32)
    for j in range(0, step):
        k = tl.load(sk_ptr + beam64[:, None] * stride_kb + j * stride_ks + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        v = tl.load(sv_ptr + beam64[:, None] * stride_vb + j * stride_vs + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)
        acc, l_i, m_i = _attend_position(acc, l_i, m_i, qf, k, v, qk_scale)
    acc, l_i, m_i = _attend_position(acc, l_i, m_i, qf, k_new, v_new, qk_scale)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + beam64[:, None] * stride_ow + head[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Launcher

def _check(qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu_seqlens, layer, width, num_q_heads,
           num_kv_heads) -> None:
    """The two ops' own checks, on the views the separate pair would be given; named after this op."""
    try:
        rope_kv_write._check(qkv, cos, sin, suffix_k, suffix_v, step, layer, num_q_heads, num_kv_heads)
        head_dim = suffix_k.shape[-1]
        q = qkv[:, :num_q_heads * head_dim].unflatten(1, (num_q_heads, head_dim))
        prefix_attention._check(q, k_prefix, v_prefix, suffix_k[layer], suffix_v[layer], step, cu_seqlens, width)
    except ValueError as err:
        raise ValueError(f"decode_attention: {err}") from None


def launch_pair(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor,
                v_prefix: torch.Tensor, suffix_k: torch.Tensor, suffix_v: torch.Tensor, step: torch.Tensor,
                cu_seqlens: torch.Tensor, layer: int, width: int, scale: float, num_q_heads: int,
                num_kv_heads: int) -> torch.Tensor:
    """The two kernels this one fuses, one after the other (what a decode layer launches without this
    lowering): rope_kv_write, then prefix_attention; `launch`'s signature, for its tests and benchmark."""
    q = rope_kv_write.launch(qkv, cos, sin, suffix_k, suffix_v, step, layer, num_q_heads, num_kv_heads)
    return prefix_attention.launch(q, k_prefix, v_prefix, suffix_k[layer], suffix_v[layer], step, cu_seqlens, width,
                                   scale)


def launch(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
           suffix_k: torch.Tensor, suffix_v: torch.Tensor, step: torch.Tensor, cu_seqlens: torch.Tensor, layer: int,
           width: int, scale: float, num_q_heads: int, num_kv_heads: int, beams_per_program: int | None = None,
           block_n: int = 64) -> torch.Tensor:
    """Run the Triton kernel; same signature, result and writes as `reference`. The launch config
    (prefix_attention's) is overridable for tests and benchmarks."""
    _check(qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu_seqlens, layer, width, num_q_heads,
           num_kv_heads)
    beams_total, head_dim = qkv.shape[0], suffix_k.shape[-1]
    beams, group_pad = prefix_attention.program_rows(num_q_heads // num_kv_heads, beams_per_program)
    out = torch.empty((beams_total, num_q_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    grid = (triton.cdiv(beams_total, beams), num_kv_heads)
    wrap_triton(_decode_attention_kernel)[grid](
        qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu_seqlens, out, layer, beams_total, width,
        scale * math.log2(math.e),
        qkv.stride(0), cos.stride(0), sin.stride(0), k_prefix.stride(0), k_prefix.stride(1), v_prefix.stride(0),
        v_prefix.stride(1), suffix_k.stride(0), suffix_k.stride(1), suffix_k.stride(2), suffix_v.stride(0),
        suffix_v.stride(1), suffix_v.stride(2), out.stride(0), out.stride(1),
        NUM_Q=num_q_heads, NUM_KV=num_kv_heads, GROUP_PAD=group_pad, BEAMS=beams, HEAD_DIM=head_dim,
        BLOCK_N=block_n, IEEE=qkv.dtype == torch.float32, SOFT_BF16=True, num_warps=4, num_stages=2)
    return out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export (its writes declared); the kernel on CUDA, the
# reference on CPU.

@triton_op("boundgen::decode_attention", mutates_args={"suffix_k", "suffix_v"})
def decode_attention(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_prefix: torch.Tensor,
                     v_prefix: torch.Tensor, suffix_k: torch.Tensor, suffix_v: torch.Tensor, step: torch.Tensor,
                     cu_seqlens: torch.Tensor, layer: int, width: int, scale: float, num_q_heads: int,
                     num_kv_heads: int) -> torch.Tensor:
    return launch(qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu_seqlens, layer, width, scale,
                  num_q_heads, num_kv_heads)


decode_attention.register_kernel("cpu")(reference)


@decode_attention.register_fake
def _(qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu_seqlens, layer, width, scale, num_q_heads,
      num_kv_heads):
    return qkv.new_empty((qkv.shape[0], num_q_heads, suffix_k.shape[-1]))


# Lowerings by name ("separate": no fused op, the model calls rope_kv_write and prefix_attention as lowered).
IMPLEMENTATIONS = {"separate": None, "triton": decode_attention}
