import torch
from boundgen.bench.kernel_timing import gpu_time_us
from boundgen.ops import rmsnorm
for T in (2250, 4500, 9000):
    x = torch.randn(T, 1024, device="cuda", dtype=torch.bfloat16)
    d = torch.randn(T, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    nbytes = 4 * T * 1024 * 2
    for rows in (1, 2, 4, 8, 16):
        for warps in (2, 4, 8):
            try:
                t = gpu_time_us(lambda: rmsnorm.launch(x, w, 1e-6, rows, warps, delta=d))
                print(f"add_rmsnorm T={T} block_rows={rows} warps={warps}: {t:.2f} us {nbytes / t / 1e3:.0f} GB/s", flush=True)
            except Exception as e:
                print(T, rows, warps, "failed", e)
