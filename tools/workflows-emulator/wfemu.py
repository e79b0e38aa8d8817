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

# ---------------------------------------------------------------- cancellation
_CANCEL: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("wfemu_cancel", default=None)


class ExecutionCancelled(BaseException):
    """Stops a cancelled execution's thread (and its parallel branches) at the next step boundary, connector
    call or sleep. A BaseException on purpose: the workflow's try/except and retry catch only WorkflowError,
    and the package maps only Exception subclasses to workflow errors, so no step can catch it, as a
    cancelled execution never runs on in Google either
    (https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions/cancel)."""


def _check_cancelled():
    event = _CANCEL.get()
    if event is not None and event.is_set():
        raise ExecutionCancelled()


def _wait(seconds):
    """time.sleep that ends at once, raising ExecutionCancelled, when the execution is cancelled."""
    event = _CANCEL.get()
    if event is None:
        time.sleep(seconds)
    elif event.wait(seconds):
        raise ExecutionCancelled()


# ---------------------------------------------------------------- the execution's clock
# sys.sleep and retry delays sleep `--backoff-scale` times their length. With --fast-clock the rest of the
# delay is added to the execution's clock, so that sys.now() reads what it would have read after the whole
# delay: a polling loop then waits out a week-long deadline in seconds with every poll it would make in a week
# (and every step they cost). Jobs outside (the connector hooks) still take real time, which this clock races
# past, so tests of short real jobs against short deadlines keep the real clock (the default). Each parallel
# branch keeps its own clock from the fork on; after the parallel step the execution's clock is the latest
# branch's.
_SKIPPED: contextvars.ContextVar[float] = contextvars.ContextVar("wfemu_skipped", default=0.0)


FAST_CLOCK = False  # --fast-clock


def _delay(seconds):
    """Waits `seconds` of the execution's time: BACKOFF_SCALE of them for real, with --fast-clock the rest on its
    clock."""
    _wait(seconds * BACKOFF_SCALE)
    if FAST_CLOCK:
        _SKIPPED.set(_SKIPPED.get() + seconds * (1 - BACKOFF_SCALE))


def _clock_now():
    return time.time() + _SKIPPED.get()


# ---------------------------------------------------------------- step budget
# Google fails an execution that runs more than 100,000 steps with a ResourceLimitError that no try/except
# catches (https://cloud.google.com/workflows/quotas, "Steps per execution"). What counts as a step, per
# https://cloud.google.com/workflows/pricing: every step executed, failed or not, each retry attempt again,
# assignments, conditions, calls to subworkflows, standard-library functions and connectors, and every polling
# attempt a connector makes while it waits for a long-running operation. The emulator counts every step it
# enters, the parts a step runs as steps of their own included (a try's body, the chosen switch condition, a
# retry predicate's steps), so its count is at least Google's: a workflow that stays under the limit here
# stays under it there.
STEP_LIMIT = 100_000


MEMORY_LIMIT = 512 * 1024  # bytes of variables (https://cloud.google.com/workflows/quotas: variables, arguments, events)


class StepCounter:
    """An execution's steps, and the most memory its variables took (`max_bytes`)."""

    def __init__(self, limit: int):
        self.limit, self.steps, self.max_bytes, self._lock = limit, 0, 0, threading.Lock()

    def held(self, context):
        """Measures the variables of one frame after a step that set some (its JSON size, the subworkflow
        definitions the package keeps beside them left out), and fails the execution past MEMORY_LIMIT. One
        frame at a time: a lower bound on Google's count, which adds every frame's."""
        size = len(json.dumps({k: v for k, v in context.items() if not (isinstance(v, dict) and "steps" in v)},
                              default=lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o)).encode())
        with self._lock:
            self.max_bytes = max(self.max_bytes, size)
        if size > MEMORY_LIMIT:
            raise ResourceLimitExceeded(self.limit, f"the execution's variables exceeded {MEMORY_LIMIT} bytes ({size})")

    def add(self, n: int = 1):
        """Counts n more steps, or raises when they would take the execution past its limit (the step that
        would be one too many never runs)."""
        with self._lock:
            over = self.steps + n > self.limit
            self.steps = min(self.steps + n, self.limit)
        if over:
            raise ResourceLimitExceeded(self.limit)


