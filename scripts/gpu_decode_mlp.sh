#!/usr/bin/env bash
# A beam decode layer's MLP tail on the GPU in one call: the GPU tests of the split-K SwiGLU + down
# kernel and of the add + norm that sums its partial products, then the kernel benchmark
# (`python -m boundgen.bench.decode_mlp`: Inductor + cuBLAS against the Triton pair at its default
# and at every config of its sweep, rows 100-800, weights from HBM), as a markdown table.
#   bash scripts/gpu_decode_mlp.sh           (OUT=/dir to keep the logs; system python3)
# About 2 minutes on an H200.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_decode_mlp}"
mkdir -p "$OUT"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
start=$SECONDS; log() { echo "[decode_mlp +$(( SECONDS - start ))s] $*"; }
timeout 200 python3 -m pytest -q -m gpu tests/ops/test_swiglu_down.py tests/ops/test_add_rmsnorm.py \
  -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
rc=$?; log "gpu tests: exit $rc -- $(tail -n 1 "$OUT/gpu_tests.log")"
(( rc == 0 )) || grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gpu_tests.log" | head -n 20
timeout 300 python3 -m boundgen.bench.decode_mlp --rows "${ROWS:-100,200,400,800}" > "$OUT/decode_mlp.md" \
  2> "$OUT/decode_mlp.log"
rc2=$?; log "decode MLP benchmark: exit $rc2"
(( rc2 == 0 )) || tail -n 20 "$OUT/decode_mlp.log"
cat "$OUT/decode_mlp.md" 2>/dev/null
exit $(( rc || rc2 ))
