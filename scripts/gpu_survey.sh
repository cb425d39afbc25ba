#!/usr/bin/env bash
# In one go (< 10 minutes): GPU kernel tests, kernel timings, AOTI builds (Triton and torch attention),
# and a one-request-at-a-time survey of eager and compiled engines against the HF peer.
#   OUT=/dir bash scripts/gpu_survey.sh      (system python3; boundgen installed into it, scripts/gpu_install.sh)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_survey}"; W="${WORK:-/tmp/boundgen_survey}"
mkdir -p "$OUT" "$W/models" "$W/art"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
lib="$(ldconfig -p 2>/dev/null | grep -m1 'libstdc++.so.6 ' | awk '{print $NF}')"; export LD_PRELOAD="${LD_PRELOAD:-$lib}"
start=$SECONDS; log() { echo "[survey +$(( SECONDS - start ))s] $*"; }
python3 -m boundgen demo-model "$W/models/qwen3-0.6b" --preset qwen3-0.6b > "$W/demo.log" 2>&1 &
python3 -m boundgen demo-model "$W/models/qwen2.5-0.5b" --preset qwen2.5-0.5b >> "$W/demo.log" 2>&1 &
wait; log "demo checkpoints written"
build() {  # name model args...
  local name=$1 model=$2; shift 2
  local t0=$SECONDS
  timeout 280 python3 -m boundgen build "$W/models/$model" --device cuda --dtype bfloat16 --name "$name" \
    --out "$W/art/$name" --force "$@" > "$W/build_$name.log" 2>&1
  log "build $name: exit $? in $(( SECONDS - t0 ))s; $(du -sh "$W/art/$name" 2>/dev/null | cut -f1)"
  { echo "=== build $name"; tail -n 40 "$W/build_$name.log"; } >> "$OUT/builds.log"
}
build w1-triton qwen3-0.6b --task score --labels " yes" " no" --max-samples 15 --max-tokens-per-sample 256 \
  --max-total-tokens 3840 --lowering packed_attention=triton &
build w1-torch qwen3-0.6b --task score --labels " yes" " no" --max-samples 15 --max-tokens-per-sample 256 \
  --max-total-tokens 3840 &
build beam-triton qwen2.5-0.5b --task beam --width 100 --steps 5 --min-new-tokens 5 --max-prompt-tokens 400 \
  --lowering packed_attention=triton --lowering prefix_attention=triton &
build beam-torch qwen2.5-0.5b --task beam --width 100 --steps 5 --min-new-tokens 5 --max-prompt-tokens 400 &
timeout 150 python3 -m pytest -q -m gpu tests/ops -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
log "gpu tests: exit $? -- $(tail -n 1 "$OUT/gpu_tests.log")"
timeout 120 python3 -c "
from boundgen.bench.kernels import run_kernel_benchmarks, markdown_table
print(markdown_table(run_kernel_benchmarks()))" > "$OUT/kernels.md" 2>&1
log "kernel bench: exit $?"
wait
log "builds done"
timeout 270 python3 scripts/gpu_smoke.py "$OUT" "$W/models" "$W/art" 2>&1 | grep -v -i warn | tee "$OUT/smoke.log"
for f in "$W"/art/*/manifest.json; do
  python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[1], json.dumps(m.get('validation'))[:600])" "$f"
done > "$OUT/validation.txt" 2>&1
log "done"
