"""The workflows-emulator release this package is written against, and the shape of every internal of it that
the package replaces or calls.

wfemu_lib replaces internals of the PyPI package (its step dispatch, step classes' methods, standard library
and renderer), none of which the package documents or keeps stable. So before anything is patched, check()
verifies that the installed version is the one requirements.txt pins and that each symbol below exists with
the parameters listed, and fails with one line naming what differs: a bumped pin then stops the emulator at
once instead of changing its semantics silently. After a bump, re-read each replaced function beside the
package's new code, then update the pin, this table and the tests (tools/workflows-emulator/tests).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import re

DISTRIBUTION = "workflows-emulator"
REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "requirements.txt")

# Replaced by patches.py (it refuses to set anything not listed here), with the shape the replacement has
# to match: "(names)" for a function's parameters, else the kind of object.
PATCHED = {
    "workflows_emulator.main.execute_step": "(step_id, config, context)",
    "workflows_emulator.main.StepCall.execute_connector": "(rendered_step)",
    "workflows_emulator.main.StepRetry.execute": "(self)",
    "workflows_emulator.main.StepParallel.execute_task_config": "(self, task_configs, concurrency_limit, index_var, value_var)",
    "workflows_emulator.main.StepSwitch.execute": "(self)",
    "workflows_emulator.main.StepAssign.execute": "(self)",
    "workflows_emulator.main.WORKFLOW_SCHEMA": "dict",  # concurrency_limit's type widened in place
    "workflows_emulator.render.render_str": "(value, context)",
    "workflows_emulator.render.STANDARD_LIBRARY": "dict",  # entries replaced, added and removed
    "workflows_emulator.lib.sys_utils.get_env": "(*args)",
    "workflows_emulator.lib.json_utils.encode": "(data, indent)",
    "workflows_emulator.lib.json_utils.encode_to_string": "(data, indent)",
    "workflows_emulator.lib.text_utils.url_encode": "(string, safe, encoding, errors)",
    "workflows_emulator.lib.text_utils.url_encode_plus": "(string, safe, encoding, errors)",
    "workflows_emulator.lib.text_utils.url_decode": "(string, encoding, errors)",
}

# Called or read by the replacements, unchanged.
USED = {
    "workflows_emulator.main.Step.__init__": "(self, step_id, config, context)",  # self.step_id, .config, .context
    "workflows_emulator.main.StepParallel.check_raise_results": "(self, exceptions_lookup)",
    "workflows_emulator.main.execute_workflow": "(config, params)",
    "workflows_emulator.main.load_workflow": "(config_path)",
    "workflows_emulator.main.execute_subworkflow": "(workflow, params, context)",
    "workflows_emulator.main.keep_only_subworkflows": "(context)",
    "workflows_emulator.main.execute_steps_list": "(steps, context, next_step)",
    "workflows_emulator.main.assign_var": "(key, value, context)",
    "workflows_emulator.main.LOCK": "lock",
    "workflows_emulator.render.run_code": "(code, context)",
    "workflows_emulator.render.render_config": "(config, context)",
    "workflows_emulator.utils.WorkflowError": "class",
    "workflows_emulator.utils.RuntimeError": "class",
    # the package's standard-library functions the strict library wraps (stdlib.library), called positionally
    "workflows_emulator.lib.sys_utils.sleep_until": "(future)",
    "workflows_emulator.lib.json_utils.decode": "(data)",
    "workflows_emulator.lib.text_utils.find_all_regex": "(source, regexp)",
    "workflows_emulator.lib.text_utils.match_regex": "(source, regexp)",
    "workflows_emulator.lib.text_utils.replace_all": "(source, substr, repl)",
    "workflows_emulator.lib.text_utils.replace_all_regex": "(source, regexp, repl)",
    "workflows_emulator.lib.text_utils.split": "(source, separator)",
    "workflows_emulator.lib.text_utils.to_lower": "(source)",
    "workflows_emulator.lib.text_utils.to_upper": "(source)",
    "workflows_emulator.lib.base64_utils.decode": "(data, padding)",
    "workflows_emulator.lib.base64_utils.encode": "(data, _padding)",
    "workflows_emulator.lib.map_utils.delete": "(obj, key)",
    "workflows_emulator.lib.map_utils.merge": "(first, second)",
    "workflows_emulator.lib.map_utils.merge_nested": "(first, second)",
    "workflows_emulator.lib.list_utils.concat": "(objs, val)",
    "workflows_emulator.lib.list_utils.prepend": "(objs, val)",
    "workflows_emulator.lib.math_utils.abs": "(x)",
    "workflows_emulator.lib.math_utils.floor": "(x)",
    "workflows_emulator.lib.math_utils.max": "(x, y)",
    "workflows_emulator.lib.math_utils.min": "(x, y)",
    "workflows_emulator.lib.time_utils.format": "(seconds, tz)",
    "workflows_emulator.lib.time_utils.parse": "(value)",
    "workflows_emulator.lib.uuid_utils.generate": "()",
}

# STANDARD_LIBRARY entries stdlib.library reads: each the module of that name above.
LIBRARY_MODULES = ("sys", "text", "json", "base64", "map", "list", "math", "time", "uuid")


class Mismatch(ImportError):
    """The installed workflows-emulator is not the one wfemu_lib was written against: wfemu_lib cannot be
    imported over it."""


def pinned_version(requirements: str = REQUIREMENTS) -> str:
    with open(requirements) as f:
        for line in f:
            m = re.match(rf"^\s*{re.escape(DISTRIBUTION)}\s*==\s*([^\s#;]+)", line)
            if m:
                return m.group(1)
    raise Mismatch(f"{requirements} pins no {DISTRIBUTION}==VERSION")


def installed_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def shape(obj) -> str:
    """"(a, *b, **c)" for a function (its parameter names), "class", else the object's type name."""
    if inspect.isclass(obj):
        return "class"
    if callable(obj):
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            return "callable"
        star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
        return "(" + ", ".join(star.get(p.kind, "") + p.name for p in params) + ")"
    return type(obj).__name__


