"""Workflow values and errors as the package represents them."""
from __future__ import annotations

import json

from workflows_emulator import utils as wfu

def _raise(message: str, tags: list[str], **extra):
    raise wfu.RuntimeError(message=message, tags=tags, **extra)


def _plain(value):
    """ContextDict/addict -> plain JSON-able data."""
    return json.loads(json.dumps(value, default=lambda o: o.to_dict() if hasattr(o, "to_dict") else str(o)))