class ResourceLimitExceeded(BaseException):
    """An execution past its step limit. A BaseException, like ExecutionCancelled: no try/except or retry of
    the workflow can catch it (they catch only WorkflowError), as none can in Google."""

    def __init__(self, limit: int, message: str | None = None):
        message = message or f"the execution exceeded the limit of {limit} steps"
        super().__init__(f"ResourceLimitError: {message}")
        self.payload = {"message": message, "tags": ["ResourceLimitError"]}


_STEPS: contextvars.ContextVar[StepCounter | None] = contextvars.ContextVar("wfemu_steps", default=None)


def _count_steps(n: int = 1):
    counter = _STEPS.get()
    if counter is not None:
        counter.add(n)


_pkg_execute_step = wf.execute_step


def _execute_step(step_id, config, context):
    _check_cancelled()
    _count_steps()
    out = _pkg_execute_step(step_id, config, context)
    counter = _STEPS.get()
    if counter is not None and ("assign" in config or "result" in config) and isinstance(out[0], dict):
        counter.held(out[0])
    return out


wf.execute_step = _execute_step  # every step, nested ones and parallel branches included, starts here

# ---------------------------------------------------------------- stdlib gaps / fixes
import urllib.parse as _up  # noqa: E402

# text.url_encode leaves letters, digits and .-_ alone (https://cloud.google.com/workflows/docs/reference/stdlib/text/url_encode).
text_utils.url_encode = lambda source: _up.quote(source, safe="-_.")
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

# ---------------------------------------------------------------- strict standard library
# Expressions run as Python, and the package's functions accept whatever Python does (int(5), string("x"),
# len(b"..."), text.substring with negative indexes, text.re / sys.os as "functions"). Google accepts only
# the documented names and argument types, so a workflow that works here could fail in the cloud. Every
# function below checks its arguments against Google's reference and raises TypeError (a catchable error
# tagged TypeError, as Google raises) otherwise; modules expose only documented names, and an unknown name
# fails the execution. References: https://cloud.google.com/workflows/docs/reference/stdlib/overview and
# .../stdlib/expression-helpers (conversion: int() takes a string or double, double() a string or integer,
# string() an integer, double or boolean; keys() a map; len() a list, map or string).
import types as _types  # noqa: E402

_TYPE_NAMES = {"int": "integer", "double": "double", "string": "string", "bool": "boolean", "bytes": "bytes",
               "list": "list", "map": "map", "null": "null"}


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    for py, name in ((int, "int"), (float, "double"), (str, "string"), (bytes, "bytes"), (dict, "map"), (list, "list")):
        if isinstance(value, py):
            return name
    return type(value).__name__


def _strict(name: str, fn, *allowed, optional: int = 0):
    """fn(*args) after checking each positional/keyword argument's kind against allowed[i] (a set of kinds,
    or None for any). The last `optional` parameters may be omitted."""
    params = list(fn.__code__.co_varnames[: fn.__code__.co_argcount]) if hasattr(fn, "__code__") else []

    def call(*args, **kwargs):
        values = list(args)
        for p in params[len(args):]:
            if p in kwargs:
                values.append(kwargs[p])
        if len(values) < len(allowed) - optional or len(values) > len(allowed) or len(values) != len(args) + len(kwargs):
            raise TypeError(f"{name}: expected {len(allowed) - optional}..{len(allowed)} arguments, got {len(args) + len(kwargs)}")
        for i, (v, kinds) in enumerate(zip(values, allowed)):
            if kinds is not None and _kind(v) not in kinds:
                want = " or ".join(_TYPE_NAMES[k] for k in sorted(kinds))
                raise TypeError(f"{name}: argument {i + 1} must be {want}, got {_TYPE_NAMES.get(_kind(v), _kind(v))}")
        return fn(*args, **kwargs)

    return call


_NUM, _STR = {"int", "double"}, {"string"}


def _substring(source, start, end):
    if start < 0 or end < 0:  # Python would count from the end; Google has no such meaning
        raise ValueError(f"text.substring: negative index ({start}, {end})")
    return source[start:end]


def _map_get(obj, keys):
    for key in [keys] if isinstance(keys, str) else keys:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sys.sleep: negative duration")
    _delay(seconds)  # like retry backoff: --backoff-scale 0 makes polling loops instant, on the execution's clock


