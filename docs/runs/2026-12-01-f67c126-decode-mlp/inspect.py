import re, torch, triton
from boundgen.ops import swiglu_down as op
x = torch.randn(100, 2 * 4864, device="cuda", dtype=torch.bfloat16)
w = torch.randn(896, 4864, device="cuda", dtype=torch.bfloat16)
for (bm, bn, bk, warps, stages), ks in [(op.DEFAULT_CONFIG, op.K_SPLIT), ((64, 128, 64, 4, 3), 320)]:
    parts = triton.cdiv(4864, ks)
    out = torch.empty(parts, 100, 896, device="cuda")
    k = op._swiglu_down_kernel[(triton.cdiv(100, bm), triton.cdiv(896, bn), parts)](
        x, w, out, 100, x.stride(0), INTER=4864, HIDDEN=896, K_SPLIT=ks, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        IEEE=False, SOFT_BF16=False, num_warps=warps, num_stages=stages)
    torch.cuda.synchronize()
    print((bm, bn, bk, warps, stages, ks), "regs", k.n_regs, "spills", k.n_spills, "shared", k.metadata.shared,
          sorted(set(re.findall(r"ttg\.async\w*|ttng\.\w*", k.asm["ttgir"]))))
