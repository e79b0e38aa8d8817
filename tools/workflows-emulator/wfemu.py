#!/usr/bin/env python3
"""Local Cloud Workflows emulator for end-to-end tests.

Runs workflow YAML with the PyPI interpreter `workflows-emulator` (pinned in
requirements.txt) and adds what that package lacks for this project:

* an Executions REST API shaped like workflowexecutions v1 (create returns an ACTIVE
  execution at once; the workflow runs in a background thread; poll GET until
  SUCCEEDED / FAILED) so `@google-cloud/workflows` ExecutionsClient can talk to it
  with REST fallback;
* `--connector-hooks hooks.yaml`: every `call: googleapis.*` step is run by a local
  executable (args as JSON on stdin, result as JSON on stdout, non-zero exit raises);
* `parallel` with a real `concurrency_limit`, per-branch variable scopes and `shared`
  variables merged back by key/index;
* `retry` backoff that honours initial_delay/max_delay/multiplier, scaled by
  --backoff-scale (0 in tests = no sleeping);
* per-execution GOOGLE_CLOUD_* built-in variables and `--env KEY=VALUE` user variables
  for `sys.get_env`.

Usage:
  wfemu.py --host 127.0.0.1 --port 8787 --workflows-dir DIR --project P --location L \
           [--connector-hooks hooks.yaml] [--env KEY=VALUE ...] [--backoff-scale 0]
Prints "workflows-emulator listening on http://HOST:PORT" when ready.
"""
from __future__ import annotations

import argparse
import contextvars
import copy
import datetime as dt
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from workflows_emulator import main as wf
from workflows_emulator import utils as wfu
from workflows_emulator import render as wf_render
from workflows_emulator.lib import sys_utils, text_utils
from workflows_emulator.render import render_config

log = logging.getLogger("wfemu")

# ---------------------------------------------------------------- per-execution env
_EXEC_ENV: contextvars.ContextVar[dict] = contextvars.ContextVar("wfemu_exec_env", default={})
_USER_ENV: dict[str, str] = {}


def _get_env(name, default=None):
    env = _EXEC_ENV.get()
    if name in env:
        return env[name]
    if name in _USER_ENV:
        return _USER_ENV[name]
    return default


sys_utils.get_env = _get_env

# ---------------------------------------------------------------- stdlib gaps / fixes
import urllib.parse as _up  # noqa: E402

text_utils.url_encode = lambda source: _up.quote(source, safe="-_.~")
text_utils.url_encode_plus = lambda source: _up.quote_plus(source, safe="-_.~")
text_utils.url_decode = lambda source: _up.unquote_plus(source)
# GCW default(a, b) returns b only when a is null; the package used `a or b` (wrong for 0, "", false).
wf_render.STANDARD_LIBRARY["default"] = lambda value, fallback: fallback if value is None else value
# GCW's json.encode / encode_to_string do not indent unless asked; the package indented by default.
from workflows_emulator.lib import json_utils as _json_utils  # noqa: E402

_json_encode = _json_utils.encode
_json_utils.encode = lambda data, indent=False: _json_encode(data, indent)
_json_utils.encode_to_string = lambda data, indent=False: _json_encode(data, indent).decode()


def _get_type(value):
    """get_type that also names the package's dict/list subclasses (variables are stored as those)."""
    for py, name in ((bool, "bool"), (bytes, "bytes"), (float, "double"), (int, "int"), (str, "string"),
                     (dict, "map"), (list, "list")):
        if isinstance(value, py):
            return name
    if value is None:
        return "null"
    raise ValueError(f"unknown type {type(value)}")


wf_render.STANDARD_LIBRARY["get_type"] = _get_type
# The package's maps list Python context variables among their keys(); keys() must be the map's own.
wf_render.STANDARD_LIBRARY["keys"] = lambda collection: list(dict.keys(collection))
# Workflows literals are JSON's; expressions run as Python, so name them.
wf_render.STANDARD_LIBRARY.update({"null": None, "true": True, "false": False})