def _namespace(**functions):
    return _types.SimpleNamespace(**functions)


_lib = wf_render.STANDARD_LIBRARY
_pkg_text, _pkg_json, _pkg_b64, _pkg_map, _pkg_list, _pkg_time, _pkg_sys, _pkg_math = (
    _lib["text"], _lib["json"], _lib["base64"], _lib["map"], _lib["list"], _lib["time"], _lib["sys"], _lib["math"])
_lib.update({
    # expression helpers
    "int": _strict("int", lambda value: int(value), {"string", "double"}),
    "double": _strict("double", lambda value: float(value), {"string", "int"}),
    "string": _strict("string", lambda value: ("true" if value else "false") if isinstance(value, bool) else str(value),
                      {"int", "double", "bool"}),
    "keys": _strict("keys", lambda value: list(dict.keys(value)), {"map"}),
    "len": _strict("len", lambda value: len(value), {"list", "map", "string"}),
    "text": _namespace(
        decode=_strict("text.decode", lambda data, charset="UTF-8": data.decode(charset), {"bytes"}, _STR, optional=1),
        encode=_strict("text.encode", lambda text, charset="UTF-8": text.encode(charset), _STR, _STR, optional=1),
        find_all=_strict("text.find_all", lambda source, substr: [i for i in range(len(source)) if source.startswith(substr, i)],
                         _STR, _STR),
        find_all_regex=_strict("text.find_all_regex", _pkg_text.find_all_regex, _STR, _STR),
        match_regex=_strict("text.match_regex", _pkg_text.match_regex, _STR, _STR),
        replace_all=_strict("text.replace_all", _pkg_text.replace_all, _STR, _STR, _STR),
        replace_all_regex=_strict("text.replace_all_regex", _pkg_text.replace_all_regex, _STR, _STR, _STR),
        split=_strict("text.split", _pkg_text.split, _STR, _STR),
        substring=_strict("text.substring", _substring, _STR, {"int"}, {"int"}),
        to_lower=_strict("text.to_lower", _pkg_text.to_lower, _STR),
        to_upper=_strict("text.to_upper", _pkg_text.to_upper, _STR),
        url_decode=_strict("text.url_decode", lambda source: text_utils.url_decode(source), _STR),
        url_encode=_strict("text.url_encode", lambda source: text_utils.url_encode(source), _STR),
        url_encode_plus=_strict("text.url_encode_plus", lambda source: text_utils.url_encode_plus(source), _STR),
    ),
    "json": _namespace(
        decode=_strict("json.decode", lambda data: _pkg_json.decode(data), {"bytes", "string"}),
        encode=_strict("json.encode", lambda data, indent=False: _pkg_json.encode(data, indent), None, {"bool", "map"}, optional=1),
        encode_to_string=_strict("json.encode_to_string", lambda data, indent=False: _pkg_json.encode_to_string(data, indent),
                                 None, {"bool", "map"}, optional=1),
    ),
    "base64": _namespace(
        decode=_strict("base64.decode", lambda data, padding=True: _pkg_b64.decode(data, padding), _STR, {"bool"}, optional=1),
        encode=_strict("base64.encode", lambda data, padding=True: _pkg_b64.encode(data, padding), {"bytes"}, {"bool"}, optional=1),
    ),
    "map": _namespace(
        # map.get of a non-map, or of a missing key at any depth, is null (map.get reference); only the keys are typed.
        get=_strict("map.get", _map_get, None, {"string", "list"}),
        delete=_strict("map.delete", _pkg_map.delete, {"map"}, _STR),
        merge=_strict("map.merge", _pkg_map.merge, {"map"}, {"map"}),
        merge_nested=_strict("map.merge_nested", _pkg_map.merge_nested, {"map"}, {"map"}),
    ),
    "list": _namespace(
        concat=_strict("list.concat", _pkg_list.concat, {"list"}, None),
        prepend=_strict("list.prepend", _pkg_list.prepend, {"list"}, None),
    ),
    "math": _namespace(
        abs=_strict("math.abs", _pkg_math.abs, _NUM),
        floor=_strict("math.floor", lambda x: int(_pkg_math.floor(x)), _NUM),
        max=_strict("math.max", _pkg_math.max, _NUM, _NUM),
        min=_strict("math.min", _pkg_math.min, _NUM, _NUM),
    ),
    "time": _namespace(
        format=_strict("time.format", lambda seconds, timezone="UTC": _pkg_time.format(seconds, timezone), _NUM, _STR, optional=1),
        parse=_strict("time.parse", _pkg_time.parse, _STR),
    ),
    "sys": _namespace(
        get_env=_strict("sys.get_env", lambda name, default=None: sys_utils.get_env(name, default), _STR, {"string", "null"},
                        optional=1),
        log=lambda *args, **kwargs: _sys_log(*args, **kwargs),
        now=lambda: _clock_now(),
        sleep=_strict("sys.sleep", _sleep, _NUM),
        sleep_until=_strict("sys.sleep_until", _pkg_sys.sleep_until, _STR),
    ),
    "uuid": _namespace(generate=_lib["uuid"].generate),
})
for _k in ("set", "not"):  # Python helpers the package added; Google has neither
    _lib.pop(_k, None)


