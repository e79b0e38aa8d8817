"""The executions store behind the Executions REST API (workflowexecutions v1): create, the backlog of
--max-active, list with its views, filter, order and pages, and the faults tests queue."""
from __future__ import annotations

import contextvars
import copy
import datetime as dt
import hashlib
import json
import logging
import os
import re
import threading
import time
import uuid

from workflows_emulator import main as wf

from . import settings
from .limits import _STEPS, StepCounter
from .runtime import _CANCEL, _EXEC_ENV, ExecutionCancelled
from .values import _plain

log = logging.getLogger("wfemu")

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
        p = os.path.join(settings.WORKFLOWS_DIR, wid + ext)
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
_BACKLOG: list[str] = []  # names of QUEUED executions, oldest first
_ADMITTED: dict[str, threading.Event] = {}  # set when a QUEUED execution begins (or is cancelled)


def _admit_next_locked():
    """Begins backlogged executions while the quota has room. Call with _LOCK held."""
    active = sum(1 for e in _EXECUTIONS.values() if e["state"] == "ACTIVE")
    while _BACKLOG and (settings.MAX_ACTIVE == 0 or active < settings.MAX_ACTIVE):
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
    with open(path, "rb") as f:
        revision = "000001-" + hashlib.sha256(f.read()).hexdigest()[:3]
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
    steps = StepCounter(settings.STEP_LIMIT)
    with _LOCK:
        if settings.MAX_ACTIVE and sum(1 for e in _EXECUTIONS.values() if e["state"] == "ACTIVE") >= settings.MAX_ACTIVE:
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
