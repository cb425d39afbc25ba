# Sourced by the kernel scripts (gpu_attention.sh, gpu_decode_mlp.sh, gpu_vocab_topk.sh) with their name
# as its argument: the tree installed as the boundgen package (gpu_install.sh), $OUT (default
# out/gpu_NAME), log(), and the step each of them takes first, `gpu_tests LIMIT FILE...`: the files'
# GPU tests, their last line logged and, if they fail, the failures shown; it returns pytest's status.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-$root/out/gpu_$1}"
mkdir -p "$OUT"
source "$root/scripts/gpu_install.sh"  # boundgen as an installed package (no PYTHONPATH)
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
_kernel_script=$1
start=$SECONDS
log() { echo "[$_kernel_script +$(( SECONDS - start ))s] $*"; }
gpu_tests() {
  local limit=$1 rc
  shift
  timeout "$limit" python3 -m pytest -q -m gpu "$@" -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  log "gpu tests: exit $rc -- $(tail -n 1 "$OUT/gpu_tests.log")"
  (( rc == 0 )) || grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/gpu_tests.log" | head -n 20
  return $rc
}
