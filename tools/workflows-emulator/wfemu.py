#!/usr/bin/env python3
"""Local Cloud Workflows emulator for end-to-end tests.

Runs workflow YAML with the PyPI interpreter `workflows-emulator` (pinned in
requirements.txt) and adds what that package lacks for this project:

* an Executions REST API shaped like workflowexecutions v1 (create returns an ACTIVE
  execution at once; the workflow runs in a background thread; poll GET until
  SUCCEEDED / FAILED) so `@google-cloud/workflows` ExecutionsClient can talk to it
  with REST fallback; as Google's, list gives the BASIC view unless `view=FULL` (get: FULL
  unless `view=BASIC`), pages of `pageSize` (default 100, at most 1000 BASIC / 100 FULL) with
  `nextPageToken`, newest `createTime` first, `orderBy` and `filter` on labels, state and times;
* `--max-active N`: a concurrent executions quota; executions beyond it wait QUEUED, without a
  startTime, in a backlog and begin in creation order as slots free;
* `--connector-hooks hooks.yaml`: every `call: googleapis.*` step is run by a local
  executable (args as JSON on stdin, result as JSON on stdout, non-zero exit raises);
* `parallel` with a real `concurrency_limit`, per-branch variable scopes and `shared`
  variables merged back by key/index;
* `retry` backoff that honours initial_delay/max_delay/multiplier, scaled by
  --backoff-scale (0 in tests = no sleeping);
* per-execution GOOGLE_CLOUD_* built-in variables and `--env KEY=VALUE` user variables
  for `sys.get_env`;
* `:cancel` that stops the execution: its thread stops at the next step, connector call (the running hook
  is killed) or sys.sleep, beyond the reach of try/except, and starts no further hook;
* a strict standard library: only the functions and argument types Google documents (int(5)
  raises TypeError, as in the cloud), documented connector_params only; sys.sleep is scaled by
  --backoff-scale like retry delays, and with --fast-clock sys.now() runs on by what was skipped;
* Google's step limit: every step counts (each retry attempt, each polling attempt of a connector that
  waits for an operation, hooks marked `waits: true`), and the execution fails with a ResourceLimitError no
  except catches past --step-limit (100,000), or when one frame's variables pass 512 KB;
  GET /_emulator/steps?execution=NAME shows the count and the most memory the variables took.

Usage:
  wfemu.py --host 127.0.0.1 --port 8787 --workflows-dir DIR --project P --location L \
           [--connector-hooks hooks.yaml] [--env KEY=VALUE ...] [--backoff-scale 0] [--fast-clock]
Prints "workflows-emulator listening on http://HOST:PORT" when ready. Exits 1 with one line on stderr when the
installed workflows-emulator is not the pinned version, or an internal it patches has changed (wfemu_lib/pinned.py).

The code is in wfemu_lib/ beside this file, a module per concern (wfemu_lib/__init__.py lists them); its tests
are in tests/ (python -m unittest discover -s tools/workflows-emulator/tests).
"""
import os
import sys

# wfemu_lib sits beside this file (on sys.path when run as a script; also when imported from elsewhere).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from wfemu_lib import patches, server  # noqa: E402  (checks the package first: wfemu_lib/pinned.py)
except ImportError as err:
    if type(err).__name__ != "Mismatch":
        raise
    sys.exit(f"wfemu: {err}")
patches.install()

if __name__ == "__main__":
    server.main()