_JSON = json


def _sys_log(data=None, severity="DEFAULT", text=None, json=None, timeout=None):  # noqa: A002 - Google's names, in its order
    given = [v for v in (text, json, data) if v is not None]
    if len(given) != 1:
        raise TypeError("sys.log: pass exactly one of text, json, data")
    if json is not None and not isinstance(json, dict):
        raise TypeError("sys.log: json must be a map")
    if severity not in ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"):
        raise ValueError(f"sys.log: unknown severity {severity!r}")
    level = {"DEFAULT": "INFO", "NOTICE": "INFO", "ALERT": "CRITICAL", "EMERGENCY": "CRITICAL"}.get(severity, severity)
    message = given[0] if isinstance(given[0], str) else _JSON.dumps(_plain(given[0]))
    logging.getLogger("workflows").log(logging.getLevelName(level), message)

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
    proc = subprocess.Popen(spec["command"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=spec.get("cwd", _HOOKS_DIR), env=env)
    deadline = time.monotonic() + spec["timeout"]
    event = _CANCEL.get()
    stdin = json.dumps(payload)
    while True:
        try:
            stdout, stderr = proc.communicate(stdin, timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            stdin = None  # sent already; communicate() refuses it a second time
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
            _delay(min(delay, max_delay))
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

    clocks = []  # each branch's clock when it ended

    def run_branch(index, task):
        ctx = copy.deepcopy(snapshot)
        if "for" in self.config["parallel"]:
            ctx[value_var] = task["id"]
            ctx[index_var] = index
        try:
            wf.execute_step(str(task["id"]), task["config"], ctx)
        finally:
            clocks.append(_SKIPPED.get())
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
    _SKIPPED.set(max([_SKIPPED.get(), *clocks]))
    self.check_raise_results(errors)
    return self.context


wf.StepParallel.execute_task_config = _execute_task_config


# ---------------------------------------------------------------- switch: the first true condition only
def _switch_execute(self):
    """Google runs the first condition that is true and no other; the package went on evaluating (and
    running) every later condition that was also true."""
    for condition in self.config["switch"]:
        evaluated = render_config(condition["condition"], self.context)
        if not isinstance(evaluated, bool):
            _raise(f"switch condition must be a boolean, got {evaluated!r}: {condition['condition']}", ["TypeError"])
        if evaluated:
            branch = {k: v for k, v in condition.items() if k != "condition"}
            context, next_step, ret_value = wf.execute_step(self.step_id, branch, self.context)
            return context, next_step if next_step is not None else self.config.get("next"), ret_value
    return self.context, self.config.get("next"), None


wf.StepSwitch.execute = _switch_execute


# ---------------------------------------------------------------- assign: an error must not hang the emulator
def _assign_execute(self):
    """The package took a global lock around every assign step and released it only on success: the first
    expression error inside an assign (a catchable TypeError in Google) hung every later assign forever."""
    context = self.context
    with wf.LOCK:
        for var in self.config["assign"]:
            name = list(var.keys())[0]
            value = render_config(var[name], context)
            root, new_value = wf.assign_var(name, value, context)
            context[root] = new_value
    return context, self.config.get("next"), None


wf.StepAssign.execute = _assign_execute

# ---------------------------------------------------------------- executions store + REST API
PROJECT = "test-project"
LOCATION = "us-central1"
WORKFLOWS_DIR = "."
_EXECUTIONS: dict[str, dict] = {}
_CANCEL_EVENTS: dict[str, threading.Event] = {}  # set by :cancel; the execution's thread stops at its next step
_STEP_COUNTERS: dict[str, StepCounter] = {}  # the steps each execution ran (GET /_emulator/steps?execution=NAME)
_LOCK = threading.Lock()
# Faults for the next createExecution calls (POST /_emulator/faults), for the trigger's crash tests:
# "fail-before-create" answers 503 and creates nothing; "fail-after-create" creates the execution and
# answers 503 (the answer was lost); "hang-then-fail:S" holds the call S seconds (default 30), then answers
# 503, creating nothing.
_CREATE_FAULTS: list[str] = []
# Faults for the next executions.list calls: "late-answer:S" makes the answer at once (what exists now) and
# sends it S seconds later, as a caller stopped right after the server answered would read it.
_LIST_FAULTS: list[str] = []

# executions.list `filter` (AIP-160), the subset Google documents and this project uses: comparisons
# `labels.KEY="VALUE"`, `state="STATE"` and `createTime`/`startTime` OP "RFC 3339" (OP one of = > >= < <=)
# joined by AND. Anything else is refused, as an unknown filter is by Google
# (https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions/list).
_FILTER_TERM = re.compile(r'^\s*(labels\.([a-z][a-z0-9_-]{0,62})|state)\s*=\s*"([^"]*)"\s*$')
_TIME_TERM = re.compile(r'^\s*(createTime|startTime)\s*(>=|<=|=|>|<)\s*"([^"]+)"\s*$')
_OPS = {"=": lambda a, b: a == b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
        "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}


def _parse_time(text: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _parse_filter(text: str):
    if not text.strip():
        return lambda e: True
    tests = []
    for term in re.split(r"\s+AND\s+", text.strip()):
        t = _TIME_TERM.match(term)
        if t:
            field, op, value = t.group(1), _OPS[t.group(2)], _parse_time(t.group(3))
            # An execution without the field (a QUEUED one has no startTime) matches no comparison on it.
            tests.append(lambda e, f=field, o=op, v=value: f in e and o(_parse_time(e[f]), v))
            continue
        m = _FILTER_TERM.match(term)
        if not m:
            raise ValueError(f"invalid filter term {term!r} in {text!r}")
        field, label, value = m.group(1), m.group(2), m.group(3)
        if label is not None:
            tests.append(lambda e, k=label, v=value: (e.get("labels") or {}).get(k) == v)
        else:
            tests.append(lambda e, v=value: e.get("state") == v)
    return lambda e: all(t(e) for t in tests)


# executions.list `orderBy` (AIP-132): one of the time fields Google lists, optionally "desc"; by default
# "descending createTime" (same page). An execution without the field sorts last.
_ORDER = re.compile(r"^\s*(createTime|startTime|endTime)(\s+(asc|desc))?\s*$")


def _order_key(order_by: str):
    m = _ORDER.match(order_by or "createTime desc")
    if not m:
        raise ValueError(f"unsupported orderBy {order_by!r}")
    return m.group(1), m.group(3) != "asc"


# The BASIC view: "name, startTime, endTime, duration, state, and workflowRevisionId" only
# (https://cloud.google.com/workflows/docs/reference/executions/rest/v1/ExecutionView). executions.list
# defaults to BASIC, executions.get to FULL.
_BASIC_FIELDS = ("name", "startTime", "endTime", "duration", "state", "workflowRevisionId")
# pageSize: "it's 1000 for BASIC and 100 for FULL. The default value used if the field is not specified is
# 100, regardless of the selected view. Values greater than the max value will be coerced down to it."
_MAX_PAGE = {"BASIC": 1000, "FULL": 100}


def _view(query: dict, default: str) -> str:
    raw = (query.get("view") or [""])[0]
    view = {"": default, "0": default, "EXECUTION_VIEW_UNSPECIFIED": default, "1": "BASIC", "2": "FULL"}.get(raw, raw)
    if view not in _MAX_PAGE:
        raise ValueError(f"invalid view {raw!r}")
    return view


def _in_view(execution: dict, view: str) -> dict:
    if view == "FULL":
        return copy.deepcopy(execution)
    return {k: copy.deepcopy(v) for k, v in execution.items() if k in _BASIC_FIELDS}


def list_executions(prefix: str, query: dict):
    """One page of executions.list; (status, body)."""
    def bad(message):
        return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": message}}
    try:
        view = _view(query, "BASIC")
        keep = _parse_filter((query.get("filter") or [""])[0])
        order_field, descending = _order_key((query.get("orderBy") or [""])[0])
        size = int((query.get("pageSize") or ["0"])[0] or 0)
    except ValueError as err:
        return bad(str(err))
    if size < 0:
        return bad("pageSize must not be negative")
    size = min(size or 100, _MAX_PAGE[view])
    # The page token carries where the last page ended and a digest of every other parameter: "When
    # paginating, all other parameters provided to executions.list must match the call that provided the
    # page token". A cursor, not an offset: executions created meanwhile shift no page.
    params = json.dumps({k: v for k, v in sorted(query.items()) if k != "pageToken"})
    digest = hashlib.sha256(params.encode()).hexdigest()[:16]
    token = (query.get("pageToken") or [""])[0]
    after = None
    if token:
        try:
            cursor = json.loads(bytes.fromhex(token).decode())
            if cursor["digest"] != digest:
                return bad("the page token was issued for a request with other parameters")
            after = tuple(cursor["after"])
        except (ValueError, KeyError, TypeError):
            return bad("invalid page token")
    with _LOCK:
        items = [copy.deepcopy(e) for n, e in _EXECUTIONS.items() if n.startswith(prefix) and keep(e)]

    def key(e):
        # Executions without the field last, whichever the direction; the name breaks ties.
        value = e.get(order_field, "")
        return (value != "", value, e["name"]) if descending else (value == "", value, e["name"])
    items.sort(key=key, reverse=descending)
    if after is not None:
        items = [e for e in items if (key(e) < after if descending else key(e) > after)]
    page, rest = items[:size], items[size:]
    body = {"executions": [_in_view(e, view) for e in page]}
    if rest:
        body["nextPageToken"] = json.dumps({"digest": digest, "after": list(key(page[-1]))}).encode().hex()
    return 200, body


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


# --max-active N: the concurrent executions quota. Beyond it executions are backlogged: QUEUED, with no
# startTime until they begin, in creation order, as a slot frees (an execution "placed in the backlog for
# processing at a later time", the Execution resource's State QUEUED; disableConcurrencyQuotaOverflowBuffering
# "the execution will not be backlogged when the concurrency quota is exhausted"). 0: no quota.
MAX_ACTIVE = 0
_BACKLOG: list[str] = []  # names of QUEUED executions, oldest first
_ADMITTED: dict[str, threading.Event] = {}  # set when a QUEUED execution begins (or is cancelled)


def _admit_next_locked():
    """Begins backlogged executions while the quota has room. Call with _LOCK held."""
    active = sum(1 for e in _EXECUTIONS.values() if e["state"] == "ACTIVE")
    while _BACKLOG and (MAX_ACTIVE == 0 or active < MAX_ACTIVE):
        ex = _EXECUTIONS[_BACKLOG.pop(0)]
        if ex["state"] != "QUEUED":
            continue
        ex.update(state="ACTIVE", startTime=_now())
        _ADMITTED[ex["name"]].set()
        active += 1


def _run(execution: dict, config: dict, params: dict, env: dict, cancel: threading.Event, steps: StepCounter):
    _EXEC_ENV.set(env)
    _CANCEL.set(cancel)
    _STEPS.set(steps)
    _ADMITTED[execution["name"]].wait()  # at once unless it waits in the backlog
    with _LOCK:
        if execution["state"] != "ACTIVE":
            return  # cancelled while it was queued: it never began
    t0 = time.time()
    try:
        result = wf.execute_workflow(config, params)
        update = {"state": "SUCCEEDED", "result": json.dumps(_plain(result))}
    except ExecutionCancelled:
        log.info("execution %s stopped: cancelled", execution["name"])
        return  # the cancel request set CANCELLED and endTime, and freed its slot
    except BaseException as err:  # noqa: BLE001 - every failure becomes a FAILED execution
        log.warning("execution %s failed: %s", execution["name"], err)
        update = {"state": "FAILED",
                  "error": {"payload": json.dumps(_error_payload(err)), "context": f"{err.__class__.__name__}: {err}"}}
    with _LOCK:
        if execution["state"] == "CANCELLED":
            return  # cancelled just as it finished: it stays cancelled
        execution.update(update)
        execution["endTime"] = _now()
        execution["duration"] = f"{time.time() - t0:.6f}s"
        _admit_next_locked()


def create_execution(project, location, wid, body):
    path = _workflow_file(wid)
    if path is None:
        return 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": f"workflow {wid} not found"}}
    try:
        config = wf.load_workflow(path)
    except Exception as err:  # noqa: BLE001
        return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": f"invalid workflow {wid}: {err}"}}
    argument = body.get("argument") or "null"
    # Google's limits on what an execution carries (Execution resource reference): labels as keys and
    # values of lowercase letters, digits, '_' and '-' up to 63 characters, keys starting with a letter,
    # at most 64 of them; the argument at most 32 KiB.
    labels = body.get("labels") or {}
    bad = [f"{k}={v}" for k, v in labels.items()
           if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", str(k)) or not re.fullmatch(r"[a-z0-9_-]{0,63}", str(v))]
    if bad or len(labels) > 64:
        return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": f"invalid labels: {bad or len(labels)}"}}
    if len(argument.encode()) > 32 * 1024:
        return 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "argument exceeds 32 KiB"}}
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
    created = _now()
    execution = {"name": name, "createTime": created, "startTime": created, "state": "ACTIVE", "argument": argument,
                 "workflowRevisionId": revision, "callLogLevel": body.get("callLogLevel", "CALL_LOG_LEVEL_UNSPECIFIED"),
                 "labels": body.get("labels") or {}, "status": {}}
    env = {"GOOGLE_CLOUD_PROJECT_ID": project, "GOOGLE_CLOUD_LOCATION": location,
           "GOOGLE_CLOUD_WORKFLOW_ID": wid, "GOOGLE_CLOUD_WORKFLOW_REVISION_ID": revision,
           "GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID": exec_id}
    cancel = threading.Event()
    admitted = threading.Event()
    steps = StepCounter(STEP_LIMIT)
    with _LOCK:
        if MAX_ACTIVE and sum(1 for e in _EXECUTIONS.values() if e["state"] == "ACTIVE") >= MAX_ACTIVE:
            execution["state"] = "QUEUED"
            del execution["startTime"]  # it has not begun
            _BACKLOG.append(name)
        else:
            admitted.set()
        _EXECUTIONS[name] = execution
        _CANCEL_EVENTS[name] = cancel
        _ADMITTED[name] = admitted
        _STEP_COUNTERS[name] = steps
        snapshot = copy.deepcopy(execution)
    threading.Thread(target=contextvars.Context().run, args=(_run, execution, config, params, env, cancel, steps),
                     daemon=True).start()
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
        if path == "/_emulator/faults":  # test control: faults not yet consumed
            with _LOCK:
                return self._send(200, {"createExecution": list(_CREATE_FAULTS), "listExecutions": list(_LIST_FAULTS)})
        if path == "/_emulator/steps":  # test control: the steps an execution ran so far (Google shows no such count)
            name = (_up.parse_qs(self.path.partition("?")[2]).get("execution") or [""])[0]
            with _LOCK:
                counter = _STEP_COUNTERS.get(name)
            return self._send(200, {"steps": counter.steps, "limit": counter.limit, "maxBytes": counter.max_bytes}) if counter else \
                self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "execution not found"}})
        query = _up.parse_qs(self.path.split("?", 1)[1] if "?" in self.path else "")
        m = _RE_EXEC.match(path)
        if m and not m.group(2):
            try:
                view = _view(query, "FULL")
            except ValueError as err:
                return self._send(400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": str(err)}})
            with _LOCK:
                ex = _EXECUTIONS.get(m.group(1))
                ex = _in_view(ex, view) if ex else None
            return self._send(200, ex) if ex else self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "execution not found"}})
        m = _RE_EXECS.match(path)
        if m:
            prefix = f"projects/{m.group(1)}/locations/{m.group(2)}/workflows/{m.group(3)}/executions/"
            with _LOCK:
                fault = _LIST_FAULTS.pop(0) if _LIST_FAULTS else None
            answer = list_executions(prefix, query)
            if fault and fault.startswith("late-answer"):
                time.sleep(float(fault.partition(":")[2] or 3))
            return self._send(*answer)
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
        if path == "/_emulator/faults":  # test control: queue faults for the next createExecution calls
            with _LOCK:
                _CREATE_FAULTS.extend(body.get("createExecution") or [])
                _LIST_FAULTS.extend(body.get("listExecutions") or [])
            return self._send(200, {"queued": len(_CREATE_FAULTS) + len(_LIST_FAULTS)})
        m = _RE_EXECS.match(path)
        if m:
            with _LOCK:
                fault = _CREATE_FAULTS.pop(0) if _CREATE_FAULTS else None
            if fault == "fail-before-create":
                return self._send(503, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "injected: no execution created"}})
            if fault and fault.startswith("hang-then-fail"):  # "hang-then-fail:SECONDS": nothing is created
                time.sleep(float(fault.partition(":")[2] or 30))
                return self._send(503, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "injected: no execution created"}})
            code, created = create_execution(m.group(1), m.group(2), m.group(3), body)
            if fault == "fail-after-create" and code == 200:
                return self._send(503, {"error": {"code": 503, "status": "UNAVAILABLE", "message": "injected: execution created, answer lost"}})
            return self._send(code, created)
        m = _RE_EXEC.match(path)
        if m and m.group(2):  # CANCELLED at once; the workflow's thread stops at its next step, call or sleep
            with _LOCK:
                ex = _EXECUTIONS.get(m.group(1))
                if ex and ex["state"] in ("ACTIVE", "QUEUED"):
                    ex.update(state="CANCELLED", endTime=_now())
                    _CANCEL_EVENTS[m.group(1)].set()
                    _ADMITTED[m.group(1)].set()  # a queued one's thread wakes and ends without beginning
                    _admit_next_locked()
                out = copy.deepcopy(ex)
            return self._send(200, out) if out else self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "execution not found"}})
        return self._send(404, {"error": {"code": 404, "status": "NOT_FOUND", "message": path}})


