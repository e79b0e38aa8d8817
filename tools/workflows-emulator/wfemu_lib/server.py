"""The HTTP server (the Executions REST API and the test controls under /_emulator/) and the command line."""
from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import re
import signal
import threading
import time
import urllib.parse as _up
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import settings
from .connectors import load_hooks
from .executions import (_CANCEL_EVENTS, _ADMITTED, _CREATE_FAULTS, _EXECUTIONS, _LIST_FAULTS, _LOCK, _STEP_COUNTERS,
                         _admit_next_locked, _in_view, _now, _view, _workflow_file, create_execution, list_executions)
from .runtime import _USER_ENV

log = logging.getLogger("wfemu")

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
    ap = argparse.ArgumentParser(description="Local Cloud Workflows emulator for end-to-end tests.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8787)
    ap.add_argument("--workflows-dir", required=True, help="DIR/<id>.yaml is workflow <id>; re-read on every execution")
    ap.add_argument("--project", default=settings.PROJECT)
    ap.add_argument("--location", default=settings.LOCATION)
    ap.add_argument("--connector-hooks", help="YAML: hooks: {<googleapis.connector.name>: {command: [...], timeout: s, env: {}}}")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="user env var for sys.get_env")
    ap.add_argument("--backoff-scale", type=float, default=1.0, help="multiply every retry delay (0 = no sleep)")
    ap.add_argument("--max-active", type=int, default=0,
                    help="concurrent executions quota; beyond it executions wait QUEUED (no startTime) in a backlog (0 = none)")
    ap.add_argument("--fast-clock", action="store_true",
                    help="sys.now() runs on by the part of every sleep and retry delay --backoff-scale skips")
    ap.add_argument("--step-limit", type=int, default=settings.STEP_LIMIT, help="steps an execution may run (Google: 100,000)")
    ap.add_argument("--log-level", default="WARNING")
    a = ap.parse_args()
    logging.basicConfig(level=a.log_level, format="[wfemu %(asctime)s] %(name)s %(levelname)s %(message)s")
    settings.PROJECT, settings.LOCATION = a.project, a.location
    settings.WORKFLOWS_DIR, settings.BACKOFF_SCALE = os.path.abspath(a.workflows_dir), a.backoff_scale
    settings.MAX_ACTIVE = max(0, a.max_active)
    settings.STEP_LIMIT, settings.FAST_CLOCK = a.step_limit, a.fast_clock
    for kv in a.env:
        k, _, v = kv.partition("=")
        _USER_ENV[k] = v
    if a.connector_hooks:
        load_hooks(a.connector_hooks)
    # socketserver's listen backlog is 5: a burst of clients (tests create executions 50 at once) is reset.
    ThreadingHTTPServer.request_queue_size = 128
    srv = ThreadingHTTPServer((a.host, a.port), Handler)
    srv.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    print(f"workflows-emulator listening on http://{a.host}:{srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    srv.server_close()
