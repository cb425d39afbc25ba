"""Both attention ops inside an AOTInductor package with a dynamic token count.

CPU: the ops stay opaque calls (decompose_custom_triton_ops=False) and run the reference.
GPU: Inductor's default, the Triton kernels compiled into the package with a grid that is an
expression of the symbolic T; the flash lowering calls PyTorch's FlashAttention through the C
shim. Each runs in a fresh process: the GPU one without the interpreter, and with libstdc++
preloaded (the H200 image's AOTI load crash: docs/build.md).
"""

import os
import textwrap

import pytest
import torch

from tests.ops.kernel_testing import assert_script_prints_ok, env_without_interpreter

_SCRIPT = textwrap.dedent("""
    import contextlib, sys, tempfile
    import torch
    from boundgen.ops import packed_attention as pa, prefix_attention as pf

    device = sys.argv[1]
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    tol = 0.0 if device == "cpu" else 2e-2

    # Packed prefill attention over B sequences; a beam step of W=2 beams per sequence over the
    # first suffix_len positions of a 4-slot suffix buffer (one package serves every step).
    class Attend(torch.nn.Module):
        def forward(self, q, k, v, cu_seqlens, q_beams, k_buffer, v_buffer, step):
            packed = torch.ops.boundgen.packed_attention(q, k, v, cu_seqlens, 0.125)
            beams = torch.ops.boundgen.prefix_attention(q_beams, k, v, k_buffer, v_buffer,
                                                        step, cu_seqlens, 2, 0.125)
            flashed = pa.flash(q, k, v, cu_seqlens, 0.125, 256)  # the reference on CPU
            # 14 query heads on one K/V head, two a program (the triton_gqa lowering's packing)
            pair = torch.ops.boundgen.packed_attention(q, k[:, :1], v[:, :1], cu_seqlens, 0.125, 2)
            # the triton_stacked lowering: 14 heads a program each (group 7), and 4 on 2 K/V heads (pack 2)
            stacked = torch.ops.boundgen.packed_attention_stacked(q, k, v, cu_seqlens, 0.125)
            stacked_pair = torch.ops.boundgen.packed_attention_stacked(q[:, :4], k, v, cu_seqlens, 0.125)
            return packed, beams, flashed, pair, stacked, stacked_pair

    def inputs(lengths, suffix_len, heads=(14, 2), head_dim=64):
        t, b = sum(lengths), len(lengths)
        cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
        rand = lambda *s: torch.randn(*s, device=device).to(dtype)
        k_buffer, v_buffer = rand(2 * b, 4, heads[1], head_dim), rand(2 * b, 4, heads[1], head_dim)
        k_buffer[:, suffix_len:], v_buffer[:, suffix_len:] = float("nan"), float("nan")
        return (rand(t, heads[0], head_dim), rand(t, heads[1], head_dim),
                rand(t, heads[1], head_dim), cu.to(device), rand(2 * b, heads[0], head_dim),
                k_buffer, v_buffer, torch.tensor([suffix_len - 1], device=device))

    tokens = torch.export.Dim("T", min=6, max=4096)
    seqs = torch.export.Dim("B", min=1, max=64)
    shapes = ({0: tokens}, {0: tokens}, {0: tokens}, {0: seqs + 1}, {0: 2 * seqs},
              {0: 2 * seqs}, {0: 2 * seqs}, None)
    exported = torch.export.export(Attend(), inputs([3, 9], 2), dynamic_shapes=shapes)
    patch = (torch._functorch.config.patch(decompose_custom_triton_ops=False)
             if device == "cpu" else contextlib.nullcontext())
    with patch:
        path = torch._inductor.aoti_compile_and_package(
            exported, package_path=tempfile.mkdtemp() + "/attention.pt2")
    runner = torch._inductor.aoti_load_package(path)
    for lengths, n in (([1, 7, 37], 1), ([200, 48, 256, 1, 99], 4), ([5, 3], 0)):
        args = inputs(lengths, n)
        packed, beams, flashed, pair, stacked, stacked_pair = runner(*args)
        q, k, v, cu, qb, kb, vb, step = args
        err_packed = (packed.float() - pa.reference(q, k, v, cu, 0.125).float()).abs().max()
        err_beams = (beams.float() - pf.reference(qb, k, v, kb[:, :n], vb[:, :n], step,
                                                  cu, 2, 0.125).float()).abs().max()
        err_flash = (flashed.float() - pa.reference(q, k, v, cu, 0.125).float()).abs().max()
        err_pair = (pair.float() - pa.reference(q, k[:, :1], v[:, :1], cu, 0.125).float()).abs().max()
        err_stacked = (stacked.float() - pa.reference(q, k, v, cu, 0.125).float()).abs().max()
        err_stacked_pair = (stacked_pair.float() - pa.reference(q[:, :4], k, v, cu, 0.125).float()).abs().max()
        errors = (err_packed, err_beams, err_flash, err_pair, err_stacked, err_stacked_pair)
        assert max(errors) <= tol, (lengths, n, errors)
    print("ok")
""")


def _run(device: str, env: dict) -> None:
    assert_script_prints_ok(_SCRIPT, device, env=env, timeout=900, stderr_tail=4000)


@pytest.mark.slow
def test_aoti_package_cpu_calls_ops_opaquely():
    _run("cpu", dict(os.environ, TRITON_INTERPRET="1"))


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_aoti_package_gpu_compiles_kernels_in():
    _run("cuda", env_without_interpreter(preload_libstdcxx=True))