def main():
    global PROJECT, LOCATION, WORKFLOWS_DIR, BACKOFF_SCALE, MAX_ACTIVE, STEP_LIMIT, FAST_CLOCK
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8787)
    ap.add_argument("--workflows-dir", required=True, help="DIR/<id>.yaml is workflow <id>; re-read on every execution")
    ap.add_argument("--project", default=PROJECT)
    ap.add_argument("--location", default=LOCATION)
    ap.add_argument("--connector-hooks", help="YAML: hooks: {<googleapis.connector.name>: {command: [...], timeout: s, env: {}}}")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="user env var for sys.get_env")
    ap.add_argument("--backoff-scale", type=float, default=1.0, help="multiply every retry delay (0 = no sleep)")
    ap.add_argument("--max-active", type=int, default=0,
                    help="concurrent executions quota; beyond it executions wait QUEUED (no startTime) in a backlog (0 = none)")
    ap.add_argument("--fast-clock", action="store_true",
                    help="sys.now() runs on by the part of every sleep and retry delay --backoff-scale skips")
    ap.add_argument("--step-limit", type=int, default=STEP_LIMIT, help="steps an execution may run (Google: 100,000)")
    ap.add_argument("--log-level", default="WARNING")
    a = ap.parse_args()
    logging.basicConfig(level=a.log_level, format="[wfemu %(asctime)s] %(name)s %(levelname)s %(message)s")
    PROJECT, LOCATION, WORKFLOWS_DIR, BACKOFF_SCALE = a.project, a.location, os.path.abspath(a.workflows_dir), a.backoff_scale
    MAX_ACTIVE = max(0, a.max_active)
    STEP_LIMIT, FAST_CLOCK = a.step_limit, a.fast_clock
    for kv in a.env:
        k, _, v = kv.partition("=")
        _USER_ENV[k] = v
    if a.connector_hooks:
        load_hooks(a.connector_hooks)
    # socketserver's listen backlog is 5: a burst of clients (tests create executions 50 at once) is reset.
    ThreadingHTTPServer.request_queue_size = 128
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
