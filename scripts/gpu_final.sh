#!/usr/bin/env bash
# Every GPU measurement in one go (< 10 minutes):
#   1. with FUSED_TESTS=1, the fused elementwise kernels' gpu tests: they decide whether the eager
#      engines use them (artifacts take theirs from scripts/gpu_artifacts.sh);
#   2. scripts/gpu_bench.sh in the background (demo checkpoints, W1 and beam builds, W1 and W2/W3
#      benches vs the peer, both with concurrent requests batched; with BEAM_UNBATCHED=1, W2/W3 a
#      second time unbatched);
#   3. with EXTRAS=1, meanwhile, while it writes checkpoints and compiles: the attention kernels'
#      gpu tests, scripts/peer_check.py (where the HF peer's W1 time goes) and kernel timings;
#   4. with REPLICAS=1 (or auto on a machine of several GPUs), scripts/gpu_replicas.sh: W1 served
#      with --gpus 1..N (the builds then get too little time for both benches: measured 2026-11-29);
#   5. everything packed into $OUT as two tarballs (results, traces), easy to copy off the machine.
# The beam artifact is the default build (scripts/gpu_artifacts.sh): the vocabulary top-K kernel
# measured neutral end to end (docs/benchmarks.md), so it is not switched on; scripts/gpu_run.sh
# with TOPK_AB=triton (or TOPK_AB=chunks) repeats a selection lowering's A/B.
#   OUT=/dir bash scripts/gpu_final.sh      (system python3; boundgen installed into it, scripts/gpu_install.sh)
# EXTRAS=1 competes with the builds for CPU: leave it off when both artifacts must build.
# Other knobs pass through to gpu_bench.sh (W1_BENCH, BENCH_RESERVE_S, BUDGET_S, BEAM_UNBATCHED).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_final}"; RES=/tmp/gpu_final; WORK=/tmp/boundgen_gpu_bench
mkdir -p "$OUT" "$RES"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 WORK
start=$SECONDS; log() { echo "[final +$(( SECONDS - start ))s] $*"; }

fused_tests=$(ls tests/ops/test_rmsnorm.py tests/ops/test_rope.py tests/ops/test_silu_mul.py 2>/dev/null)
fused=""
if [[ -n "$fused_tests" && "${FUSED_TESTS:-0}" == 1 ]]; then
  timeout 120 python3 -m pytest -q -m gpu $fused_tests -p no:cacheprovider > "$RES/gpu_tests_fused.log" 2>&1
  rc=$?; log "fused kernel gpu tests: exit $rc -- $(tail -n 1 "$RES/gpu_tests_fused.log")"
  (( rc == 0 )) && fused="--lowering rmsnorm=triton --lowering rope=triton --lowering silu_mul=triton"
fi
log "W2/W3 eager engine lowering extra: ${fused:-none}"
source "$root/scripts/gpu_artifacts.sh"
beam_build="$BEAM_DEFAULT"
gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
replicas=0; [[ "${REPLICAS:-0}" == 1 || ( "${REPLICAS:-0}" == auto && $gpus -ge 2 ) ]] && replicas=1
unbatched="--contexts 4 --cuda-graphs --no-batching $fused"
[[ "${BEAM_UNBATCHED:-0}" == 0 ]] && unbatched=""
SWEEP="${SWEEP:---concurrency 1,2,4,8,16,32 --duration 2 --warmup 1 --open-loop-rate auto --profile-requests 20}"
# 540 s for gpu_bench.sh leaves ~270 s for the two builds side by side (each ~165 s alone on the
# H200, 2026-11-29) inside 600 s, after the fused kernel tests.
# What is left of TOTAL_S (default 575 s, inside 600 s) after the tests above,
# less 160 s for the replicas run on a machine of several GPUs.
budget=$(( ${TOTAL_S:-575} - (SECONDS - start) - (replicas ? ${REPLICAS_BUDGET_S:-160} : 0) ))
OUT="$RES" BUDGET_S="${BUDGET_S:-$budget}" SWEEP="$SWEEP" ENGINE="--contexts 2 --cuda-graphs --batching $fused" \
  BEAM_BUILD="${BEAM_BUILD:-$beam_build}" \
  BATCHED_ENGINE="$unbatched" W1_ENGINE="--contexts 2 --cuda-graphs --batching $fused" \
  bash scripts/gpu_bench.sh > "$RES/gpu_bench.out" 2>&1 &
bench=$!
if [[ -n "${EXTRAS:-}" ]]; then  # kernel tests, peer check and kernel timings while the W1 artifact compiles
  timeout 150 python3 -m pytest -q -m gpu tests/ops/test_packed_attention.py tests/ops/test_prefix_attention.py \
    tests/ops/test_attention_aoti.py -p no:cacheprovider > "$RES/gpu_tests.log" 2>&1
  log "attention gpu tests: exit $? -- $(tail -n 1 "$RES/gpu_tests.log")"
  for _ in $(seq 1 60); do [[ -f "$WORK/models/qwen3-0.6b/model.safetensors" ]] && break; sleep 2; done
  sleep 5
  timeout 90 python3 scripts/peer_check.py "$WORK/models/qwen3-0.6b" > "$RES/peer_check.log" 2>&1
  log "peer check: exit $?"; grep -v -i warn "$RES/peer_check.log" | tail -n 8
  timeout 70 python3 -c "
from boundgen.bench.kernels import run_kernel_benchmarks, markdown_table
print(markdown_table(run_kernel_benchmarks()))" > "$RES/kernels.md" 2>&1
  log "kernel bench: exit $?"
fi
wait $bench
log "gpu_bench.sh done"
if (( replicas )); then  # serve --gpus 1, 2, ... over gRPC, with the W1 artifact just built
  OUT="$RES/replicas" BUDGET_S="$(( ${TOTAL_S:-575} - (SECONDS - start) ))" GPU_COUNTS="0 $(seq -s ' ' 1 "$gpus")" \
    SWEEP="--concurrency 1,2,4,8,16,32 --duration 2 --warmup 1" bash scripts/gpu_replicas.sh > "$RES/gpu_replicas.out" 2>&1
  log "gpu_replicas.sh: exit $?"; tail -n 8 "$RES/gpu_replicas.out"
fi
tail -n 60 "$RES/gpu_bench.out"
cp "$RES/summary.md" "$RES/latency_vs_qps.png" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$RES" --exclude='trace_*' . && tar czf "$OUT/traces.tgz" -C "$RES" --wildcards 'trace_*' 2>/dev/null
ls -la "$OUT"
