"""Google's per-execution limits: the step budget and the size of a frame's variables."""
from __future__ import annotations

import contextvars
import json
import threading

from workflows_emulator import main as wf

from .runtime import _check_cancelled

# Google fails an execution that runs more than 100,000 steps with a ResourceLimitError that no try/except
# catches (https://cloud.google.com/workflows/quotas, "Steps per execution"). What counts as a step, per
# https://cloud.google.com/workflows/pricing: every step executed, failed or not, each retry attempt again,
# assignments, conditions, calls to subworkflows, standard-library functions and connectors, and every polling
# attempt a connector makes while it waits for a long-running operation. The emulator counts every step it
# enters, the parts a step runs as steps of their own included (a try's body, the chosen switch condition, a
# retry predicate's steps), so its count is at least Google's: a workflow that stays under the limit here
# stays under it there. The limit itself is settings.STEP_LIMIT (--step-limit).


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
