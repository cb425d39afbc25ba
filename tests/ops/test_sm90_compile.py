"""The Triton kernels written without a GPU at hand compile for the H200 (sm_90): Triton's own
ptxas, from the triton wheel, builds the cubin on this machine, no device needed. The interpreter
(the other kernel tests) is more lenient than the compiler; this catches what only the compiler
refuses, and prints each kernel's registers and spill (cuobjdump's resource usage) for the record.
Each kernel is compiled from the source Inductor writes for it in a build (the kernel and the
helpers it calls, copied by name into one file), so a helper the copy misses fails here, as it
failed an H200 build (`rope.rotate_halves` called through its module, 2026-12-01).
Skipped where the wheel carries no ptxas."""

import subprocess
import sys
from pathlib import Path

import pytest
import triton

from tests.ops.kernel_testing import env_without_interpreter

NVIDIA_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
pytestmark = pytest.mark.skipif(not (NVIDIA_BIN / "ptxas").is_file(), reason="the triton wheel has no ptxas")

# name: (module, kernel, signature, constexprs, num_warps attribute of the module or a number)
KERNELS = {
    "chunk_max": ("chunk_max", "_chunk_max_kernel",
                  {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "maxima_ptr": "*bf16", "max_ptr": "*fp32",
                   "sum_ptr": "*fp32", "vocab": "i32", "chunks": "i32", "stride_row": "i32", "segment": "i32"},
                  {"CHUNK": 32, "TILE_CHUNKS": 64, "HAS_BIAS": True, "STAGES": 2}, "DEFAULT_WARPS"),
    "chunk_select": ("chunk_select", "_chunk_select_kernel",
                     {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "maxima_ptr": "*bf16", "lse_ptr": "*fp32",
                      "chunk_buf_ptr": "*i32", "key_buf_ptr": "*i64", "logp_ptr": "*fp32", "ids_ptr": "*i64",
                      "chunks": "i32", "stride_row": "i32", "k": "i32"},
                     {"CHUNK": 32, "NCP": 8192, "KP": 256, "HAS_BIAS": True}, "DEFAULT_WARPS"),
    "vocab_topk": ("vocab_topk", "_vocab_topk_kernel",
                   {"logits_ptr": "*bf16", "bias_ptr": "*fp32", "buf_ptr": "*i64", "logp_ptr": "*fp32",
                    "ids_ptr": "*i64", "vocab": "i32", "stride_row": "i32", "k": "i32"},
                   {"BLOCK": 4096, "KP": 256, "CAP": 512, "BINS": 256, "HAS_BIAS": True, "STAGES": 3}, "DEFAULT_WARPS"),
    "add_rmsnorm": ("rmsnorm", "_rmsnorm_kernel",
                    {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "eps": "fp32", "num_rows": "i32",
                     "stride_xt": "i32", "stride_xn": "i32", "d_ptr": "*bf16", "sum_ptr": "*bf16", "stride_dt": "i32",
                     "stride_ds": "i32", "scale_ptr": "*bf16"},
                    {"NUM_HEADS": 1, "HIDDEN": 1024, "BLOCK_ROWS": 2, "BLOCK_H": 1024, "SOFT_BF16": False,
                     "ADD": True, "SPLITS": 0, "QUANT": False}, 4),
    "add_rmsnorm_quant": ("rmsnorm", "_rmsnorm_kernel",
                          {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*fp8e4nv", "eps": "fp32", "num_rows": "i32",
                           "stride_xt": "i32", "stride_xn": "i32", "d_ptr": "*bf16", "sum_ptr": "*bf16",
                           "stride_dt": "i32", "stride_ds": "i32", "scale_ptr": "*fp32"},
                          {"NUM_HEADS": 1, "HIDDEN": 1024, "BLOCK_ROWS": 2, "BLOCK_H": 1024, "SOFT_BF16": False,
                           "ADD": True, "SPLITS": 0, "QUANT": True}, 4),
    "rmsnorm_quant": ("rmsnorm", "_rmsnorm_kernel",
                      {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*fp8e4nv", "eps": "fp32", "num_rows": "i32",
                       "stride_xt": "i32", "stride_xn": "i32", "d_ptr": "*bf16", "sum_ptr": "*fp8e4nv",
                       "stride_dt": "i32", "stride_ds": "i32", "scale_ptr": "*fp32"},
                      {"NUM_HEADS": 1, "HIDDEN": 1024, "BLOCK_ROWS": 2, "BLOCK_H": 1024, "SOFT_BF16": False,
                       "ADD": False, "SPLITS": 0, "QUANT": True}, 4),
    "add_rmsnorm_partials": ("rmsnorm", "_rmsnorm_kernel",
                             {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "eps": "fp32", "num_rows": "i32",
                              "stride_xt": "i32", "stride_xn": "i32", "d_ptr": "*fp32", "sum_ptr": "*bf16",
                              "stride_dt": "i32", "stride_ds": "i32", "scale_ptr": "*bf16"},
                             {"NUM_HEADS": 1, "HIDDEN": 896, "BLOCK_ROWS": 2, "BLOCK_H": 1024, "SOFT_BF16": False,
                              "ADD": True, "SPLITS": 10, "QUANT": False}, 4),
    "silu_quant": ("silu_quant", "_silu_quant_kernel",
                   {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32", "num_rows": "i32", "stride_xt": "i32"},
                   {"INTER": 3072, "BLOCK_T": 1, "PART1": 2048, "PART2": 1024, "SOFT_BF16": False, "IEEE_DIV": False}, 4),
    "swiglu_down": ("swiglu_down", "_swiglu_down_kernel",
                    {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*fp32", "num_rows": "i32", "stride_xt": "i32"},
                    {"INTER": 4864, "HIDDEN": 896, "K_SPLIT": 320, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64,
                     "IEEE": False, "SOFT_BF16": False}, 4),
    "rope_kv_write": ("rope_kv_write", "_rope_kv_write_kernel",
                      {"qkv_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "q_ptr": "*bf16",
                       "sk_ptr": "*bf16", "sv_ptr": "*bf16", "step_ptr": "*i64", "layer": "i32", "num_rows": "i32",
                       "stride_qkv": "i32", "stride_cos": "i32", "stride_sin": "i32", "stride_kl": "i32",
                       "stride_kb": "i32", "stride_ks": "i32", "stride_vl": "i32", "stride_vb": "i32",
                       "stride_vs": "i32"},
                      {"NUM_Q": 14, "NUM_KV": 2, "HALF": 32, "BLOCK_T": 4, "BLOCK_N": 16, "BLOCK_KV": 2,
                       "SOFT_BF16": True}, 4),
    # Triton specialises an int argument equal to 1 into a constant: layer 1 of a real model.
    "rope_kv_write_layer_1": ("rope_kv_write", "_rope_kv_write_kernel",
                              {"qkv_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "q_ptr": "*bf16",
                               "sk_ptr": "*bf16", "sv_ptr": "*bf16", "step_ptr": "*i64", "num_rows": "i32",
                               "stride_qkv": "i32", "stride_cos": "i32", "stride_sin": "i32", "stride_kl": "i32",
                               "stride_kb": "i32", "stride_ks": "i32", "stride_vl": "i32", "stride_vb": "i32",
                               "stride_vs": "i32"},
                              {"layer": 1, "NUM_Q": 14, "NUM_KV": 2, "HALF": 32, "BLOCK_T": 4, "BLOCK_N": 16,
                               "BLOCK_KV": 2, "SOFT_BF16": True}, 4),
    # A beam decode step's attention (Qwen2.5-0.5B: 14 / 2 heads of 64, 2 beams a program), its helpers
    # shared with the fused decode attention below.
    "prefix_attention": ("prefix_attention", "_prefix_attention_kernel",
                         {"q_ptr": "*bf16", "kp_ptr": "*bf16", "vp_ptr": "*bf16", "ks_ptr": "*bf16", "vs_ptr": "*bf16",
                          "step_ptr": "*i64", "cu_ptr": "*i32", "out_ptr": "*bf16", "num_beams": "i32",
                          "width": "i32", "qk_scale": "fp32", "stride_qw": "i32", "stride_qh": "i32",
                          "stride_kpl": "i32", "stride_kph": "i32", "stride_vpl": "i32", "stride_vph": "i32",
                          "stride_ksw": "i32", "stride_ksl": "i32", "stride_ksh": "i32", "stride_vsw": "i32",
                          "stride_vsl": "i32", "stride_vsh": "i32", "stride_ow": "i32", "stride_oh": "i32"},
                         {"GROUP": 7, "GROUP_PAD": 8, "BEAMS": 2, "HEAD_DIM": 64, "BLOCK_N": 64, "IEEE": False}, 4),
    # RoPE, the K/V write and the prefix attention in one kernel (layer 1 specialised to a constant).
    "decode_attention_layer_1": ("decode_attention", "_decode_attention_kernel",
                                 {"qkv_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "kp_ptr": "*bf16",
                                  "vp_ptr": "*bf16", "sk_ptr": "*bf16", "sv_ptr": "*bf16", "step_ptr": "*i64",
                                  "cu_ptr": "*i32", "out_ptr": "*bf16", "num_beams": "i32", "width": "i32",
                                  "qk_scale": "fp32", "stride_qkv": "i32", "stride_cos": "i32", "stride_sin": "i32",
                                  "stride_kpl": "i32", "stride_kph": "i32", "stride_vpl": "i32", "stride_vph": "i32",
                                  "stride_kl": "i32", "stride_kb": "i32", "stride_ks": "i32", "stride_vl": "i32",
                                  "stride_vb": "i32", "stride_vs": "i32", "stride_ow": "i32", "stride_oh": "i32"},
                                 {"layer": 1, "NUM_Q": 14, "NUM_KV": 2, "GROUP_PAD": 8, "BEAMS": 2, "HEAD_DIM": 64,
                                  "BLOCK_N": 64, "IEEE": False, "SOFT_BF16": True}, 4),
    # W1's triton_stacked lowering: two query heads of 64 tokens stacked as 128 rows, a warpgroup each.
    "packed_attention_stacked": ("packed_attention_stacked", "_packed_attention_stacked_kernel",
                                 {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "out_ptr": "*bf16",
                                  "cu_seqlens_ptr": "*i32", "qk_scale": "fp32", "num_seqs": "i32", "num_tokens": "i32",
                                  "stride_qt": "i32",
                                  "stride_qh": "i32", "stride_kt": "i32", "stride_kh": "i32", "stride_vt": "i32",
                                  "stride_vh": "i32", "stride_ot": "i32", "stride_oh": "i32"},
                                 {"GROUP": 2, "HEAD_DIM": 128, "BLOCK_M": 64, "BLOCK_N": 32, "PACK": 2, "IEEE": False,
                                  "SOFT_BF16": False, "SEQ_CHUNK": 64, "TMA": False}, 8),
    # W1's packed attention with the q/k norm and RoPE in its loads: 64 tokens x 2 query heads a program.
    "packed_attention_qk": ("packed_attention_qk", "_packed_attention_qk_kernel",
                            {"qkv_ptr": "*bf16", "wq_ptr": "*bf16", "wk_ptr": "*bf16", "cos_ptr": "*bf16",
                             "sin_ptr": "*bf16", "out_ptr": "*bf16", "cu_seqlens_ptr": "*i32", "eps": "fp32",
                             "qk_scale": "fp32", "num_seqs": "i32", "stride_qkv": "i32", "stride_cos": "i32",
                             "stride_sin": "i32", "stride_ot": "i32", "stride_oh": "i32"},
                            {"NUM_Q": 16, "NUM_KV": 8, "HALF": 64, "BLOCK_M": 64, "BLOCK_N": 32, "PACK": 2,
                             "IEEE": False, "SOFT_BF16": False, "SEQ_CHUNK": 64}, 8),
    "cos_sin": ("cos_sin", "_cos_sin_kernel",
                {"pos_ptr": "*i64", "inv_freq_ptr": "*fp32", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "num_rows": "i32"},
                {"HALF": 32, "BLOCK_T": 8, "SOFT_BF16": False}, 1),
    "rope": ("rope", "_rope_kernel",
             {"x_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "out_ptr": "*bf16", "num_tokens": "i32",
              "stride_xt": "i32", "stride_xn": "i32", "stride_ct": "i32", "stride_st": "i32"},
             {"NUM_HEADS": 14, "HALF": 32, "BLOCK_T": 4, "BLOCK_N": 16, "BLOCK_HALF": 32, "SOFT_BF16": True}, 4),
    "qk_norm_rope": ("qk_norm_rope", "_qk_norm_rope_kernel",
                     {"qkv_ptr": "*bf16", "wq_ptr": "*bf16", "wk_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16",
                      "q_ptr": "*bf16", "k_ptr": "*bf16", "eps": "fp32", "num_tokens": "i32", "stride_qkv": "i32",
                      "stride_cos": "i32", "stride_sin": "i32"},
                     {"NUM_Q": 16, "NUM_KV": 8, "HALF": 64, "BLOCK_T": 2, "GROUP": 8, "SOFT_BF16": False}, 4),
    "trie_mask": ("trie_mask", "_trie_mask_kernel",
                  {"nodes_ptr": "*i64", "row_ptr_ptr": "*i64", "child_token_ptr": "*i64", "reach_ptr": "*u8",
                   "ends_ptr": "*u8", "stop_ptr": "*i64", "out_ptr": "*fp32", "num_nodes": "i32", "vocab": "i32",
                   "stride_row": "i32", "max_degree": "i32", "num_stops": "i32", "beams_per_row": "i32",
                   "stride_filter": "i32"},
                  {"BLOCK": 2048, "CHILD_BLOCK": 128, "IN_PLACE": False}, "DEFAULT_WARPS"),
    # In place on bf16 scores, the catalogue's int32 tokens, one stop token (specialised to a constant).
    "trie_mask_in_place": ("trie_mask", "_trie_mask_kernel",
                           {"nodes_ptr": "*i64", "row_ptr_ptr": "*i64", "child_token_ptr": "*i32", "reach_ptr": "*u8",
                            "ends_ptr": "*u8", "stop_ptr": "*i64", "out_ptr": "*bf16", "num_nodes": "i32",
                            "vocab": "i32", "stride_row": "i32", "max_degree": "i32", "beams_per_row": "i32",
                            "stride_filter": "i32"},
                           {"num_stops": 1, "BLOCK": 2048, "CHILD_BLOCK": 128, "IN_PLACE": True}, "DEFAULT_WARPS"),
}

# Run without the interpreter (its kernels cannot be compiled); prints cuobjdump's resource line.
_SCRIPT = """
import importlib, importlib.util, subprocess, sys
import triton
from triton.backends.compiler import GPUTarget
module_name, kernel, signature, constants, warps, cubin, cuobjdump = sys.argv[1:]
from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code as closure
module = importlib.import_module("boundgen.ops." + module_name)
constants = eval(constants)
signature = dict(eval(signature), **{c: "constexpr" for c in constants})
warps = getattr(module, warps) if not warps.isdigit() else int(warps)
# The kernel as a build compiles it: Inductor's copy of its source and its helpers, in a file of its own.
copy = cubin[:-len(".cubin")] + "_inductor_copy.py"
with open(copy, "w") as f:
    f.write("import triton\\nimport triton.language as tl\\n\\n@triton.jit\\n" + closure(getattr(module, kernel)))
spec = importlib.util.spec_from_file_location("inductor_copy", copy)
copied = importlib.util.module_from_spec(spec)
spec.loader.exec_module(copied)
source = triton.compiler.ASTSource(fn=getattr(copied, kernel), signature=signature, constexprs=constants)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
open(cubin, "wb").write(compiled.asm["cubin"])
usage = subprocess.run([cuobjdump, "--dump-resource-usage", cubin], capture_output=True, text=True).stdout
print(warps, next(line.strip() for line in usage.splitlines() if "REG:" in line))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_compiles_for_sm90(name, tmp_path):
    module, kernel, signature, constants, warps = KERNELS[name]
    out = subprocess.run([sys.executable, "-c", _SCRIPT, module, kernel, repr(signature), repr(constants), str(warps),
                          str(tmp_path / f"{name}.cubin"), str(NVIDIA_BIN / "cuobjdump")],
                         env=env_without_interpreter(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    warps, usage = out.stdout.strip().split(" ", 1)
    print(f"{name} (sm_90, {warps} warps): {usage}")  # e.g. chunk_select, 16 warps: REG:128 STACK:64
