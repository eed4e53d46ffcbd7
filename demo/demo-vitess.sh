#!/usr/bin/env bash
# make demo-vitess: make demo with Vitess as the source. A Temporal dev
# server with its Web UI, the Vitess test bed (bin/vitessbed: etcd, vtctld,
# keyspace commerce in shards -80 and 80-, each a primary in zone1 and a
# replica in each of zone2 and zone3, vtgate, a workload through vtgate), a
# worker, and a live stream "vt-commerce" into .data/vt-out. Idempotent:
# whatever already runs (by recorded process ID) is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
. demo/lib.sh

start_temporal

# Six MariaDBs, their vttablets, a reparent per shard: minutes on 2 cores.
start_bed vitessbed "the Vitess bed" --dir "$DATA/vt" --rate 5 --config "$DATA/vt-commerce.json" \
  --out "$DATA/vt-out" --socket "$DATA/vitessbed.sock"

# A new bed has new ports and new GTID histories: the stream the Temporal
# server remembers, and its sink, belong to the old one.
bed_stream vt-commerce "$DATA/vt-out" "the Vitess bed was restarted"
start_worker
start_stream vt-commerce "$DATA/vt-commerce.json"
vtgate=$(awk '$1 == "vtgate" { print $2; exit }' "$DATA/vitessbed.log")

cat <<MSG

tabletflow Vitess demo is up.
  Web UI:  http://127.0.0.1:8233/namespaces/default/workflows?query=TabletflowStream%3D%22vt-commerce%22
  stream:  vt-commerce (sink: .data/vt-out/<shard>.jsonl; config: .data/vt-commerce.json)
  source:  keyspace commerce; each shard reads its zone2 replica while it can
           -80: zone1-0000000100 (primary), zone2-0000000101, zone3-0000000102
           80-: zone1-0000000200 (primary), zone2-0000000201, zone3-0000000202
           servers, addresses and logs: .data/vitessbed.log
  vtgate:  mariadb -h ${vtgate%:*} -P ${vtgate##*:} commerce -e 'SELECT count(*) FROM corder'

Watch:
  bin/starter status vt-commerce --watch
  bin/temporal workflow query --workflow-id vt-commerce --type status
  bin/vitessbed ctl tablets       # each vttablet, its replication, its GTID position
  tail -f .data/vt-out/-80.jsonl
Exclude the replica -80 reads (it moves to zone3-0000000102 within seconds), then lift
the exclusion (back on zone2-0000000101 within a minute or so):
  bin/starter exclude vt-commerce --aliases zone2-0000000101 --reason maintenance --ttl 10m
  bin/starter include vt-commerce --aliases zone2-0000000101
A replica behind the stream: stop zone3-0000000202's replication, then take 80-'s
zone2 replica out. 80- tries zone3-0000000202, which answers GTIDSet Mismatch (in
.data/worker.log), and moves to its primary; 80-'s own exclude list shows
zone3-0000000202 as POSITION_MISMATCH. Then start its replication, lift both:
  bin/vitessbed ctl stop-replication zone3-0000000202
  bin/starter exclude vt-commerce --aliases zone2-0000000201 --tablet 80- --reason maintenance
  bin/starter status vt-commerce --json | grep -B2 -A3 POSITION_MISMATCH
  bin/vitessbed ctl start-replication zone3-0000000202
  bin/starter include vt-commerce --aliases zone2-0000000201,zone3-0000000202
Kill the vttablet 80- reads (it turns unhealthy: 80- moves to zone3-0000000202), then
start it again (80- is back on it within a minute or so):
  bin/vitessbed ctl kill zone2-0000000201
  bin/vitessbed ctl restart zone2-0000000201
Stop the stream, then everything:
  bin/starter stop vt-commerce
  make stop
MSG
