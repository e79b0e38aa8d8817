#!/bin/sh
# objects.get against fake-gcs-server at $STORAGE_EMULATOR_HOST (e.g. http://127.0.0.1:4443).
# The workflow already URL-encodes the object name, as the real connector requires.
set -eu
req=$(cat)
bucket=$(printf '%s' "$req" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).args.bucket))')
object=$(printf '%s' "$req" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).args.object))')
alt=$(printf '%s' "$req" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).args.alt||"json"))')
code=$(curl -s -o /tmp/wfemu-gcs-get.$$ -w '%{http_code}' "$STORAGE_EMULATOR_HOST/storage/v1/b/$bucket/o/$object?alt=$alt")
body=$(cat /tmp/wfemu-gcs-get.$$); rm -f /tmp/wfemu-gcs-get.$$
if [ "$code" != 200 ]; then
  printf '{"message":"HTTP server responded with error code %s","code":%s,"tags":["HttpError"],"body":%s}\n' "$code" "$code" "$(printf '%s' "$body" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.stringify(s)))')"
  exit 1
fi
# alt=media: hand back the object bytes as a JSON string (the workflow json.decode()s it)
if [ "$alt" = media ]; then printf '%s' "$body" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.stringify(s)))'; else printf '%s' "$body"; fi
