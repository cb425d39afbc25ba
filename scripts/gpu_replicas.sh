#!/usr/bin/env bash
# On a multi-GPU machine, in under 10 minutes: W1 capacity of `boundgen serve --gpus N`
# over KServe v2 gRPC at N = 1, 2, ... (up to the GPUs present), and the scaling efficiency.
#
#   OUT=/dir bash scripts/gpu_replicas.sh     (system python3; boundgen installed into it, scripts/gpu_install.sh)
#
# Reuses the W1 artifact of scripts/gpu_bench.sh in $WORK when that machine is still the same
# one (it stays warm ~30 s after a call), else writes the checkpoint and builds it (~2-3 min).
# With BEAM_REBUILD=1 it first builds the W2/W3 beam artifact once more into $WORK/art/beam2
# (a second H200 build of the same program: does the beam build pass twice in a row).
# Knobs: GPU_COUNTS (default "0 1 2"; 0 = plain `serve` on GPU 0, no front end: what the front
# end's extra gRPC hop costs), SWEEP (bench flags), BUDGET_S (default 560);
# SERVE_FLAG=--replicas and W1=<a CPU score artifact> try the same steps on a CPU machine.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_replicas}"; WORK="${WORK:-/tmp/boundgen_gpu_bench}"; PY="${PY:-python3}"
BUDGET_S="${BUDGET_S:-560}"; GPU_COUNTS="${GPU_COUNTS:-0 1 2}"
SWEEP="${SWEEP:---concurrency 4,8,16,32,48,64 --duration 3 --warmup 1}"
mkdir -p "$OUT" "$WORK/models" "$WORK/art"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
export PYTHONUNBUFFERED=1
source "$root/scripts/gpu_artifacts.sh"
source "$root/scripts/gpu_env.sh"
start=$SECONDS
left() { echo $(( BUDGET_S - (SECONDS - start) )); }
log() { echo "[gpu_replicas +$(( SECONDS - start ))s] $*" | tee -a "$OUT/replicas.log" >&2; }
{ date -u; nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>&1; nproc
  cat "$root/COMMIT" 2>/dev/null || git -C "$root" rev-parse --short HEAD 2>/dev/null; } > "$OUT/env_replicas.txt"
cat "$OUT/env_replicas.txt" >&2
: > "$OUT/commands_replicas.txt"
run_logged() {  # LIMIT NAME CMD...
  local limit=$1 name=$2; shift 2
  printf '%q ' "$@" >> "$OUT/commands_replicas.txt"; echo >> "$OUT/commands_replicas.txt"
  timeout -s INT -k 15 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?; log "$name: exit $rc"; (( rc )) && tail -n 15 "$OUT/$name.log" >&2
  return $rc
}

Q3="${Q3:-$WORK/models/qwen3-0.6b}"; Q2="$WORK/models/qwen2.5-0.5b"; W1="${W1:-$WORK/art/w1}"
SERVE_FLAG="${SERVE_FLAG:---gpus}"
[[ -f "$Q3/model.safetensors" ]] || run_logged 150 demo_qwen3 "$PY" -m boundgen demo-model "$Q3" --preset qwen3-0.6b --seed 0
pids=()
if [[ ! -f "$W1/manifest.json" ]] || ! grep -q '"batching": true' "$W1/manifest.json"; then
  log "no batching W1 artifact in $WORK: building it"
  rm -rf "$W1"
  # shellcheck disable=SC2086
  run_logged 330 build_w1 "$PY" -m boundgen build "$Q3" "${W1_ARGS[@]}" --out "$W1" $W1_DEFAULT &
  pids+=($!)
else
  log "reusing $W1"
fi
if [[ "${BEAM_REBUILD:-0}" == 1 ]]; then
  [[ -f "$Q2/model.safetensors" ]] || run_logged 150 demo_qwen2 "$PY" -m boundgen demo-model "$Q2" --preset qwen2.5-0.5b --seed 0
  rm -rf "$WORK/art/beam2"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES="${BEAM_REBUILD_GPU:-1}" run_logged 330 build_beam2 "$PY" -m boundgen build "$Q2" \
    "${BEAM_ARGS[@]}" --out "$WORK/art/beam2" $BEAM_DEFAULT &
  pids+=($!)
