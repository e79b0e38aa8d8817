"""What each execution carries on its own thread: its GOOGLE_CLOUD_* variables, its cancel event and its
clock. Contextvars, so parallel branches (run in copies of the context) see their execution's values."""
from __future__ import annotations

import contextvars
import threading
import time

from . import settings

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




def _delay(seconds):
    """Waits `seconds` of the execution's time: settings.BACKOFF_SCALE of them for real, with --fast-clock the rest on its
    clock."""
    _wait(seconds * settings.BACKOFF_SCALE)
    if settings.FAST_CLOCK:
        _SKIPPED.set(_SKIPPED.get() + seconds * (1 - settings.BACKOFF_SCALE))


def _clock_now():
    return time.time() + _SKIPPED.get()
