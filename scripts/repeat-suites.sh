#!/usr/bin/env bash
# Runs the e2e suite and the fault suite (test/e2e, test/faults) at the same time, ROUNDS times in a row, and
# prints one line per suite and round: the record that says whether they ever flake on a loaded machine (two
# suites at once on 2 cores is one). Each round's output is kept in OUT/rN-<suite>.log; a failed round's scratch
# directories (pipeline logs, emulator state) are kept in OUT/scratch-rN, a passing round's are removed.
#
#   bash scripts/repeat-suites.sh [ROUNDS=10] [OUT=.cache/repeat-suites]
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
out=${2:-.cache/repeat-suites}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
for i in $(seq 1 "$rounds"); do
  start=$(date +%s)
  # Their own temporary directory, so that nothing else's is removed with theirs; scratch kept for the logs, and
  # each run's temporary folder under it (a run removes its own when it ends otherwise): removed below if it passed.
  export TMPDIR="$tmp" ORBAX2REG_KEEP_SCRATCH=1 ORBAX2REG_KEEP_TMP=1
  npx vitest run test/e2e > "$out/r$i-e2e.log" 2>&1 & e2e=$!
  npx vitest run test/faults > "$out/r$i-faults.log" 2>&1 & faults=$!
  wait $e2e; e2e_rc=$?
  wait $faults; faults_rc=$?
  for suite in e2e faults; do
    printf 'round %s %s: %s\n' "$i" "$suite" "$(grep -E '^ +Tests ' "$out/r$i-$suite.log" | tail -n1 | sed 's/\x1b\[[0-9;]*m//g; s/^ *//')"
  done | tee -a "$out/summary.txt"
  printf 'round %s: exit e2e %s, faults %s; %s s; load average %s\n' "$i" $e2e_rc $faults_rc $(($(date +%s) - start)) \
    "$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/summary.txt"
  if [ $e2e_rc -eq 0 ] && [ $faults_rc -eq 0 ]; then
    rm -rf "${tmp:?}"/*
  else
    failed=$((failed + 1))
    mkdir -p "$out/scratch-r$i" && mv "$tmp"/* "$out/scratch-r$i/" 2>/dev/null
  fi
done
echo "$rounds rounds, $failed with a failure" | tee -a "$out/summary.txt"
[ $failed -eq 0 ]
