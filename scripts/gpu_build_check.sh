#!/usr/bin/env bash
# Build checks on the H200, for the GPU image: system python3, no venv.
#
#   OUT=/some/dir bash scripts/gpu_build_check.sh
#
# Writes the demo checkpoints (qwen3-0.6b, qwen2.5-0.5b) unless they exist, then builds in parallel
#   w1    score, qwen3-0.6b, 15 samples x 256 tokens (3840 in all), labels " yes" " no", cuda, bf16
#   beam  beam, qwen2.5-0.5b, W=100, N_gen=5, prompts up to 512 tokens (serves W2 and W3), cuda, bf16
# and, with PACKAGED=1, w1 again with the weights inside the package (the load-time comparison of
# docs/build.md). Then it loads each artifact in a fresh process and prints one markdown row per
# artifact (python -m boundgen.compile.report): build seconds, size, load seconds, first/warm call,
# validation's worst errors. Logs, commands and report.json go to $OUT.
# Knobs: WORK (checkpoints and artifacts; default /tmp/boundgen_gpu_build), PY (python3),
#   W1_BUILD / BEAM_BUILD (extra build flags, e.g. "--lowering packed_attention=triton"),
#   LIMIT_S (per build, default 420). For a dry run of this script on a CPU machine:
#   DEVICE=cpu DTYPE=float32 Q3_PRESET=tiny-qwen3 Q2_PRESET=tiny-qwen2 PY=.venv/bin/python bash scripts/gpu_build_check.sh
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_build}"
WORK="${WORK:-/tmp/boundgen_gpu_build}"
PY="${PY:-python3}"
LIMIT_S="${LIMIT_S:-420}"
W1_BUILD="${W1_BUILD:-}"
BEAM_BUILD="${BEAM_BUILD:-}"
DEVICE="${DEVICE:-cuda}"
DTYPE="${DTYPE:-bfloat16}"
Q3_PRESET="${Q3_PRESET:-qwen3-0.6b}"
Q2_PRESET="${Q2_PRESET:-qwen2.5-0.5b}"
mkdir -p "$OUT" "$WORK/models" "$WORK/art"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
# No LD_PRELOAD here on purpose: `python3 -m boundgen` and `python3 -m boundgen.compile.report`
# re-execute themselves with the system libstdc++ preloaded (boundgen/runtime/libstdcxx.py);
# env.txt records whether that is what happened.
start=$SECONDS
log() { echo "[gpu_build_check +$(( SECONDS - start ))s] $*" | tee -a "$OUT/gpu_build_check.log" >&2; }
step() {  # step NAME CMD...: output to $OUT/NAME.log, cut after LIMIT_S
  local name=$1
  shift
  log "$name"
  printf '%q ' "$@" >> "$OUT/commands.txt"; echo >> "$OUT/commands.txt"
  timeout -s INT -k 15 "$LIMIT_S" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc"
  (( rc )) && tail -n 20 "$OUT/$name.log" >&2
  return $rc
}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  "$PY" -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "triton", triton.__version__)' 2>&1
  git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "commit: unknown"
  "$PY" -c 'from boundgen.runtime import libstdcxx as l; print("libstdc++ preload needed:", l.torch_needs_preload(), "lib:", l.system_libstdcxx())'
} > "$OUT/env.txt"
cat "$OUT/env.txt" >&2
: > "$OUT/commands.txt"

Q3="$WORK/models/$Q3_PRESET"
Q2="$WORK/models/$Q2_PRESET"
[[ -f "$Q3/model.safetensors" ]] || step demo_qwen3 "$PY" -m boundgen demo-model "$Q3" --preset "$Q3_PRESET" --seed 0 &
[[ -f "$Q2/model.safetensors" ]] || step demo_qwen2 "$PY" -m boundgen demo-model "$Q2" --preset "$Q2_PRESET" --seed 0 &
wait

W1=(--task score --labels " yes" " no" --max-samples 15 --max-tokens-per-sample 256 --max-total-tokens 3840
    --device "$DEVICE" --dtype "$DTYPE")
# shellcheck disable=SC2086
step build_w1 "$PY" -m boundgen build "$Q3" "${W1[@]}" --name w1 --out "$WORK/art/w1" --force $W1_BUILD &
# shellcheck disable=SC2086
step build_beam "$PY" -m boundgen build "$Q2" --task beam --width 100 --steps 5 --max-prompt-tokens 512 \
  --device "$DEVICE" --dtype "$DTYPE" --name beam --out "$WORK/art/beam" --force $BEAM_BUILD &
wait
if [[ "${PACKAGED:-0}" == 1 ]]; then
  # shellcheck disable=SC2086
  step build_w1_packaged "$PY" -m boundgen build "$Q3" "${W1[@]}" --name w1-packaged --weights packaged \
    --out "$WORK/art/w1-packaged" --force $W1_BUILD
fi

built=()
for a in w1 beam w1-packaged; do [[ -f "$WORK/art/$a/manifest.json" ]] && built+=("$WORK/art/$a"); done
# One fresh process per artifact, so that each load time is a cold start of the package.
echo "# boundgen GPU build check ($(( SECONDS - start )) s)"
first=1
for a in "${built[@]}"; do
  name=$(basename "$a")
  step "report_$name" "$PY" -m boundgen.compile.report "$a" --json "$OUT/report_$name.json" || continue
  if (( first )); then grep '^| ' "$OUT/report_$name.log" | head -n 2; first=0; fi
  grep '^| ' "$OUT/report_$name.log" | tail -n 1
  du -sh "$a"/* >> "$OUT/sizes.txt"
done
echo
cat "$OUT/env.txt"
