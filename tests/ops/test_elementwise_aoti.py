"""RMSNorm, RoPE and silu_mul compiled into an AOTInductor package on the GPU, dynamic T.

Inductor's default on CUDA: the Triton kernels are compiled into the package, with a grid that is
an expression of the symbolic T and eps passed as a Python float (which Inductor types fp64).
Runs in a fresh process without the interpreter, libstdc++ preloaded (the H200 image's AOTI load
crash: docs/build.md). The CPU path (opaque ops, references) is the attention AOTI test's.
"""

import textwrap

import pytest
import torch

from tests.ops.kernel_testing import assert_script_prints_ok, env_without_interpreter

_SCRIPT = textwrap.dedent("""
    import tempfile
    import torch
    from boundgen.ops import rmsnorm, rope, silu_mul

    EPS, NUM_Q, NUM_KV, D, H, I = 1e-6, 14, 2, 64, 896, 4864

    class Layer(torch.nn.Module):
        def forward(self, h, qkv, gate_up, w_h, w_d, cos, sin):
            q = qkv[:, : NUM_Q * D].reshape(-1, NUM_Q, D)
            k = qkv[:, NUM_Q * D: (NUM_Q + NUM_KV) * D].reshape(-1, NUM_KV, D)
            normed = torch.ops.boundgen.rmsnorm(h, w_h, EPS)
            q = torch.ops.boundgen.rope(torch.ops.boundgen.rmsnorm(q, w_d, EPS), cos, sin)
            k = torch.ops.boundgen.rope(k, cos, sin)
            return normed, q, k, torch.ops.boundgen.silu_mul(gate_up)

    def inputs(t):
        rand = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)
        positions = torch.randint(0, 30000, (t,), device="cuda")
        cos, sin = rope.cos_sin(positions, rope.inv_freq(D, 1e6).cuda(), torch.bfloat16)
        return (rand(t, H), rand(t, (NUM_Q + 2 * NUM_KV) * D), rand(t, 2 * I), 1 + rand(H) / 10,
                1 + rand(D) / 10, cos, sin)

    def expected(h, qkv, gate_up, w_h, w_d, cos, sin):
        q = qkv[:, : NUM_Q * D].reshape(-1, NUM_Q, D)
        k = qkv[:, NUM_Q * D: (NUM_Q + NUM_KV) * D].reshape(-1, NUM_KV, D)
        return (rmsnorm.reference(h, w_h, EPS),
                rope.reference(rmsnorm.reference(q, w_d, EPS), cos, sin),
                rope.reference(k, cos, sin), silu_mul.reference(gate_up))

    tokens = torch.export.Dim("T", min=2, max=4096)
    shapes = ({0: tokens}, {0: tokens}, {0: tokens}, None, None, {0: tokens}, {0: tokens})
    exported = torch.export.export(Layer(), inputs(9), dynamic_shapes=shapes)
    path = torch._inductor.aoti_compile_and_package(
        exported, package_path=tempfile.mkdtemp() + "/elementwise.pt2")
    runner = torch._inductor.aoti_load_package(path)
    for t in (2, 37, 2400):
        args = inputs(t)
        for name, got, want in zip(("rmsnorm", "qk-norm+rope", "rope", "silu_mul"), runner(*args),
                                   expected(*args)):
            err = (got.float() - want.float()).abs().max().item()
            assert got.dtype == torch.bfloat16 and got.shape == want.shape, name
            assert err <= 2e-2 * max(1.0, want.float().abs().max().item()), (t, name, err)
    print("ok")
""")


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_aoti_package_gpu_compiles_kernels_in():
    assert_script_prints_ok(_SCRIPT, env=env_without_interpreter(preload_libstdcxx=True),
                            timeout=900, stderr_tail=4000)
