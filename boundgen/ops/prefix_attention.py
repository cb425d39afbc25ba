"""Shared-prefix beam attention over R packed requests: W decode queries per request over that
request's prompt K/V plus per-beam suffix K/V.

Requests are packed as in prefill: the prompts' K/V `[T, N_kv, D]` (T = all prompt tokens),
request r owning rows cu_seqlens[r]:cu_seqlens[r+1], each prompt stored once. Beams are packed
request by request, `width` (W) each: beam b belongs to request b // W and has its own suffix
K/V buffer (the tokens it generated so far, including the current one), of which slots
[0, step[0]] are valid: n = step[0] + 1 positions. The query of beam b attends to its request's prefix rows and
suffix positions [0, n) of its own suffix in one softmax; no concatenation of K/V, no page
table. GQA as in packed attention. `step` is a tensor, not a shape, so one compiled decode step
serves every step: the suffix buffer keeps its full capacity L_s and the step sets n. The op takes
the step itself (the slot this step's token was written to), not n: a count computed from it in
the graph is a cheap pointwise value with one user per layer, which Inductor recomputes into a
buffer of its own for each opaque kernel that reads it (24 one-element kernels a decode step on
the H200, 2026-12-01); the step is a graph input, passed to every layer as it is.

    r = b // W,  keys(b) = prefix[cu_seqlens[r]:cu_seqlens[r+1]] ++ suffix[b, :n]
    out[b, h] = softmax over keys(b) of scale * q[b, h] . k, applied to v

Shapes: q [R*W, N_q, D], k_prefix/v_prefix [T, N_kv, D], k_suffix/v_suffix [R*W, L_s, N_kv, D]
(L_s may be 0), step [1] int64 on q's device holding n - 1 in [-1, L_s - 1] (not checked: reading
it on the host would sync), cu_seqlens [R+1] int32 -> out [R*W, N_q, D] in q's dtype. Suffix
positions >= n never reach the output, whatever they hold (NaN and inf included). Softmax in
FP32. A beam whose prompt is empty and n = 0 has no keys: NaN in the reference, 0 in the kernel.
Bytes moved by a fused kernel: each request's prefix K/V once per (beam block, kv head)
program, i.e. about ceil(W / BW) * T * N_kv * D * 2 * dtype bytes from L2 (the prefixes
themselves, T * N_kv * D * 2 * dtype bytes, are read from HBM about once), the n valid suffix
positions once, q and out once. FLOPs 4 * D * N_q * sum_r W * (L_p(r) + n).

Triton kernel:
- One program per (block of BW beams, kv head); its rows are the BW x G query heads that read
  that kv head (G = N_q / N_kv, padded to a power of two). A block's beams share their prompt
  when BW divides W, so its tiles are one tensor-core dot per tile over all rows: rows
  [BW * G_pad, D] @ k_prefix tile [D, BLOCK_N]. tl.dot needs >= 16 rows, so rows are padded to
  16 when BW * G_pad is smaller. Default BW = 16 // G_pad: one minimum MMA tile of real rows
  (Qwen2.5 G=7 -> G_pad 8, BW 2; Qwen3-0.6B G=2 -> BW 8), reading the prefix W / BW times from
  L2 instead of W times. BW = 1 is the plain "one program per (beam, kv head)" layout; both
  are in the kernel benchmark.
- Per-row prefix ranges: each row loads its request's [start, end) from cu_seqlens; the block
  visits the union of its rows' ranges (contiguous, since requests are packed in order) and
  masks each row's scores to its own range. A block whose beams span two requests (BW not
  dividing W, e.g. Qwen3's BW 8 at W 100) reads both prompts: ~one such block per request.
- The suffix is per beam and short (L_s <= N_gen - 1, a handful), so its positions are visited
  one at a time with FP32 dot products on CUDA cores, reading each beam's rows by stride (a
  non-contiguous buffer view is read in place, nothing is copied). The loop bound n = step + 1
  is loaded from `step` on the device; positions >= n are never loaded.
- No split-K over the prefix. At W2/W3 shapes the grid has R * W / BW * N_kv programs of
  ceil(L_p / 64) <= 7 key tiles each; split-K would add a combine pass (a second launch or
  atomics) to save a few tile latencies. Revisit if the kernel benchmark shows long prompts
  latency-bound on too few programs.
- Online softmax in FP32 (exp2, scale * log2(e) folded in); FP32 inputs use IEEE dots.
"""

