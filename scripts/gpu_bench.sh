#!/usr/bin/env bash
# The GPU benchmark in one go, for the H200 image: system python3, no venv.
#
#   OUT=/some/dir bash scripts/gpu_bench.sh
#
# Writes demo checkpoints (qwen3-0.6b, qwen2.5-0.5b), builds the W1 score artifact and one beam
# artifact (W=100, N_gen=5, prompts up to 400 tokens) serving W2 and W3, then runs `boundgen bench`
# on W1 and on W2,W3, then the HF transformers peer in its own process (profiles, the 1,024-token
# diagnostic, an open-loop run at 1.2x the best closed-loop QPS) and prints a markdown summary.
# $OUT gets bench_W*.json, latency_W*.png, latency_vs_qps.png, summary*.md, profile_*.md,
# trace_*.json.gz, one log per step, commands.txt and env.txt; checkpoints and artifacts stay in
# $WORK. If a build fails, that workload is measured on the eager engine (uncompiled) instead,
# and the JSON says so ("target").
#
# Every step is cut by a deadline so that the whole run stays under BUDGET_S seconds (default 515:
# < 9 minutes) and the summary is always written. Knobs (environment):
#   WORK        where checkpoints and artifacts go (default /tmp/boundgen_gpu_bench)
#   W1_BUILD    extra `boundgen build` flags for W1, or "skip" (no W1 build, no W1 bench)
#               (default: Triton packed attention)
#   BEAM_BUILD  extra `boundgen build` flags for beam, or "skip" (W2/W3 then run on the eager engine
#               with Triton attention and CUDA graphs) (default: Triton attention, up to 8 requests
#               per call, CUDA graphs, 2 contexts, token bucket 128)
#   W1_BENCH    0: build W1 but do not bench it (e.g. for scripts/gpu_replicas.sh)
#   BENCH_RESERVE_S  seconds of BUDGET_S kept for the benches after the builds (default 250), unless
#               that leaves the builds less than MIN_BUILD_S (default 300)
#   W1_ENGINE   engine overrides for W1 (default: --contexts 2 --cuda-graphs --batching)
#   ENGINE      engine overrides for W2/W3 (default: --contexts 4 --cuda-graphs)
#   BATCHED_ENGINE  if set, W2/W3 run a second time, without the peer, with these engine flags
#               (e.g. --batching ..., or the unbatched flags when ENGINE batches), results in $OUT/batched/
#   SWEEP       load-generator flags                  (default: levels 1..32, 3 s each)
#   PEER        peer flags (default: --peer-mode eager --peer-pads bucket; scripts/gpu_peers.sh measures
#               both modes and probes the paddings, in its own ~5 minutes)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_bench}"
WORK="${WORK:-/tmp/boundgen_gpu_bench}"
PY="${PY:-python3}"
BUDGET_S="${BUDGET_S:-515}"
source "$root/scripts/gpu_artifacts.sh"
W1_BUILD="${W1_BUILD:-$W1_DEFAULT}"
BEAM_BUILD="${BEAM_BUILD:-$BEAM_DEFAULT}"
W1_ENGINE="${W1_ENGINE:---contexts 2 --cuda-graphs --batching}"
ENGINE="${ENGINE:---contexts 4 --cuda-graphs}"
SWEEP="${SWEEP:---concurrency 1,2,4,8,16,32 --duration 3 --warmup 0.5 --open-loop-rate auto --profile-requests 20}"
PEER="${PEER:---peer-mode eager --peer-pads bucket}"
mkdir -p "$OUT" "$WORK/models" "$WORK/art"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
# Loading an AOTInductor package segfaults on this image unless the system libstdc++ is
# preloaded (docs/build.md, "The AOTInductor load crash"). `python3 -m boundgen` re-executes itself with it; setting it here
# once covers every process of this script the same way.
source "$root/scripts/gpu_env.sh"

start=$SECONDS
left() { echo $(( BUDGET_S - (SECONDS - start) )); }
log() { echo "[gpu_bench +$(( SECONDS - start ))s] $*" | tee -a "$OUT/gpu_bench.log" >&2; }
# step LIMIT_S NAME CMD...: run CMD with its output in $OUT/NAME.log, interrupted after LIMIT_S.
step() {
  local limit=$1 name=$2
  shift 2
  if (( limit < 10 )); then log "SKIP $name: out of time"; return 124; fi
  log "$name (limit ${limit}s)"
  printf '%q ' "$@" >> "$OUT/commands.txt"; echo >> "$OUT/commands.txt"
  timeout -s INT -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc$( (( rc )) && echo " -- last lines of $name.log:" )"
  (( rc )) && tail -n 15 "$OUT/$name.log" >&2
  return $rc
}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)' 2>&1
  # A snapshot (git archive) carries its commit in COMMIT; inside another checkout, git would name that one.
  cat "$root/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "commit: unknown (no .git)"
  echo "LD_PRELOAD=${LD_PRELOAD:-}"; } > "$OUT/env.txt"
