"""The emulator's settings, from its command line (server.main sets them). Read as `settings.NAME` at use, so
what main sets is what every module sees."""

PROJECT = "test-project"
LOCATION = "us-central1"
WORKFLOWS_DIR = "."  # DIR/<id>.yaml is workflow <id>
BACKOFF_SCALE = 1.0  # --backoff-scale: every retry delay and sys.sleep, times this, for real
FAST_CLOCK = False  # --fast-clock: sys.now() runs on by the part of each delay BACKOFF_SCALE skipped
STEP_LIMIT = 100_000  # --step-limit: Google's steps per execution (limits.py)
# --max-active N: the concurrent executions quota (executions.py). 0: no quota.
MAX_ACTIVE = 0
