"""Execution semantics the package gets wrong or leaves out: retry backoff, parallel (a real concurrency
limit, per-branch scopes, shared variables merged back), switch (the first true condition only), assign
(an error must not hang the emulator), and concurrency_limit as an expression."""
from __future__ import annotations

import contextvars
import copy
import threading
from concurrent.futures import ThreadPoolExecutor

from workflows_emulator import main as wf
from workflows_emulator import utils as wfu
from workflows_emulator.render import render_config

from .runtime import _SKIPPED, _delay
from .values import _raise


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


# ---------------------------------------------------------------- retry with real backoff
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
