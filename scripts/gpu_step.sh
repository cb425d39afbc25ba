# Sourced by the GPU run scripts, after they define RES (results folder), left() (seconds left of the
# run) and log(): `step LIMIT_S NAME CORES CMD...` runs CMD on CORES (taskset, where the machine has it)
# with its output in $RES/NAME.log, interrupted after LIMIT_S (or the run's time left), its command
# line appended to $RES/commands.txt; returns CMD's status (124 when skipped for lack of time).
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
