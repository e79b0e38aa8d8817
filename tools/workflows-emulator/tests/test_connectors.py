"""googleapis.* connector calls (Cloud Run jobs, Pub/Sub, Storage, ...) run by local hooks: the call's args as
JSON on stdin, the result as JSON on stdout, a failure as a workflow error; connector_params as Google
documents them (https://cloud.google.com/workflows/docs/reference/googleapis). Cancelling a running hook is
tested through the emulator in test/workflows/cancel.test.ts."""
import contextlib
import io
import os
import sys
import tempfile
import unittest

import yaml
from support import returning, run
from wfemu_lib import connectors
from wfemu_lib.limits import ResourceLimitExceeded

JOB = "googleapis.run.v2.projects.locations.jobs.run"
PUBLISH = "googleapis.pubsub.v1.projects.topics.publish"
GET = "googleapis.storage.v1.objects.get"

# Each hook is a Python one-liner: it reads the call on stdin.
ECHO = "import json,os,sys; c=json.load(sys.stdin); print(json.dumps({'got': c, 'exec': os.environ.get('GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID'), 'connector': os.environ['WFEMU_CONNECTOR']}))"
FAIL = "import json; print(json.dumps({'message': 'no such bucket', 'code': 404, 'tags': ['HttpError']})); raise SystemExit(1)"
CRASH = "import sys; sys.stderr.write('oops'); raise SystemExit(3)"
NOT_JSON = "print('hello')"
SLOW = "import time; time.sleep(30)"
# Reads its input only after the emulator's first 0.1 s wait for it is over, as a hook started on a busy machine does.
LATE_READER = "import json,sys,time; time.sleep(0.5); c=json.load(sys.stdin); print(json.dumps({'size': len(c['args']['blob'])}))"
PATCH = "googleapis.storage.v1.objects.patch"


def calling(name, args, catch=True):
    step = {"call": name, "args": args, "result": "r"}
    if not catch:
        return returning(("c", step), ("done", {"return": "${r}"}))
    return returning(("c", {"try": step, "except": {"as": "e", "steps": [{"caught": {"return": {"error": "${e}"}}}]}}),
                     ("done", {"return": "${r}"}))