def _expressions(value: str):
    """(start, end, code) of each ${...}, braces balanced and string literals respected (the package's
    regex stopped at the first '}', so map literals and "}" in strings broke)."""
    i = 0
    while (i := value.find("${", i)) >= 0:
        depth, j, quote = 1, i + 2, None
        while j < len(value) and depth:
            c = value[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            j += 1
        if depth:
            raise SyntaxError(f"unterminated expression in {value!r}")
        yield i, j, value[i + 2:j - 1]
        i = j


def _render_str(value, context):
    """GCW semantics: a value that is one whole expression keeps the expression's type (null stays null;
    the package turned it into the string "None" by re-parsing str() as YAML)."""
    if not isinstance(value, str) or "${" not in value:
        return value
    parts = list(_expressions(value))
    if len(parts) == 1 and parts[0][0] == 0 and parts[0][1] == len(value):
        return wf_render.run_code(parts[0][2], context)
    out, last = [], 0
    for start, end, code in parts:
        v = wf_render.run_code(code, context)
        out.append(value[last:start])
        out.append(json.dumps(v) if isinstance(v, (list, dict)) or v is None or isinstance(v, bool) else str(v))
        last = end
    out.append(value[last:])
    return "".join(out)


wf_render.render_str = _render_str


def _allow_expression(node, key):
    """The package's schema types concurrency_limit as integer only; GCW also takes an expression."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key and isinstance(v, dict) and v.get("type") == "integer":
                v["type"] = ["integer", "string"]
            else:
                _allow_expression(v, key)
    elif isinstance(node, list):
        for v in node:
            _allow_expression(v, key)


_allow_expression(wf.WORKFLOW_SCHEMA, "concurrency_limit")

# ---------------------------------------------------------------- connector hooks
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


def _raise(message: str, tags: list[str], **extra):
    raise wfu.RuntimeError(message=message, tags=tags, **extra)


def _plain(value):
    """ContextDict/addict -> plain JSON-able data."""
    return json.loads(json.dumps(value, default=lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o)))


def run_connector(rendered_step):
    name = rendered_step["call"]
    spec = _HOOKS.get(name)
    if spec is None:
        _raise(f"wfemu: no connector hook configured for {name}", ["SystemError"])
    env = dict(os.environ)
    env.update({k: str(v) for k, v in (spec.get("env") or {}).items()})
    env.update(_EXEC_ENV.get())
    env["WFEMU_CONNECTOR"] = name
    payload = {"connector": name, "args": _plain(rendered_step.get("args", {}))}
    try:
        proc = subprocess.run(spec["command"], input=json.dumps(payload), capture_output=True, text=True,
                              cwd=spec.get("cwd", _HOOKS_DIR), env=env, timeout=spec["timeout"])
    except subprocess.TimeoutExpired:
        _raise(f"{name}: hook timed out after {spec['timeout']}s", ["TimeoutError"])
    if proc.stderr:
        sys.stderr.write(proc.stderr)
    out = proc.stdout.strip()
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
        err = {"message": f"{name}: hook exited {proc.returncode}: {(out or proc.stderr)[-500:]}",
               "tags": ["SystemError"]}
    err.setdefault("message", f"{name} failed")
    err.setdefault("tags", ["SystemError"])
    raise wfu.RuntimeError(**err)


wf.StepCall.execute_connector = staticmethod(run_connector)

# ---------------------------------------------------------------- retry with real backoff
BACKOFF_SCALE = 1.0


def _retry_execute(self):
    step, context = self.config, self.context
    cfg = render_config(step["retry"], context)
    backoff = cfg.get("backoff") or {}
    delay = float(backoff.get("initial_delay", 1))
    max_delay = float(backoff.get("max_delay", 60))
    mult = float(backoff.get("multiplier", 1.25))
    predicate = cfg.get("predicate")
    max_retries = int(cfg.get("max_retries", 0))
    last = None
    for attempt in range(max_retries + 1):
        try:
            return wf.execute_step(self.step_id, step["try"], context)
        except wfu.WorkflowError as err:
            last = err
            if attempt == max_retries:
                break
            if predicate is not None:
                ok = wf.execute_subworkflow(workflow=copy.deepcopy(predicate), params={"e": err.payload},
                                            context=wf.keep_only_subworkflows(context))
                if not ok:
                    break
            time.sleep(min(delay, max_delay) * BACKOFF_SCALE)
            delay *= mult
    if "except" in step:
        context[step["except"]["as"]] = last.payload.to_dict() if hasattr(last.payload, "to_dict") else last.payload
        return wf.execute_steps_list(step["except"]["steps"], context)
    raise last


wf.StepRetry.execute = _retry_execute

# ---------------------------------------------------------------- parallel: limit, scopes, shared
_MERGE_LOCK = threading.Lock()


def _merge_shared(parent, before, after):
    """Apply a branch's changes of one shared variable onto the parent's current value."""
    if isinstance(before, dict) and isinstance(after, dict) and isinstance(parent, dict):
        for k, v in after.items():
            if k not in before or before[k] != v:
                parent[k] = v
        return parent
    if isinstance(before, list) and isinstance(after, list) and isinstance(parent, list) and len(before) == len(after) == len(parent):
        for i, v in enumerate(after):
            if before[i] != v:
                parent[i] = v
        return parent
    return after


def _execute_task_config(self, task_configs, concurrency_limit=None, index_var="__index", value_var="__value"):
    shared = list(dict.fromkeys(self.config["parallel"].get("shared", [])))
    snapshot = copy.deepcopy(self.context)
    if isinstance(concurrency_limit, str):  # GCW accepts an expression here
        concurrency_limit = render_config(concurrency_limit, self.context)
    limit = int(concurrency_limit) if concurrency_limit else 20

    def run_branch(index, task):
        ctx = copy.deepcopy(snapshot)
        if "for" in self.config["parallel"]:
            ctx[value_var] = task["id"]
            ctx[index_var] = index
        wf.execute_step(str(task["id"]), task["config"], ctx)
        with _MERGE_LOCK:
            for var in shared:
                if var in ctx and var in self.context:
                    self.context[var] = _merge_shared(self.context[var], snapshot.get(var), ctx[var])

    errors = {}
    with ThreadPoolExecutor(max_workers=limit) as pool:
        futures = [(t["id"], pool.submit(contextvars.copy_context().run, run_branch, i, t))
                   for i, t in enumerate(task_configs)]
        for task_id, fut in futures:
            exc = fut.exception()
            if isinstance(exc, wfu.WorkflowError):
                exc.__context__ = RuntimeError("branch error")
                errors[task_id] = exc
            elif exc is not None:
                raise exc
    self.check_raise_results(errors)
    return self.context


wf.StepParallel.execute_task_config = _execute_task_config

# ---------------------------------------------------------------- executions store + REST API
PROJECT = "test-project"
LOCATION = "us-central1"
WORKFLOWS_DIR = "."
_EXECUTIONS: dict[str, dict] = {}
_LOCK = threading.Lock()


def _now():
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _workflow_file(wid: str):
    for ext in (".yaml", ".yml", ".json"):
        p = os.path.join(WORKFLOWS_DIR, wid + ext)
        if os.path.isfile(p):
            return p
    return None


def _error_payload(err: BaseException) -> dict:
    payload = getattr(err, "payload", None)
    if payload is None:
        return {"message": f"{err.__class__.__name__}: {err}", "tags": [err.__class__.__name__]}
    if hasattr(payload, "to_dict"):
        payload = payload.to_dict()
    if isinstance(payload, str):
        payload = {"message": payload, "tags": [err.__class__.__name__]}
    return _plain(payload)


def _run(execution: dict, config: dict, params: dict, env: dict):
    _EXEC_ENV.set(env)
    t0 = time.time()
    try:
        result = wf.execute_workflow(config, params)
        update = {"state": "SUCCEEDED", "result": json.dumps(_plain(result))}
    except BaseException as err:  # noqa: BLE001 - every failure becomes a FAILED execution
        log.warning("execution %s failed: %s", execution["name"], err)
        update = {"state": "FAILED",
                  "error": {"payload": json.dumps(_error_payload(err)), "context": f"{err.__class__.__name__}: {err}"}}
    with _LOCK:
        execution.update(update)
        execution["endTime"] = _now()
        execution["duration"] = f"{time.time() - t0:.6f}s"


def create_execution(project, location, wid, body):
    path = _workflow_file(wid)
    if path is None:
        return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": f"workflow {wid} not found"}}
    try:
        config = wf.load_workflow(path)
    except Exception as err:  # noqa: BLE001
        return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": f"invalid workflow {wid}: {err}"}}
    argument = body.get("argument") or "null"
    try:
        arg_value = json.loads(argument)
    except ValueError:
        return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "argument is not valid JSON"}}
    main_params = (config.get("main") or {}).get("params", []) if isinstance(config, dict) else []
    params = {}
    if main_params:
        p0 = main_params[0]
        params = {(list(p0.keys())[0] if isinstance(p0, dict) else p0): arg_value}
    exec_id = str(uuid.uuid4())
    revision = "000001-" + hashlib.sha256(open(path, "rb").read()).hexdigest()[:3]
    name = f"projects/{project}/locations/{location}/workflows/{wid}/executions/{exec_id}"
    execution = {"name": name, "startTime": _now(), "state": "ACTIVE", "argument": argument,
                 "workflowRevisionId": revision, "callLogLevel": body.get("callLogLevel", "CALL_LOG_LEVEL_UNSPECIFIED"),
                 "labels": body.get("labels") or {}, "status": {}}
    env = {"GOOGLE_CLOUD_PROJECT_ID": project, "GOOGLE_CLOUD_LOCATION": location,
           "GOOGLE_CLOUD_WORKFLOW_ID": wid, "GOOGLE_CLOUD_WORKFLOW_REVISION_ID": revision,
           "GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID": exec_id}
    with _LOCK:
        _EXECUTIONS[name] = execution
        snapshot = copy.deepcopy(execution)
    threading.Thread(target=contextvars.Context().run, args=(_run, execution, config, params, env), daemon=True).start()
    return 200, snapshot


_RE_EXECS = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/workflows/([^/]+)/executions$")
_RE_EXEC = re.compile(r"^/v1/(projects/[^/]+/locations/[^/]+/workflows/[^/]+/executions/[^/:]+)(:cancel)?$")
_RE_WF = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/workflows/([^/]+)$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quieter access log
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        return json.loads(raw) if raw else {}

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path in ("/", "/healthz"):
            return self._send(200, {"status": "ok"})
        m = _RE_EXEC.match(path)
        if m and not m.group(2):
            with _LOCK:
                ex = copy.deepcopy(_EXECUTIONS.get(m.group(1)))
            return self._send(200, ex) if ex else self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "execution not found"}})
        m = _RE_EXECS.match(path)
        if m:
            prefix = f"projects/{m.group(1)}/locations/{m.group(2)}/workflows/{m.group(3)}/executions/"
            with _LOCK:
                items = [copy.deepcopy(e) for n, e in _EXECUTIONS.items() if n.startswith(prefix)]
            items.sort(key=lambda e: e["startTime"], reverse=True)
            return self._send(200, {"executions": items})
        m = _RE_WF.match(path)
        if m and _workflow_file(m.group(3)):
            return self._send(200, {"name": f"projects/{m.group(1)}/locations/{m.group(2)}/workflows/{m.group(3)}", "state": "ACTIVE"})
        return self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": path}})

    def do_POST(self):
        path = self.path.split("?", 1)[0]
        try:
            body = self._body()
        except ValueError:
            return self._send(400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "body is not JSON"}})
        m = _RE_EXECS.match(path)
        if m:
            return self._send(*create_execution(m.group(1), m.group(2), m.group(3), body))
        m = _RE_EXEC.match(path)
        if m and m.group(2):  # best effort: the worker thread keeps running, the state says CANCELLED
            with _LOCK:
                ex = _EXECUTIONS.get(m.group(1))
                if ex and ex["state"] == "ACTIVE":
                    ex.update(state="CANCELLED", endTime=_now())
                out = copy.deepcopy(ex)
            return self._send(200, out) if out else self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "execution not found"}})
        return self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": path}})


def main():
    global PROJECT, LOCATION, WORKFLOWS_DIR, BACKOFF_SCALE
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8787)
    ap.add_argument("--workflows-dir", required=True, help="DIR/<id>.yaml is workflow <id>; re-read on every execution")
    ap.add_argument("--project", default=PROJECT)
    ap.add_argument("--location", default=LOCATION)
    ap.add_argument("--connector-hooks", help="YAML: hooks: {<googleapis.connector.name>: {command: [...], timeout: s, env: {}}}")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="user env var for sys.get_env")
    ap.add_argument("--backoff-scale", type=float, default=1.0, help="multiply every retry delay (0 = no sleep)")
    ap.add_argument("--log-level", default="WARNING")
    a = ap.parse_args()
    logging.basicConfig(level=a.log_level, format="[wfemu %(asctime)s] %(name)s %(levelname)s %(message)s")
    PROJECT, LOCATION, WORKFLOWS_DIR, BACKOFF_SCALE = a.project, a.location, os.path.abspath(a.workflows_dir), a.backoff_scale
    for kv in a.env:
        k, _, v = kv.partition("=")
        _USER_ENV[k] = v
    if a.connector_hooks:
        load_hooks(a.connector_hooks)
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    import signal
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    print(f"workflows-emulator listening on http://{a.host}:{srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    srv.server_close()


if __name__ == "__main__":
    main()