def resolve(symbol: str):
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = symbol.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)  # AttributeError: missing
        return obj
    raise ImportError(symbol)


def problems(expected: dict[str, str], role: str):
    """(symbol, what is wrong) for each symbol in `expected` that is missing or has another shape."""
    for symbol, want in expected.items():
        try:
            got = shape(resolve(symbol))
        except (ImportError, AttributeError):
            yield symbol, f"{role} symbol {symbol} is missing"
            continue
        if got != want:
            yield symbol, f"{role} symbol {symbol} is {got}, expected {want}"


def check(installed: str | None = None, pinned: str | None = None) -> None:
    """Raises Mismatch, one line, unless the installed package is the pinned version with every symbol in
    PATCHED and USED as listed."""
    installed = installed_version() if installed is None else installed
    pinned = pinned_version() if pinned is None else pinned
    if installed != pinned:
        raise Mismatch(f"{DISTRIBUTION} {installed} is installed but wfemu_lib patches {pinned}, the version "
                       f"requirements.txt pins (pip install -r tools/workflows-emulator/requirements.txt, or port "
                       f"wfemu_lib/ to {installed} and move the pin)")
    fix = "(reinstall it: pip install --force-reinstall -r tools/workflows-emulator/requirements.txt)"
    for _, message in [*problems(PATCHED, "patched"), *problems(USED, "used")]:
        raise Mismatch(f"{message} in {DISTRIBUTION} {installed} (pinned {pinned}) {fix}")
    library = resolve("workflows_emulator.render.STANDARD_LIBRARY")
    for name in LIBRARY_MODULES:
        module = f"workflows_emulator.lib.{name}_utils"
        if getattr(library.get(name), "__name__", None) != module:
            raise Mismatch(f"used symbol workflows_emulator.render.STANDARD_LIBRARY[{name!r}] is not {module} "
                           f"in {DISTRIBUTION} {installed} (pinned {pinned}) {fix}")
