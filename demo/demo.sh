#!/usr/bin/env bash
# make demo: a Temporal dev server with its Web UI, a tabletd cluster with a
# workload, a worker, and a live stream "orders" into .data/out. Idempotent:
# whatever already runs (by recorded process ID) is left alone.
#
# With TABLETFLOW_DEMO_SINK_DSN set (a PostgreSQL DSN, given to the
# worker) the stream writes into that database instead, in changelog mode
# (tables tabletflow.changes and tabletflow.checkpoints), and is named
# orders-<UTC time of its start>, one per tabletd: tabletd keeps its data in
# memory, so the stream of a new one must not resume from the checkpoints
# an earlier one left in the database (the sink never deletes rows).
set -euo pipefail
cd "$(dirname "$0")/.."
. demo/lib.sh

start_temporal

fresh_tabletd=yes
running tabletd && fresh_tabletd=no
start tabletd "$BIN/tabletd" serve --listen 127.0.0.1:15991 --keyspace commerce \
  --cells zone1,zone2,zone3 --servers-per-cell 2 --tablets 8 --replicas 3 \
  --rate 200 --lag 50ms --retention 1h
wait_for tabletd "tabletd" "$BIN/tabletd" ctl --addr 127.0.0.1:15991 list

if [ -n "${TABLETFLOW_DEMO_SINK_DSN:-}" ] && running worker &&
  ! worker_env_has "TABLETFLOW_DEMO_SINK_DSN=$TABLETFLOW_DEMO_SINK_DSN"; then
  echo "restarting the worker with TABLETFLOW_DEMO_SINK_DSN in its environment"
  stop_proc worker
fi
start_worker

# tabletd keeps its data and streams in memory: a restarted one no longer
# has the stream the Temporal server remembers. Start over.
if [ "$fresh_tabletd" = yes ]; then
  new_source orders "$DATA/out" "tabletd was restarted"
  if [ -f "$DATA/orders-pg.id" ]; then
    new_source "$(cat "$DATA/orders-pg.id")" "" "tabletd was restarted"
    rm -f "$DATA/orders-pg.id"
  fi
fi

stream=orders
sed=(-e "s|@OUT@|$DATA/out|")
sink=".data/out/<tablet>.jsonl"
if [ -n "${TABLETFLOW_DEMO_SINK_DSN:-}" ]; then
  [ -f "$DATA/orders-pg.id" ] || date -u +orders-%Y%m%d-%H%M%S >"$DATA/orders-pg.id"
  stream=$(cat "$DATA/orders-pg.id")
  sed+=(-e 's|"sink": {[^}]*}|"sink": {"kind": "postgres", "dsnEnv": "TABLETFLOW_DEMO_SINK_DSN"}|')
  sink="PostgreSQL at \$TABLETFLOW_DEMO_SINK_DSN, tables tabletflow.changes and tabletflow.checkpoints"
fi
sed "${sed[@]}" demo/orders.json >"$DATA/$stream.json"
start_stream "$stream" "$DATA/$stream.json"

cat <<MSG

tabletflow demo is up.
  Web UI:  http://127.0.0.1:8233/namespaces/default/workflows?query=TabletflowStream%3D%22$stream%22
  stream:  $stream (sink: $sink)

Watch:
  bin/starter status $stream --watch
  bin/temporal workflow query --workflow-id $stream --type status
  bin/temporal workflow list --query 'TabletflowStream="$stream" AND TabletflowState!="Streaming"'
  bin/tabletd ctl tail --tablet t-0003
MSG
if [ -n "${TABLETFLOW_DEMO_SINK_DSN:-}" ]; then
  cat <<MSG
The rows, with any PostgreSQL client on \$TABLETFLOW_DEMO_SINK_DSN (bin/starter status
shows each tablet's checkpoint as its run's last heartbeat has it, a few seconds behind):
  SELECT tablet, count(*), max(commit_time) FROM tabletflow.changes
    WHERE stream = '$stream' GROUP BY tablet ORDER BY tablet;
  SELECT tablet, checkpoint, updated_at FROM tabletflow.checkpoints WHERE stream = '$stream';
MSG
fi
cat <<MSG
Exclude a replica, then lift it:
  bin/temporal workflow signal --workflow-id $stream --name exclude \\
      --input '{"aliases": ["zone1-0000000101"], "reason": "maintenance", "ttl": "10m"}'
  bin/temporal workflow signal --workflow-id $stream --name include --input '{"aliases": ["zone1-0000000101"]}'
Pause and resume a tablet:
  bin/temporal workflow signal --workflow-id $stream --name pause --input '{"tablets": ["t-0003"]}'
  bin/temporal workflow signal --workflow-id $stream --name resume --input '{"tablets": ["t-0003"]}'
Inject a fault, heal it, split a tablet:
  bin/tabletd ctl fault --server zone1-0000000101 --tablet t-0003 --position-mismatch
  bin/tabletd ctl fault --server zone2-0000000201 --down
  bin/tabletd ctl heal --server zone2-0000000201
  bin/tabletd ctl split --tablet t-0003
Stop everything:  make stop
MSG
