"""googleapis.* connector calls (Cloud Run jobs, Pub/Sub, Storage, ...), each run by a local executable named
in --connector-hooks: the call's args as JSON on stdin, its result as JSON on stdout, a non-zero exit raises.
Their connector_params are checked as Google documents them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import yaml

from workflows_emulator import utils as wfu

from .limits import _count_steps
from .runtime import _CANCEL, _EXEC_ENV, ExecutionCancelled, _check_cancelled
from .values import _plain, _raise

_HOOKS: dict[str, dict] = {}
_HOOKS_DIR = os.getcwd()


def load_hooks(path: str) -> None:
    global _HOOKS_DIR
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    _HOOKS_DIR = os.path.dirname(os.path.abspath(path))
    for name, spec in (doc.get("hooks") or {}).items():
        if isinstance(spec, (str, list)):
            spec = {"command": spec}
        cmd = spec["command"]
        spec["command"] = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        spec.setdefault("timeout", 600)
        _HOOKS[name] = spec



_CONNECTOR_PARAMS = {"timeout", "polling_policy", "skip_polling", "scopes"}
_POLLING_POLICY = {"initial_delay", "multiplier", "max_delay"}


def _check_connector_params(name, params):
    """connector_params as Google documents them (https://cloud.google.com/workflows/docs/reference/googleapis,
    "Invoke a connector call"): timeout in seconds (at most one year), polling_policy {initial_delay,
    multiplier, max_delay}, skip_polling (boolean), scopes. Anything else is a mistake Google would not ignore
    silently either, so it fails here."""
    if params is None:
        return
    if not isinstance(params, dict) or set(params) - _CONNECTOR_PARAMS:
        _raise(f"{name}: unknown connector_params {sorted(set(params) - _CONNECTOR_PARAMS) if isinstance(params, dict) else params}",
               ["ValueError"])
    timeout = params.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 31536000):
        _raise(f"{name}: connector_params.timeout must be a number of seconds in (0, 31536000], got {timeout!r}", ["ValueError"])
    policy = params.get("polling_policy")
    if policy is not None and (not isinstance(policy, dict) or set(policy) - _POLLING_POLICY):
        _raise(f"{name}: connector_params.polling_policy takes only {sorted(_POLLING_POLICY)}, got {policy!r}", ["ValueError"])
    if "skip_polling" in params and not isinstance(params["skip_polling"], bool):
        _raise(f"{name}: connector_params.skip_polling must be a boolean", ["TypeError"])


def _polls(seconds, policy):
    """Polling attempts a waiting connector makes on an operation that took `seconds`: by default the first
    after 1 s, then 1.25 times longer each, at most 60 s apart (https://cloud.google.com/workflows/docs/connectors,
    "Long-running operations": each one is a billable step); at least one."""
    delay, multiplier = float(policy.get("initial_delay", 1)), float(policy.get("multiplier", 1.25))
    max_delay = float(policy.get("max_delay", 60))
    waited, polls = delay, 1
    while waited < seconds:
        delay = min(delay * multiplier, max_delay)
        waited, polls = waited + delay, polls + 1
    return polls


def run_connector(rendered_step):
    name = rendered_step["call"]
    spec = _HOOKS.get(name)
    if spec is None:
        _raise(f"wfemu: no connector hook configured for {name}", ["SystemError"])
    _check_connector_params(name, (rendered_step.get("args") or {}).get("connector_params"))
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (spec.get("env") or {}).items()})
    env.update(_EXEC_ENV.get())
    env["WFEMU_CONNECTOR"] = name
    payload = {"connector": name, "args": _plain(rendered_step.get("args", {}))}
    _check_cancelled()  # a cancelled execution starts no further hook
    started = time.monotonic()
    # The payload goes in as a file, not through communicate(): a communicate(input, timeout) that times out
    # before the input is all written (a busy machine: the pipe drains slowly, or this thread waits for the GIL)
    # and is retried without the input (it refuses it a second time) never writes the rest nor closes stdin, so
    # the hook waits for the end of its input until its own timeout (CPython's Popen._communicate registers
    # stdin only when given input).
    with tempfile.TemporaryFile() as payload_file:
        payload_file.write(json.dumps(payload).encode())
        payload_file.seek(0)
        proc = subprocess.Popen(spec["command"], stdin=payload_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=spec.get("cwd", _HOOKS_DIR), env=env)
    deadline = time.monotonic() + spec["timeout"]
    event = _CANCEL.get()
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            # Only the hook is stopped: what it started on "Cloud Run" runs on, as a job execution outlives a
            # cancelled workflow.
            if event is not None and event.is_set():
                proc.kill()
                proc.communicate()
                raise ExecutionCancelled()
            if time.monotonic() >= deadline:
                proc.kill()
                proc.communicate()
                _raise(f"{name}: hook timed out after {spec['timeout']}s", ["TimeoutError"])
    if stderr:
        sys.stderr.write(stderr)
    connector_params = (rendered_step.get("args") or {}).get("connector_params") or {}
    if spec.get("waits") and connector_params.get("skip_polling") is not True:
        _count_steps(_polls(time.monotonic() - started, connector_params.get("polling_policy") or {}))
    out = stdout.strip()
    if proc.returncode == 0:
        if not out:
            return None
        try:
            return json.loads(out)
        except ValueError:
            _raise(f"{name}: hook stdout is not JSON: {out[:200]}", ["ResponseTypeError"])
    # failure: stdout may hold {"message", "code", "tags", ...}
    err = None
    try:
        err = json.loads(out) if out else None
    except ValueError:
        pass
    if not isinstance(err, dict):
        err = {"message": f"{name}: hook exited {proc.returncode}: {(out or stderr)[-500:]}",
               "tags": ["SystemError"]}
    err.setdefault("message", f"{name} failed")
    err.setdefault("tags", ["SystemError"])
    raise wfu.RuntimeError(**err)
