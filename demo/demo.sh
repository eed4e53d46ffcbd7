#!/usr/bin/env bash
# make demo: a Temporal dev server with its Web UI, a tabletd cluster with a
# workload, a worker, and a live stream "orders" into .data/out. Idempotent:
# whatever already runs (by recorded process ID) is left alone.
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

start_worker

# tabletd keeps its data and streams in memory: a restarted one no longer
# has the stream the Temporal server remembers. Start over.
if [ "$fresh_tabletd" = yes ]; then
  new_source orders "$DATA/out" "tabletd was restarted"
fi

sed "s|@OUT@|$DATA/out|" demo/orders.json >"$DATA/orders.json"
start_stream orders "$DATA/orders.json"

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