class Hooks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        hooks = {JOB: {"command": [sys.executable, "-c", ECHO], "waits": True},
                 PUBLISH: [sys.executable, "-c", FAIL],
                 GET: {"command": [sys.executable, "-c", CRASH]},
                 "googleapis.storage.v1.objects.list": {"command": [sys.executable, "-c", NOT_JSON]},
                 "googleapis.storage.v1.objects.delete": {"command": [sys.executable, "-c", SLOW], "timeout": 0.5},
                 "googleapis.storage.v1.objects.insert": "echo",  # a string: run by /bin/sh
                 PATCH: {"command": [sys.executable, "-c", LATE_READER], "timeout": 10},
                 }
        path = os.path.join(cls.dir.name, "hooks.yaml")
        with open(path, "w") as f:
            yaml.safe_dump({"hooks": hooks}, f)
        connectors.load_hooks(path)

    @classmethod
    def tearDownClass(cls):
        connectors._HOOKS.clear()
        cls.dir.cleanup()

    def test_a_hook_gets_the_connector_and_its_args_on_stdin_and_the_executions_variables(self):
        r = run(calling(JOB, {"name": "projects/p/locations/l/jobs/j"}, catch=False),
                env={"GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID": "e1"})
        self.assertEqual(r.result, {"got": {"connector": JOB, "args": {"name": "projects/p/locations/l/jobs/j"}},
                                    "exec": "e1", "connector": JOB})

    def test_a_hook_that_reads_late_gets_all_of_an_input_larger_than_a_pipe_holds(self):
        r = run(calling(PATCH, {"blob": "x" * (1 << 20)}, catch=False))
        self.assertEqual(r.result, {"size": 1 << 20})

    def test_a_string_command_runs_in_a_shell_and_empty_stdout_is_null(self):
        r = run(calling("googleapis.storage.v1.objects.insert", {"bucket": "b"}, catch=False))
        self.assertIsNone(r.error)

    def test_a_failing_hooks_JSON_stdout_is_the_error_with_its_code_and_tags(self):
        r = run(calling(PUBLISH, {"topic": "t"}))
        self.assertEqual((r.result["error"]["message"], r.result["error"]["code"], r.result["error"]["tags"]),
                         ("no such bucket", 404, ["HttpError"]))

    def test_a_hook_that_exits_without_JSON_is_a_SystemError_quoting_its_stderr(self):
        with contextlib.redirect_stderr(io.StringIO()) as passed_on:
            r = run(calling(GET, {"bucket": "b", "object": "o"}))
        self.assertEqual(passed_on.getvalue(), "oops")  # a hook's stderr goes on to the emulator's
        self.assertEqual(r.result["error"]["tags"], ["SystemError"])
        self.assertIn("exited 3: oops", r.result["error"]["message"])

    def test_a_hook_whose_stdout_is_not_JSON_is_a_ResponseTypeError(self):
        r = run(calling("googleapis.storage.v1.objects.list", {"bucket": "b"}))
        self.assertEqual(r.result["error"]["tags"], ["ResponseTypeError"])

    def test_a_hook_past_its_timeout_is_killed_and_raises_TimeoutError(self):
        r = run(calling("googleapis.storage.v1.objects.delete", {"bucket": "b", "object": "o"}))
        self.assertEqual(r.result["error"]["tags"], ["TimeoutError"])

    def test_a_connector_without_a_hook_is_a_SystemError(self):
        r = run(calling("googleapis.bigquery.v2.jobs.insert", {"projectId": "p"}))
        self.assertEqual(r.result["error"]["tags"], ["SystemError"])

    def test_a_waiting_hook_costs_its_polls_as_steps_unless_it_skips_polling(self):
        waited = run(calling(JOB, {"name": "j"}, catch=False)).steps.steps
        skipped = run(calling(JOB, {"name": "j", "connector_params": {"skip_polling": True}}, catch=False)).steps.steps
        self.assertEqual(waited - skipped, 1)  # an operation done at once: one poll

    def test_polls_past_the_step_limit_fail_the_execution(self):
        r = run(calling(JOB, {"name": "j"}), step_limit=2)  # the try and the call: the poll is one too many
        self.assertIsInstance(r.error, ResourceLimitExceeded)


class ConnectorParams(unittest.TestCase):
    """Only what Google documents: timeout (seconds, at most a year), polling_policy {initial_delay,
    multiplier, max_delay}, skip_polling (boolean), scopes."""

    def tags(self, params):
        try:
            connectors._check_connector_params(JOB, params)
        except Exception as err:  # noqa: BLE001
            return err.payload.to_dict()["tags"] if hasattr(err.payload, "to_dict") else err.payload["tags"]
        return None

    def test_the_documented_fields_pass(self):
        self.assertIsNone(self.tags({"timeout": 31536000, "polling_policy": {"initial_delay": 1, "multiplier": 2,
                                                                                 "max_delay": 10},
                                     "skip_polling": False, "scopes": ["x"]}))
        self.assertIsNone(self.tags(None))

    def test_a_timeout_past_a_year_or_not_a_number_is_a_ValueError(self):
        self.assertEqual([self.tags({"timeout": 31536001}), self.tags({"timeout": "60"}), self.tags({"timeout": True})],
                         [["ValueError"]] * 3)

    def test_an_unknown_polling_policy_field_is_a_ValueError(self):
        self.assertEqual(self.tags({"polling_policy": {"every": 5}}), ["ValueError"])

    def test_skip_polling_must_be_a_boolean(self):
        self.assertEqual(self.tags({"skip_polling": "yes"}), ["TypeError"])

    def test_connector_params_that_are_not_a_map_are_a_ValueError(self):
        self.assertEqual(self.tags(["timeout"]), ["ValueError"])


if __name__ == "__main__":
    unittest.main()