import math

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


def reference(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
              k_suffix: torch.Tensor, v_suffix: torch.Tensor, step: torch.Tensor,
              cu_seqlens: torch.Tensor, width: int, scale: float) -> torch.Tensor:
    beams, num_q_heads, head_dim = q.shape
    num_kv_heads = k_prefix.shape[1]
    group = num_q_heads // num_kv_heads
    prefix_len = k_prefix.shape[0]
    qg = q.reshape(beams, num_kv_heads, group, head_dim).to(torch.float32)  # [RW, Nkv, G, D]
    s_prefix = torch.einsum("bkgd,tkd->bkgt", qg, k_prefix.to(torch.float32))  # [RW, Nkv, G, T]
    # Suffix positions >= n are zeroed before use (0 * NaN would be NaN) and masked from the
    # softmax: a mask from a tensor compare, no .item(), so torch.export keeps n an input.
    valid = torch.arange(k_suffix.shape[1], device=q.device) <= step  # [Ls]
    k_suffix = torch.where(valid[:, None, None], k_suffix.to(torch.float32), 0.0)
    v_suffix = torch.where(valid[:, None, None], v_suffix.to(torch.float32), 0.0)
    s_suffix = torch.einsum("bkgd,bskd->bkgs", qg, k_suffix)  # [RW, Nkv, G, Ls]
    s_suffix = s_suffix.masked_fill(~valid, float("-inf"))
    request = torch.arange(beams, device=q.device) // width  # [RW]
    cu = cu_seqlens.to(torch.int64)
    pos = torch.arange(prefix_len, device=q.device)  # [T]
    own = (pos >= cu[request, None]) & (pos < cu[request + 1, None])  # [RW, T]
    s_prefix = s_prefix.masked_fill(~own[:, None, None, :], float("-inf"))
    probs = torch.softmax(torch.cat((s_prefix, s_suffix), dim=-1) * scale, dim=-1)
    p_prefix, p_suffix = probs[..., :prefix_len], probs[..., prefix_len:]
    # Prompt rows after the last prompt (padding for CUDA graphs) belong to no request: their
    # values may be anything, NaN included (the packed attention kernel leaves them unwritten),
    # and 0 * NaN is NaN, so they are zeroed like the suffix's.
    in_prompt = pos < cu[-1]  # [T]
    v_prefix = torch.where(in_prompt[:, None, None], v_prefix.to(torch.float32), 0.0)
    out = torch.einsum("bkgt,tkd->bkgd", p_prefix, v_prefix)
    out = out + torch.einsum("bkgs,bskd->bkgd", p_suffix, v_suffix)
    return out.reshape(beams, num_q_heads, head_dim).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# Triton kernel

