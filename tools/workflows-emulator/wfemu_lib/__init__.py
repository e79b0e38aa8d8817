"""The parts of wfemu.py, the local Cloud Workflows emulator (its docstring says what it adds to the PyPI
workflows-emulator package), one concern per module:

  pinned       the package version and internals this is written against, checked before anything is patched
  patches      installs every replacement into the package
  runtime      per-execution state: GOOGLE_CLOUD_* variables, cancellation, the execution's clock
  limits       Google's step budget and frame size limit (ResourceLimitError)
  stdlib       the standard library, strict as Google documents it, and expression rendering
  steps        execution semantics: retry backoff, parallel, switch, assign
  connectors   googleapis.* calls run by local hooks, connector_params checked
  executions   the executions store: create, backlog, list views, filters and pages, test faults
  server       the Executions REST API over HTTP and the command line
  settings     the command line's values
"""
from . import pinned

# Before any module here reads the package's internals, and before anything is patched.
pinned.check()
