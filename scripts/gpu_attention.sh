#!/usr/bin/env bash
# Packed prefill attention on the GPU in one call: its GPU tests (the Triton kernel and the flash
# lowering against the torch reference, both inside an AOTInductor package), then the kernel
# benchmark at W1's shapes (one request: 15 samples of 48-256 tokens; four requests in one call)
# and at a W2 call's prompts (Qwen2 heads), as a markdown table.
#   bash scripts/gpu_attention.sh            (OUT=/dir to keep the logs; system python3)
# About 2 minutes on an H200, most of it the AOTInductor compile of the package test.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_kernel_steps.sh" attention  # root, OUT, install, log, gpu_tests
gpu_tests 200 tests/ops/test_packed_attention.py tests/ops/test_attention_aoti.py
rc=$?
timeout 100 python3 -c "
from boundgen.bench.kernels import bench_packed, w1_lengths
from boundgen.bench.kernel_timing import markdown_table
one = w1_lengths()
rows = bench_packed(one, configs=[]) + bench_packed(one * 4, configs=[])
rows += bench_packed([64] * 8, heads=(14, 2), head_dim=64, configs=[])
print(markdown_table(rows), file=open('$OUT/attention.md', 'w'))
print(markdown_table(rows))" > "$OUT/attention.log" 2>&1
rc2=$?; log "attention benchmark: exit $rc2"
(( rc2 == 0 )) || tail -n 20 "$OUT/attention.log"
cat "$OUT/attention.md" 2>/dev/null
exit $(( rc || rc2 ))
