#!/usr/bin/env bash
# Runs the example end to end on loopback: fake-gcs-server + pubsub-emulator + wfemu.py,
# one execution created over REST and polled to completion; prints the result and the
# Pub/Sub message. Needs: .tools/bin/{fake-gcs-server,pubsub-emulator}, a venv with
# tools/workflows-emulator/requirements.txt (WFEMU_PY, default .venv-wfemu/bin/python), and
# @google-cloud/pubsub resolvable by the hooks (NODE_PATH=<dir>/node_modules).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../../.." && pwd)
PY=${WFEMU_PY:-$ROOT/.venv-wfemu/bin/python}
GCS_PORT=${GCS_PORT:-14443} PS_PORT=${PS_PORT:-18085} WF_PORT=${WF_PORT:-18787}
TMP=$(mktemp -d); PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT
wait_http() { for _ in $(seq 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done; echo "not ready: $1" >&2; return 1; }

mkdir -p "$TMP/gcs/ckpt-bucket/run1/checkpoints/1200"
echo '{"groups":[{"id":"g0","shards":4},{"id":"g1","shards":2},{"id":"g2","shards":8},{"id":"g3","shards":1},{"id":"g4","shards":3}]}' \
  > "$TMP/gcs/ckpt-bucket/run1/checkpoints/1200/convert_manifest.json"
"$ROOT/.tools/bin/fake-gcs-server" -scheme http -host 127.0.0.1 -port "$GCS_PORT" -backend memory -data "$TMP/gcs" >"$TMP/gcs.log" 2>&1 & PIDS+=($!)
"$ROOT/.tools/bin/pubsub-emulator" -host 127.0.0.1 -port "$PS_PORT" >"$TMP/ps.log" 2>&1 & PIDS+=($!)
export STORAGE_EMULATOR_HOST=http://127.0.0.1:$GCS_PORT PUBSUB_EMULATOR_HOST=127.0.0.1:$PS_PORT
export RUN_JOB_LOG=$TMP/runjob.log FLAKY_GROUPS=g1 FAIL_GROUPS=g3 RUN_JOB_SLEEP_MS=300
"$PY" "$HERE/../wfemu.py" --host 127.0.0.1 --port "$WF_PORT" --workflows-dir "$HERE/workflows" \
  --connector-hooks "$HERE/hooks.yaml" --project test-project --location us-central1 \
  --env EVENTS_TOPIC=orbax2reg-events --backoff-scale 0 >"$TMP/wf.log" 2>&1 & PIDS+=($!)
wait_http "http://127.0.0.1:$GCS_PORT/storage/v1/b"; wait_http "http://127.0.0.1:$WF_PORT/healthz"
grep -q listening "$TMP/ps.log" || sleep 1

node -e "
const {PubSub}=require('@google-cloud/pubsub'); const ps=new PubSub({projectId:'test-project'});
ps.createTopic('orbax2reg-events').then(([t])=>t.createSubscription('events-sub')).then(()=>ps.close());"

API=http://127.0.0.1:$WF_PORT/v1/projects/test-project/locations/us-central1/workflows/ckpt-convert-example/executions
NAME=$(curl -sf -X POST "$API" -H 'Content-Type: application/json' \
  -d '{"argument":"{\"bucket\":\"ckpt-bucket\",\"prefix\":\"run1/checkpoints/1200\"}","labels":{"ckpt_step":"1200"}}' \
  | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).name))')
echo "created $NAME"
for _ in $(seq 600); do
  EXE=$(curl -sf "http://127.0.0.1:$WF_PORT/v1/$NAME")
  STATE=$(node -e 'console.log(JSON.parse(process.argv[1]).state)' "$EXE")
  [ "$STATE" != ACTIVE ] && break; sleep 0.2
done
echo "$EXE"
node -e "
const {PubSub}=require('@google-cloud/pubsub'); const ps=new PubSub({projectId:'test-project'});
const sub=ps.subscription('events-sub');
sub.on('message', m=>{console.log('pubsub message', JSON.stringify(m.attributes), m.data.toString().replace(/\s+/g,' ')); m.ack(); sub.close().then(()=>ps.close());});"
echo "run-job hook log:"; cat "$RUN_JOB_LOG"
[ "$STATE" = SUCCEEDED ]
