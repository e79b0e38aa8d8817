"""Runs workflows in-process on the patched package, as the emulator's execution threads do (executions._run),
for the tests beside this file. Importing it installs the patches."""
from __future__ import annotations

import contextvars
import logging
import os
import sys
import tempfile
import threading

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from wfemu_lib import patches, settings  # noqa: E402  (the pin check runs on this import, before patching)
from wfemu_lib.limits import _STEPS, StepCounter  # noqa: E402
from wfemu_lib.runtime import _CANCEL, _EXEC_ENV, _SKIPPED  # noqa: E402
from workflows_emulator import main as wf  # noqa: E402

patches.install()
settings.BACKOFF_SCALE = 0  # as the tests' emulators run: no real sleeping
logging.disable(logging.ERROR)  # the package logs every error a workflow catches


class Run:
    """One execution's outcome: its result, or the exception that ended it; its step counter; its clock."""

    def __init__(self):
        self.result = self.error = None
        self.steps: StepCounter | None = None
        self.skipped = 0.0  # seconds the execution's clock ran ahead of real time (--fast-clock)


def run(workflow, argument=None, *, step_limit=100_000, env=None, cancel=None) -> Run:
    """Runs `workflow` (a map, as its YAML would be) through the package's loader (so its schema applies),
    in a fresh context like an execution's thread."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(workflow, f)
    try:
        config = wf.load_workflow(f.name)
    finally:
        os.unlink(f.name)
    out = Run()
    out.steps = StepCounter(step_limit)

    def body():
        _EXEC_ENV.set(env or {})
        _CANCEL.set(cancel or threading.Event())
        _STEPS.set(out.steps)
        main = config.get("main") or {}
        params = {main["params"][0]: argument} if main.get("params") else {}
        try:
            out.result = wf.execute_workflow(config, params)
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            out.error = err
        out.skipped = _SKIPPED.get()

    contextvars.Context().run(body)
    return out


def returning(*steps, params=None) -> dict:
    """A workflow of `steps` (name -> step maps, in order)."""
    main = {"steps": [{name: step} for name, step in steps]}
    if params:
        main["params"] = params
    return {"main": main}


def value_of(expression: str, **variables):
    """What `${expression}` evaluates to in a workflow with `variables` assigned; an error raises."""
    assign = [{"assign": [{k: v} for k, v in variables.items()]}] if variables else []
    workflow = returning(*[("init", a) for a in assign], ("done", {"return": "${" + expression + "}"}))
    r = run(workflow)
    if r.error is not None:
        raise r.error
    return r.result


def tags_of(err) -> list:
    payload = getattr(err, "payload", None)
    payload = payload.to_dict() if hasattr(payload, "to_dict") else payload
    return (payload or {}).get("tags", [])

