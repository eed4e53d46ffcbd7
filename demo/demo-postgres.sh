#!/usr/bin/env bash
# make demo-postgres: make demo with PostgreSQL as the source. A Temporal dev
# server with its Web UI, a PostgreSQL 18 bed (bin/pgbed: 3 shards of a
# primary and 2 standbys, a workload on every primary), a worker with the
# bed's DSNs in its environment, and a live stream "pg-orders" into
# .data/pg-out. Idempotent: whatever already runs (by recorded process ID) is
# left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
. demo/lib.sh

start_temporal

# initdb, copies and start-up of 9 servers take a while on 2 cores.
start_bed pgbed "the PostgreSQL bed" --dir "$DATA/pg" --rate 5 --env "$DATA/pg.env" \
  --config "$DATA/pg-orders.json" --out "$DATA/pg-out"

# A new bed has new ports and no replication slots: the worker's DSNs and
# the stream the Temporal server remembers belong to the old one. A new
# stream makes its slots now, so it starts with an empty sink.
if [ "$fresh_bed" = yes ] && running worker; then
  echo "the PostgreSQL bed is new: restarting the worker with its DSNs"
  stop_proc worker
fi
bed_stream pg-orders "$DATA/pg-out" "the PostgreSQL bed was restarted"
start_worker
start_stream pg-orders "$DATA/pg-orders.json"

cat <<MSG

tabletflow PostgreSQL demo is up.
  Web UI:  http://127.0.0.1:8233/namespaces/default/workflows?query=TabletflowStream%3D%22pg-orders%22
  stream:  pg-orders (sink: .data/pg-out/<shard>.jsonl; config: .data/pg-orders.json)
  source:  shards s1, s2, s3; replicas zone1-sNp (primary), zone2-sNa and zone3-sNb
           (standbys); servers and logs listed in .data/pgbed.log

Watch:
  bin/starter status pg-orders --watch
  bin/temporal workflow query --workflow-id pg-orders --type status
  tail -f .data/pg-out/s1.jsonl
Exclude the zone2 standbys (tablets reading there move to zone3), then lift it:
  bin/temporal workflow signal --workflow-id pg-orders --name exclude \\
      --input '{"aliases": ["zone2-s1a", "zone2-s2a", "zone2-s3a"], "reason": "maintenance", "ttl": "10m"}'
  bin/temporal workflow signal --workflow-id pg-orders --name include \\
      --input '{"aliases": ["zone2-s1a", "zone2-s2a", "zone2-s3a"]}'
Pause and resume a shard:
  bin/temporal workflow signal --workflow-id pg-orders --name pause --input '{"tablets": ["s1"]}'
  bin/temporal workflow signal --workflow-id pg-orders --name resume --input '{"tablets": ["s1"]}'
Lose shard s1's history (its slots dropped: s1 goes Expired), then resync it
(new slots and a copy of its rows between resync-begin and resync-end lines):
  bin/pgbed drop-slots --stream pg-orders --shard s1
  bin/starter status pg-orders                      # s1 Expired within seconds
  bin/starter resync pg-orders --tablets s1 --reason "slots dropped"
  grep -c '"op":"read"' .data/pg-out/s1.jsonl
Copy a table again on every shard while the stream goes on (an ad-hoc
snapshot: read lines woven into the changes), watch it finish, or cancel it:
  bin/starter snapshot pg-orders --tables public.items --reason "backfill"
  bin/starter status pg-orders                      # snapshot snapshot-1 ...: Running, then Done
  bin/starter snapshot-cancel pg-orders
Stop reading a table, then read it again (published on every shard, its rows
backfilled by a snapshot):
  bin/starter configure pg-orders --tables public.orders --reason "items not needed"
  bin/starter configure pg-orders --tables public.orders,public.items --reason "items back"
  bin/starter status pg-orders                      # tables tables-2: Done ...; backfilled by snapshot-N
Take a standby down (it stays down until the bed restarts):
  kill -INT \$(head -1 .data/pg/s2-standby1/data/postmaster.pid)     # zone2-s2a
Stop the stream (dropping its replication slots), then everything:
  bin/temporal workflow signal --workflow-id pg-orders --name stop --input '{"dropSourceStream": true}'
  make stop
MSG
