"""Installs wfemu_lib's replacements into the workflows-emulator package: every internal it replaces is set
here, and only here."""
from __future__ import annotations

from workflows_emulator import main as wf
from workflows_emulator import render as wf_render
from workflows_emulator.lib import json_utils, sys_utils, text_utils

from . import connectors, limits, runtime, stdlib, steps

APPLIED: list[str] = []  # the dotted names set, in order


def _set(owner, name: str, value) -> None:
    setattr(owner, name, value)
    APPLIED.append(f"{getattr(owner, '__module__', None) if isinstance(owner, type) else owner.__name__}"
                   f"{'.' + owner.__name__ if isinstance(owner, type) else ''}.{name}")


def install() -> None:
    """Applies every replacement, once."""
    if APPLIED:
        return
    _set(sys_utils, "get_env", runtime._get_env)
    _set(wf, "execute_step", limits._execute_step)  # every step, nested ones and parallel branches included, starts here
    _set(text_utils, "url_encode", stdlib.url_encode)
    _set(text_utils, "url_encode_plus", stdlib.url_encode_plus)
    _set(text_utils, "url_decode", stdlib.url_decode)
    _set(json_utils, "encode", stdlib.json_encode)
    _set(json_utils, "encode_to_string", stdlib.json_encode_to_string)
    library = wf_render.STANDARD_LIBRARY
    library.update(stdlib.library(library))
    for name in stdlib.REMOVED:
        library.pop(name, None)
    APPLIED.append("workflows_emulator.render.STANDARD_LIBRARY")
    _set(wf_render, "render_str", stdlib._render_str)
    steps._allow_expression(wf.WORKFLOW_SCHEMA, "concurrency_limit")
    APPLIED.append("workflows_emulator.main.WORKFLOW_SCHEMA")
    _set(wf.StepCall, "execute_connector", staticmethod(connectors.run_connector))
    _set(wf.StepRetry, "execute", steps._retry_execute)
    _set(wf.StepParallel, "execute_task_config", steps._execute_task_config)
    _set(wf.StepSwitch, "execute", steps._switch_execute)
    _set(wf.StepAssign, "execute", steps._assign_execute)
