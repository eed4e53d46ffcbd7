#!/usr/bin/env bash
# make demo: a Temporal dev server with its Web UI, a tabletd cluster with a
# workload, a worker, and a live stream "orders" into .data/out. Idempotent:
# whatever already runs (by recorded process ID) is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/bin
DATA=$PWD/.data
mkdir -p "$DATA"
export TEMPORAL_ADDRESS=127.0.0.1:7233

running() { [ -f "$DATA/$1.pid" ] && kill -0 "$(cat "$DATA/$1.pid")" 2>/dev/null; }

# start NAME CMD...: run CMD in the background unless NAME already runs.
start() {
  local name=$1; shift
  if running "$name"; then
    echo "$name already running (pid $(cat "$DATA/$name.pid"))"
    return
  fi
  nohup "$@" >"$DATA/$name.log" 2>&1 &
  echo $! >"$DATA/$name.pid"
  echo "$name started (pid $!, log .data/$name.log)"
}

# wait_for WHAT CMD...: retry CMD for up to 60 s.
wait_for() {
  local what=$1; shift
  for _ in $(seq 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "demo: $what did not come up; see .data/*.log" >&2
  exit 1
}

sa=()
for a in TabletflowStream TabletflowTablet TabletflowState TabletflowReplica; do
  sa+=(--search-attribute "$a=Keyword")
done
start temporal "$BIN/temporal" server start-dev --ip 127.0.0.1 --port 7233 --ui-port 8233 \
  --db-filename "$DATA/temporal.db" --log-level warn "${sa[@]}"
wait_for "the Temporal dev server" "$BIN/temporal" operator cluster health

fresh_tabletd=yes
running tabletd && fresh_tabletd=no
start tabletd "$BIN/tabletd" serve --listen 127.0.0.1:15991 --keyspace commerce \
  --cells zone1,zone2,zone3 --servers-per-cell 2 --tablets 8 --replicas 3 \
  --rate 200 --lag 50ms --retention 1h
wait_for "tabletd" "$BIN/tabletd" ctl --addr 127.0.0.1:15991 list

start worker "$BIN/worker" --log-format json

stream_running() {
  local out
  out=$("$BIN/temporal" workflow describe --workflow-id orders -o json 2>/dev/null) || return 1
  [[ $out == *'"status": "WORKFLOW_EXECUTION_STATUS_RUNNING"'* ]]
}
if [ "$fresh_tabletd" = yes ] && stream_running; then
  # tabletd keeps its data and streams in memory: a restarted one no
  # longer has the stream the Temporal server remembers. Start over.
  echo "tabletd was restarted: ending the old stream orders and its tablets, starting a new one"
  "$BIN/temporal" workflow terminate --query 'TabletflowStream="orders" AND ExecutionStatus="Running"' \
    --reason "tabletd restarted" --yes >/dev/null
  for _ in $(seq 50); do stream_running || break; sleep 0.2; done
  rm -rf "$DATA/out"
fi

sed "s|@OUT@|$DATA/out|" demo/orders.json >"$DATA/orders.json"
if stream_running; then
  echo "stream orders already running"
else
  "$BIN/temporal" workflow start --type StreamWorkflow --task-queue tabletflow \
    --workflow-id orders --input-file "$DATA/orders.json" >/dev/null
  echo "stream orders started"
fi

cat <<MSG

tabletflow demo is up.
  Web UI:  http://127.0.0.1:8233/namespaces/default/workflows?query=TabletflowStream%3D%22orders%22
  stream:  orders (sink: .data/out/<tablet>.jsonl)

Watch:
  bin/starter status orders --watch
  bin/temporal workflow query --workflow-id orders --type status
  bin/temporal workflow list --query 'TabletflowStream="orders" AND TabletflowState!="Streaming"'
  bin/tabletd ctl tail --tablet t-0003
Exclude a replica, then lift it:
  bin/temporal workflow signal --workflow-id orders --name exclude \\
      --input '{"aliases": ["zone1-0000000101"], "reason": "maintenance", "ttl": "10m"}'
  bin/temporal workflow signal --workflow-id orders --name include --input '{"aliases": ["zone1-0000000101"]}'
Pause and resume a tablet:
  bin/temporal workflow signal --workflow-id orders --name pause --input '{"tablets": ["t-0003"]}'
  bin/temporal workflow signal --workflow-id orders --name resume --input '{"tablets": ["t-0003"]}'
Inject a fault, heal it, split a tablet:
  bin/tabletd ctl fault --server zone1-0000000101 --tablet t-0003 --position-mismatch
  bin/tabletd ctl fault --server zone2-0000000201 --down
  bin/tabletd ctl heal --server zone2-0000000201
  bin/tabletd ctl split --tablet t-0003
Stop everything:  make stop
MSG
