#!/usr/bin/env bash
# A beam decode layer's MLP tail on the GPU in one call: the GPU tests of the split-K SwiGLU + down
# kernel and of the add + norm that sums its partial products, then the kernel benchmark
# (`python -m boundgen.bench.decode_mlp`: Inductor + cuBLAS against the Triton pair at its default
# and at every config of its sweep, rows 100-800, weights from HBM), as a markdown table.
#   bash scripts/gpu_decode_mlp.sh           (OUT=/dir to keep the logs; system python3)
# About 2 minutes on an H200.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_kernel_steps.sh" decode_mlp  # root, OUT, install, log, gpu_tests
gpu_tests 200 tests/ops/test_swiglu_down.py tests/ops/test_add_rmsnorm.py
rc=$?
timeout 300 python3 -m boundgen.bench.decode_mlp --rows "${ROWS:-100,200,400,800}" > "$OUT/decode_mlp.md" \
  2> "$OUT/decode_mlp.log"
rc2=$?; log "decode MLP benchmark: exit $rc2"
(( rc2 == 0 )) || tail -n 20 "$OUT/decode_mlp.log"
cat "$OUT/decode_mlp.md" 2>/dev/null
exit $(( rc || rc2 ))
