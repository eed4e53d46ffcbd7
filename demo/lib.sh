# Shell functions shared by demo/demo.sh, demo/demo-postgres.sh,
# demo/demo-vitess.sh and `make stop`; sourced, never run. Each process a
# demo starts is known by a name: its process ID in .data/NAME.pid, its
# output in .data/NAME.log.
BIN=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/bin
DATA=$(dirname "$BIN")/.data
export TEMPORAL_ADDRESS=127.0.0.1:7233

running() { [ -f "$DATA/$1.pid" ] && kill -0 "$(cat "$DATA/$1.pid")" 2>/dev/null; }

# start NAME CMD...: run CMD in the background unless NAME already runs.
start() {
  local name=$1; shift
  if running "$name"; then
    echo "$name already running (pid $(cat "$DATA/$name.pid"))"
    return
  fi
  mkdir -p "$DATA"
  nohup "$@" >"$DATA/$name.log" 2>&1 &
  echo $! >"$DATA/$name.pid"
  echo "$name started (pid $!, log .data/$name.log)"
}

# stop_proc NAME: SIGTERM to NAME, wait up to 30 s for it to end.
stop_proc() {
  local f=$DATA/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" && echo "stopped $1 (pid $pid)"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$f"
}

# wait_for NAME WHAT CMD...: retry CMD for up to WAIT_SECONDS (60) s; give
# up at once if the process NAME has exited.
wait_for() {
  local name=$1 what=$2; shift 2
  for _ in $(seq $((${WAIT_SECONDS:-60} * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    running "$name" || break
    sleep 0.2
  done
  echo "demo: $what did not come up; see .data/$name.log" >&2
  exit 1
}

# start_bed NAME WHAT ARGS...: start the test bed bin/NAME ARGS... unless
# NAME already runs, and wait up to 5 minutes (a bed's servers come up
# slowly on 2 cores) for the line its log starts with "ready". Sets
# fresh_bed to yes when the bed was started now, to no when it ran.
start_bed() {
  local name=$1 what=$2; shift 2
  fresh_bed=yes
  running "$name" && fresh_bed=no
  start "$name" "$BIN/$name" "$@"
  WAIT_SECONDS=300 wait_for "$name" "$what" grep -q '^ready' "$DATA/$name.log"
}

# start_temporal: the Temporal dev server with its Web UI and tabletflow's
# search attributes, its database in .data/temporal.db.
start_temporal() {
  local sa=() a
  for a in TabletflowStream TabletflowTablet TabletflowState TabletflowReplica; do
    sa+=(--search-attribute "$a=Keyword")
  done
  start temporal "$BIN/temporal" server start-dev --ip 127.0.0.1 --port 7233 --ui-port 8233 \
    --db-filename "$DATA/temporal.db" --log-level warn "${sa[@]}" \
    --dynamic-config-value system.enableActivityEagerExecution=true
  wait_for temporal "the Temporal dev server" "$BIN/temporal" operator cluster health
}

# start_worker: one worker serves both demos' streams. While the PostgreSQL
# bed runs it gets the bed's DSNs (.data/pg.env, KEY=DSN lines) in its
# environment, read line by line, never evaluated.
start_worker() {
  local env=()
  if running pgbed && [ -f "$DATA/pg.env" ]; then
    mapfile -t env <"$DATA/pg.env"
  fi
  # --live-every: starter status shows each tablet's progress within
  # seconds (docs/operating.md#live-status).
  start worker env "${env[@]}" "$BIN/worker" --log-format json --live-every 2s
}

# worker_env_has KEY=VALUE: the running worker's environment holds it.
worker_env_has() {
  running worker && tr '\0' '\n' <"/proc/$(cat "$DATA/worker.pid")/environ" | grep -qxF -- "$1"
}

stream_running() {
  local out
  out=$("$BIN/temporal" workflow describe --workflow-id "$1" -o json 2>/dev/null) || return 1
  [[ $out == *'"status": "WORKFLOW_EXECUTION_STATUS_RUNNING"'* ]]
}

# new_source ID OUT WHY: the source was (re)started with new data, so the
# stream ID the Temporal server remembers, and its sink OUT, belong to the
# old one: end the stream and its tablets, and empty OUT. OUT is made again
# at once: a running worker's JSONL sink made it when it first opened it,
# and only opens files in it from then on.
new_source() {
  if stream_running "$1"; then
    echo "$3: ending the old stream $1 and its tablets, starting a new one"
    "$BIN/temporal" workflow terminate --query "TabletflowStream=\"$1\" AND ExecutionStatus=\"Running\"" \
      --reason "$3" --yes >/dev/null
    for _ in $(seq 50); do stream_running "$1" || break; sleep 0.2; done
  fi
  if [ -n "$2" ]; then
    rm -rf "$2"
    mkdir -p "$2"
  fi
}

# bed_stream ID OUT WHY: after start_bed, the stream ID of the bed into
# OUT. A bed started now has new data, so a stream the Temporal server
# remembers belongs to the old one, and a stream that has ended starts
# afresh too: both begin again with an empty sink (new_source).
bed_stream() {
  if [ "$fresh_bed" = yes ] || ! stream_running "$1"; then
    new_source "$@"
  fi
}

# start_stream ID CONFIG: start the stream unless it runs.
start_stream() {
  if stream_running "$1"; then
    echo "stream $1 already running"
    return
  fi
  "$BIN/temporal" workflow start --type StreamWorkflow --task-queue tabletflow \
    --workflow-id "$1" --input-file "$2" >/dev/null
  echo "stream $1 started"
}