fi
for p in "${pids[@]}"; do wait "$p"; done
[[ -f "$W1/manifest.json" ]] || { log "no W1 artifact: nothing to serve"; exit 1; }

port=8101
for n in $GPU_COUNTS; do
  (( $(left) < 60 )) && { log "SKIP $SERVE_FLAG $n: out of time"; continue; }
  http=$port; grpc=$(( port + 1 )); port=$(( port + 2 ))
  flags=("$SERVE_FLAG" "$n"); only=()
  (( n == 0 )) && { flags=(); only=(CUDA_VISIBLE_DEVICES=0); }  # 0: plain serve on GPU 0, no front end
  log "serve ${flags[*]:-(no front end)} (HTTP :$http, gRPC :$grpc)"
  printf '%q ' "$PY" -m boundgen serve "$W1" "${flags[@]}" --http-port "$http" --grpc-port "$grpc" >> "$OUT/commands_replicas.txt"
  echo >> "$OUT/commands_replicas.txt"
  env "${only[@]}" "$PY" -m boundgen serve "$W1" "${flags[@]}" --http-port "$http" \
    --grpc-port "$grpc" > "$OUT/serve_g$n.log" 2>&1 &
  server=$!
  ready=0
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$http/v2/health/ready" > /dev/null 2>&1 && { ready=1; break; }
    kill -0 $server 2>/dev/null || break
    sleep 0.5
  done
  if (( ready )); then
    log "$SERVE_FLAG $n ready"
    # shellcheck disable=SC2086
    run_logged $(( $(left) - 20 )) bench_g$n "$PY" -m boundgen bench --workload W1 --grpc "127.0.0.1:$grpc" --model w1 \
      --model-dir "$Q3" --out "$OUT/g$n" --seed 0 $SWEEP
    curl -s "http://127.0.0.1:$http/metrics" 2>/dev/null | grep -E '^boundgen_(worker|requests)' > "$OUT/metrics_g$n.txt"
  else
    log "$SERVE_FLAG $n never became ready"; tail -n 20 "$OUT/serve_g$n.log" >&2
  fi
  kill -TERM $server 2>/dev/null
  for _ in $(seq 1 40); do kill -0 $server 2>/dev/null || break; sleep 0.5; done
  kill -KILL $server 2>/dev/null; wait $server 2>/dev/null
done

"$PY" - "$OUT" $GPU_COUNTS <<'EOF' | tee "$OUT/replicas_summary.md"
import json, sys
from pathlib import Path
out, counts = Path(sys.argv[1]), sys.argv[2:]
rows, base = [], None
for n in counts:
    f = out / f"g{n}" / "bench_W1.json"
    if not f.is_file():
        rows.append(f"| {n} | no result | | | | |")
        continue
    system = json.loads(f.read_text())["systems"]["boundgen"]
    sweep = system.get("sweep") or {}
    cap = sweep.get("capacity") or {}
    peak = max((lv["qps"] for lv in sweep.get("levels", []) if lv.get("completed")), default=0.0)
    qps = cap.get("qps", 0.0)
    if n == "0":  # plain serve, no front end: no efficiency
        rows.append(f"| 1, no front end | {qps:.1f} | {cap.get('concurrency', '-')} | - | {peak:.1f} | - |")
        continue
    if base is None:  # the first GPU count measured is the base of the efficiencies
        base = (int(n), qps, peak)
    eff = lambda value, ref: f"{value * base[0] / (int(n) * ref):.0%}" if value and ref else "-"
    rows.append(f"| {n} | {qps:.1f} | {cap.get('concurrency', '-')} | {eff(qps, base[1])} | {peak:.1f} | "
                f"{eff(peak, base[2])} |")
print(f"| GPUs | W1 QPS within budget | at concurrency | efficiency vs {base[0] if base else '-'} GPU(s) | peak QPS "
      "| peak efficiency |")
print("| --- | --- | --- | --- | --- | --- |")
print("\n".join(rows))
EOF
log "done"
