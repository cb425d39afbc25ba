#!/usr/bin/env bash
# Candidate selection on the GPU in one call: the vocab_topk, chunk_max and chunk_select GPU tests
# (exactness at rows 100/800/1,600, K 200/400/800, V 151,936), then the selection benchmark (torch
# reference, torch-lse, the Triton kernel, the "chunks" and "chunks-triton" lowerings, their launch
# sweeps, the LM-head GEMM for scale) as a markdown table.
#   bash scripts/gpu_vocab_topk.sh            (OUT=/dir to keep the logs; system python3;
#                                              SELECTION_TESTS=files: only those tests)
# About 2-3 minutes on an H200, most of it Triton compiles.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_kernel_steps.sh" vocab_topk  # root, OUT, install, log, gpu_tests
# shellcheck disable=SC2086
gpu_tests 170 ${SELECTION_TESTS:-tests/ops/test_vocab_topk.py tests/ops/test_chunk_max.py tests/ops/test_chunk_select.py}
rc=$?
timeout 150 python3 -c "
from boundgen.bench.selection import bench_vocab_topk, selection_table
rows = []
for k in (200, 400):
    for r in (100, 800, 1600):
        rows += bench_vocab_topk(r, k, sweep=k == 200)  # the launch sweep at K 200 only: compiles
        print(selection_table(rows), file=open('$OUT/selection.md', 'w'))  # kept if cut short
print(selection_table(rows))" > "$OUT/selection.log" 2>&1
rc2=$?; log "selection benchmark: exit $rc2"
(( rc2 == 0 )) || tail -n 20 "$OUT/selection.log"
cat "$OUT/selection.md" 2>/dev/null
exit $(( rc || rc2 ))