cat "$OUT/env.txt" >&2
: > "$OUT/commands.txt"

Q3="$WORK/models/qwen3-0.6b"
Q2="$WORK/models/qwen2.5-0.5b"
step 150 demo_qwen3 "$PY" -m boundgen demo-model "$Q3" --preset qwen3-0.6b --seed 0 &
p1=$!
step 150 demo_qwen2 "$PY" -m boundgen demo-model "$Q2" --preset qwen2.5-0.5b --seed 0 &
p2=$!
wait $p1; wait $p2

# Both builds at once: compilation is CPU work and the machine has 16 cores.
# A cold machine needed > 218 s for the beam build with the vocabulary top-K kernel (2026-11-29,
# c3c4746): builds get at least MIN_BUILD_S, taken from the benches' reserve if need be.
build_limit=$(( $(left) - ${BENCH_RESERVE_S:-250} ))
(( build_limit > 330 )) && build_limit=330
(( build_limit < ${MIN_BUILD_S:-300} )) && build_limit=${MIN_BUILD_S:-300}
(( build_limit > $(left) - 40 )) && build_limit=$(( $(left) - 40 ))
# shellcheck disable=SC2086
[[ "$W1_BUILD" == skip ]] && { log "W1 skipped (W1_BUILD=skip)"; true; } || \
step "$build_limit" build_w1 "$PY" -m boundgen build "$Q3" "${W1_ARGS[@]}" --out "$WORK/art/w1" --force $W1_BUILD &
p1=$!
# shellcheck disable=SC2086
[[ "$BEAM_BUILD" == skip ]] && { log "beam build skipped (BEAM_BUILD=skip)"; true; } || \
step "$build_limit" build_beam "$PY" -m boundgen build "$Q2" "${BEAM_ARGS[@]}" --out "$WORK/art/beam" --force $BEAM_BUILD &
p2=$!
wait $p1; wait $p2
target_w1="$WORK/art/w1"; [[ -f "$target_w1/manifest.json" ]] || { target_w1="$Q3"; log "W1: no artifact, benching the eager engine"; }
target_beam="$WORK/art/beam"; [[ -f "$target_beam/manifest.json" ]] || { target_beam="$Q2"; log "W2/W3: no artifact, benching the eager engine"; }

# W1 gets ~40% of what is left, W2 + W3 the rest, 25 s kept for the summary.
w1_limit=$(( ($(left) - 25) * 2 / 5 ))
# shellcheck disable=SC2086
[[ "$W1_BUILD" == skip || "${W1_BENCH:-1}" == 0 ]] || \
step "$w1_limit" bench_w1 "$PY" -m boundgen bench --workload W1 --artifact "$target_w1" --peer "$Q3" \
  --out "$OUT" --seed 0 --profile --diagnostic $SWEEP $W1_ENGINE $PEER
if [[ -n "${BATCHED_ENGINE:-}" ]]; then  # W2/W3 a second time, requests batched, no peer
  beam_limit=$(( ($(left) - 25) * 3 / 5 ))
else
  beam_limit=$(( $(left) - 25 ))
fi
# shellcheck disable=SC2086
step "$beam_limit" bench_w2_w3 "$PY" -m boundgen bench --workload W2,W3 --artifact "$target_beam" --peer "$Q2" \
  --out "$OUT" --seed 0 --profile $SWEEP $ENGINE $PEER
if [[ -n "${BATCHED_ENGINE:-}" ]]; then
  mkdir -p "$OUT/batched"
  # shellcheck disable=SC2086
  step $(( $(left) - 25 )) bench_w2_w3_batched "$PY" -m boundgen bench --workload W2,W3 --artifact "$target_beam" \
    --out "$OUT/batched" --seed 0 --profile $SWEEP $BATCHED_ENGINE
fi

shopt -s nullglob
results=("$OUT"/bench_W*.json "$OUT"/batched/bench_W*.json)
if (( ${#results[@]} )); then
  "$PY" -m boundgen.bench.report "${results[@]}" --png "$OUT/latency_vs_qps.png" --markdown "$OUT/summary.md" \
    > /dev/null 2> "$OUT/report.log" || tail -n 15 "$OUT/report.log" >&2
fi
for f in "$OUT"/profile_*.md; do
  echo
  head -n 12 "$f"
done
echo
echo "# boundgen GPU bench ($(( SECONDS - start )) s; commands in commands.txt, logs beside them)"
echo
cat "$OUT/env.txt"
echo
if [[ -f "$OUT/summary.md" ]]; then cat "$OUT/summary.md"; else echo "no results: see the logs in $OUT"; fi