@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b with FP32 accumulation; IEEE for FP32 operands (else TF32 on the GPU)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _attend_prompts(q, kp_ptr, vp_ptr, stride_kpl, stride_vpl, start, end, offs_d, qk_scale,
                    ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """Online softmax of the rows q [ROWS, D] over each row's prompt keys [start, end) (one K/V head's
    rows of the packed prompts at kp_ptr / vp_ptr): the union of the rows' ranges, one tensor-core dot
    per key tile, each row's scores masked to its own range. Returns (acc [ROWS, D], l_i, m_i) FP32."""
    acc = tl.zeros([ROWS, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    m_i = tl.full([ROWS], -1.0e30, dtype=tl.float32)  # finite: no NaN in pad rows
    block_end = tl.max(end, axis=0)
    for start_n in range(tl.min(start, axis=0), block_end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        in_range = offs_n < block_end
        k = tl.load(kp_ptr + offs_n[None, :] * stride_kpl + offs_d[:, None],
                    mask=in_range[None, :], other=0.0)  # [D, N]
        # .to(fp32): Inductor passes a Python float argument as fp64 in AOTI builds.
        s = (_dot(q, k, IEEE) * qk_scale).to(tl.float32)  # [R, N], log2 domain
        own = (offs_n[None, :] >= start[:, None]) & (offs_n[None, :] < end[:, None])
        s = tl.where(own, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(vp_ptr + offs_n[:, None] * stride_vpl + offs_d[None, :],
                    mask=in_range[:, None], other=0.0)  # [N, D]
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attend_position(acc, l_i, m_i, qf, k, v, qk_scale):
    """The online softmax's update by one suffix position: each row's key k and value v [ROWS, D]
    (its own beam's), FP32 dot products on CUDA cores with the rows qf [ROWS, D] in FP32."""
    s = (tl.sum(qf * k.to(tl.float32), axis=1) * qk_scale).to(tl.float32)  # [R]
    m_new = tl.maximum(m_i, s)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new)
    l_i = l_i * alpha + p
    acc = acc * alpha[:, None] + p[:, None] * v.to(tl.float32)
    return acc, l_i, m_new


@triton.jit
def _prefix_attention_kernel(
        q_ptr, kp_ptr, vp_ptr, ks_ptr, vs_ptr, step_ptr, cu_ptr, out_ptr, num_beams, width,
        qk_scale,
        stride_qw, stride_qh, stride_kpl, stride_kph, stride_vpl, stride_vph,
        stride_ksw, stride_ksl, stride_ksh, stride_vsw, stride_vsl, stride_vsh,
        stride_ow, stride_oh,
        GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BEAMS: tl.constexpr,
        HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    kv_head = tl.program_id(1)
    rows = tl.arange(0, BEAMS * GROUP_PAD)  # row = beam in block * GROUP_PAD + head in group
    beam = tl.program_id(0) * BEAMS + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (beam < num_beams) & (rows % GROUP_PAD < GROUP)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + beam[:, None] * stride_qw + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)  # [R, D]

    # Each row's prompt rows [start, end); pad beams past the end take the last beam's.
    request = tl.minimum(beam, num_beams - 1) // width
    start = tl.load(cu_ptr + request)  # [R]
    end = tl.load(cu_ptr + request + 1)  # [R]
    acc, l_i, m_i = _attend_prompts(q, kp_ptr + kv_head * stride_kph, vp_ptr + kv_head * stride_vph, stride_kpl,
                                    stride_vpl, start, end, offs_d, qk_scale, BEAMS * GROUP_PAD, HEAD_DIM, BLOCK_N,
                                    IEEE)

    # Suffix: each row's own beam, positions [0, n) one at a time (n <= L_s, a handful).
    ks_ptr += kv_head * stride_ksh
    vs_ptr += kv_head * stride_vsh
    qf = q.to(tl.float32)
    suffix_len = tl.load(step_ptr) + 1
    for j in range(0, suffix_len):
        k = tl.load(ks_ptr + beam[:, None] * stride_ksw + j * stride_ksl + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)  # [R, D]
        v = tl.load(vs_ptr + beam[:, None] * stride_vsw + j * stride_vsl + offs_d[None, :],
                    mask=row_ok[:, None], other=0.0)  # [R, D]
        acc, l_i, m_i = _attend_position(acc, l_i, m_i, qf, k, v, qk_scale)

    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + beam[:, None] * stride_ow + head[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


# ---------------------------------------------------------------------------------------------
# Launcher

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, width) -> None:
    if q.dim() != 3 or k_prefix.dim() != 3 or v_prefix.dim() != 3:
        raise ValueError(f"prefix_attention: expected q [R*W, N_q, D], k_prefix/v_prefix [T, N_kv, "
                         f"D]; got q {tuple(q.shape)}, k_prefix {tuple(k_prefix.shape)}, "
                         f"v_prefix {tuple(v_prefix.shape)}")
    beams, num_q_heads, head_dim = q.shape
    num_kv_heads = k_prefix.shape[1]
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype != torch.int32 or width < 1 \
            or beams != (cu_seqlens.shape[0] - 1) * width:
        raise ValueError(f"prefix_attention: expected cu_seqlens [R+1] int32 and q's R*W rows for "
                         f"width W >= 1; got cu_seqlens {cu_seqlens.dtype} "
                         f"{tuple(cu_seqlens.shape)}, width {width}, q rows {beams}")
    if v_prefix.shape != k_prefix.shape or k_prefix.shape[2] != head_dim:
        raise ValueError(f"prefix_attention: k_prefix and v_prefix must both be [T, N_kv, "
                         f"D={head_dim}]; got {tuple(k_prefix.shape)}, {tuple(v_prefix.shape)}")
    expected_suffix = (beams, k_suffix.shape[1] if k_suffix.dim() == 4 else -1, num_kv_heads,
                       head_dim)
    if k_suffix.dim() != 4 or tuple(k_suffix.shape) != expected_suffix \
            or v_suffix.shape != k_suffix.shape:
        raise ValueError(f"prefix_attention: k_suffix and v_suffix must both be [R*W={beams}, L_s, "
                         f"N_kv={num_kv_heads}, D={head_dim}]; got {tuple(k_suffix.shape)}, "
                         f"{tuple(v_suffix.shape)}")
    if not isinstance(step, torch.Tensor) or step.dim() != 1 or step.shape[0] != 1 \
            or step.dtype != torch.int64:
        got = f"{step.dtype} {tuple(step.shape)}" if isinstance(step, torch.Tensor) else type(step).__name__
        raise ValueError(f"prefix_attention: expected step an int64 tensor of shape [1] holding the last "
                         f"valid suffix slot; got {got}")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"prefix_attention: N_q={num_q_heads} is not a multiple of "
                         f"N_kv={num_kv_heads}")
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"prefix_attention: head_dim must be a power of two >= 16; got {head_dim}")
    tensors = (q, k_prefix, v_prefix, k_suffix, v_suffix)
    if q.dtype not in SUPPORTED_DTYPES or any(t.dtype != q.dtype for t in tensors):
        raise ValueError("prefix_attention: q and all K/V must share one dtype of bfloat16, "
                         f"float16, float32; got {[t.dtype for t in tensors]}")
    if any(t.stride(-1) != 1 for t in tensors):
        raise ValueError("prefix_attention: the head dim of q and all K/V must be contiguous "
                         f"(stride 1); got strides {[t.stride() for t in tensors]}")
    if any(t.device != q.device for t in tensors + (step, cu_seqlens)):
        raise ValueError(f"prefix_attention: all inputs must be on one device; got "
                         f"{[str(t.device) for t in tensors + (step, cu_seqlens)]}")


def program_rows(group: int, beams_per_program: int | None = None) -> tuple[int, int]:
    """(BEAMS, GROUP_PAD) of a program: its beams (a power of two; default: fill one 16-row MMA
    tile) and the rows each beam's `group` query heads take (a power of two, padded so that the
    tile has >= 16 rows, as tl.dot needs). Also the fused decode attention's (ops/decode_attention.py)."""
    group_pad = triton.next_power_of_2(group)
    beams = beams_per_program or max(1, 16 // group_pad)
    if beams & (beams - 1):
        raise ValueError(f"prefix_attention: beams_per_program must be a power of two; got {beams}")
    return beams, max(group_pad, 16 // beams)


def launch(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
           k_suffix: torch.Tensor, v_suffix: torch.Tensor, step: torch.Tensor,
           cu_seqlens: torch.Tensor, width: int, scale: float, beams_per_program: int | None = None,
           block_n: int = 64) -> torch.Tensor:
    """Run the Triton kernel; same signature and result as `reference`. `beams_per_program`
    (a power of two; default: fill one 16-row MMA tile) is exposed for tests and benchmarks."""
    _check(q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, width)
    beams_total, num_q_heads, head_dim = q.shape
    num_kv_heads = k_prefix.shape[1]
    group = num_q_heads // num_kv_heads
    beams, group_pad = program_rows(group, beams_per_program)
    out = torch.empty((beams_total, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(beams_total, beams), num_kv_heads)
    wrap_triton(_prefix_attention_kernel)[grid](
        q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, out, beams_total,
        width, scale * math.log2(math.e),
        q.stride(0), q.stride(1), k_prefix.stride(0), k_prefix.stride(1),
        v_prefix.stride(0), v_prefix.stride(1),
        k_suffix.stride(0), k_suffix.stride(1), k_suffix.stride(2),
        v_suffix.stride(0), v_suffix.stride(1), v_suffix.stride(2),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=group_pad, BEAMS=beams, HEAD_DIM=head_dim, BLOCK_N=block_n,
        IEEE=q.dtype == torch.float32, num_warps=4, num_stages=2)
    return out


# ---------------------------------------------------------------------------------------------
# Registered op: one node under torch.export; the kernel on CUDA, the reference on CPU.

@triton_op("boundgen::prefix_attention", mutates_args=())
def prefix_attention(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
                     k_suffix: torch.Tensor, v_suffix: torch.Tensor, step: torch.Tensor,
                     cu_seqlens: torch.Tensor, width: int, scale: float) -> torch.Tensor:
    return launch(q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, width, scale)


prefix_attention.register_kernel("cpu")(reference)


@prefix_attention.register_fake
def _(q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, width, scale):
    return q.new_empty(q.shape)


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference, "triton": prefix_attention}
