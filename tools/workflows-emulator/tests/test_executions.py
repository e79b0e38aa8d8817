"""The executions store behind the Executions REST API (executions.py), called directly: what
test/workflows/executions-api.test.ts does not reach through HTTP (ordering, the other filters, the refusals,
create's checks, the backlog's order). References:
https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions/list
and .../ExecutionView."""
import os
import tempfile
import time
import unittest

import support  # noqa: F401  (installs the patches)
from wfemu_lib import executions, settings

PREFIX = "projects/p/locations/l/workflows/w/executions/"


def execution(n, state="SUCCEEDED", created=None, started=True, labels=None):
    created = created or f"2026-01-01T00:00:{n:02d}.000000Z"
    e = {"name": f"{PREFIX}{n:03d}", "createTime": created, "state": state, "argument": "{}", "labels": labels or {},
         "workflowRevisionId": "000001-abc", "result": "1", "callLogLevel": "CALL_LOG_LEVEL_UNSPECIFIED", "status": {}}
    if started:
        e["startTime"] = created
        e["endTime"] = created
        e["duration"] = "0.1s"
    return e


def listing(query):
    return executions.list_executions(PREFIX, {k: [v] for k, v in query.items()})


def names(body):
    return [e["name"].rsplit("/", 1)[1] for e in body["executions"]]


class Store(unittest.TestCase):
    def setUp(self):
        self.saved = dict(executions._EXECUTIONS)
        executions._EXECUTIONS.clear()
        for n in range(1, 6):
            e = execution(n, labels={"batch": "odd" if n % 2 else "even"})
            executions._EXECUTIONS[e["name"]] = e
        queued = execution(6, state="QUEUED", started=False)
        executions._EXECUTIONS[queued["name"]] = queued
        other = execution(7)
        other["name"] = "projects/p/locations/l/workflows/other/executions/007"
        executions._EXECUTIONS[other["name"]] = other

    def tearDown(self):
        executions._EXECUTIONS.clear()
        executions._EXECUTIONS.update(self.saved)


class Views(Store):
    def test_basic_keeps_only_name_times_duration_state_and_revision(self):
        _, body = listing({})
        self.assertEqual(set(body["executions"][1]), {"name", "startTime", "endTime", "duration", "state",
                                                      "workflowRevisionId"})

    def test_the_view_may_be_given_by_number_and_unspecified_is_the_default(self):
        self.assertEqual([executions._view({"view": [v]}, "FULL") for v in ("1", "2", "0", "EXECUTION_VIEW_UNSPECIFIED")],
                         ["BASIC", "FULL", "FULL", "FULL"])

    def test_an_unknown_view_is_refused(self):
        self.assertEqual(listing({"view": "SOME"})[0], 400)

    def test_only_the_workflows_own_executions_are_listed(self):
        self.assertNotIn("007", names(listing({})[1]))


class Order(Store):
    def test_newest_created_first_by_default(self):
        self.assertEqual(names(listing({})[1]), ["006", "005", "004", "003", "002", "001"])

    def test_ascending_on_request(self):
        self.assertEqual(names(listing({"orderBy": "createTime asc"})[1]), ["001", "002", "003", "004", "005", "006"])

    def test_an_execution_without_the_field_sorts_last_in_either_direction(self):
        self.assertEqual(names(listing({"orderBy": "startTime"})[1])[-1], "006")
        self.assertEqual(names(listing({"orderBy": "startTime asc"})[1])[-1], "006")

    def test_another_field_is_refused(self):
        self.assertEqual(listing({"orderBy": "name"})[0], 400)


class Filter(Store):
    def test_labels_and_state_terms_joined_by_AND(self):
        self.assertEqual(names(listing({"filter": 'labels.batch="odd" AND state="SUCCEEDED"'})[1]), ["005", "003", "001"])

    def test_time_comparisons(self):
        self.assertEqual(names(listing({"filter": 'createTime>"2026-01-01T00:00:04Z"'})[1]), ["006", "005"])
        self.assertEqual(names(listing({"filter": 'createTime<="2026-01-01T00:00:02Z"'})[1]), ["002", "001"])

    def test_an_execution_without_a_startTime_matches_no_comparison_on_it(self):
        self.assertNotIn("006", names(listing({"filter": 'startTime>"2000-01-01T00:00:00Z"'})[1]))

    def test_any_other_term_is_refused(self):
        for term in ('name="x"', 'labels.batch!="odd"', 'state="SUCCEEDED" OR state="FAILED"'):
            self.assertEqual(listing({"filter": term})[0], 400, term)


class Pages(Store):
    def test_the_last_page_has_no_token_and_tokens_lead_on_from_where_the_page_ended(self):
        _, first = listing({"pageSize": "4"})
        _, second = listing({"pageSize": "4", "pageToken": first["nextPageToken"]})
        self.assertEqual((names(first), names(second)), (["006", "005", "004", "003"], ["002", "001"]))
        self.assertNotIn("nextPageToken", second)

    def test_executions_created_meanwhile_shift_no_page(self):
        _, first = listing({"pageSize": "2"})
        newer = execution(9)
        executions._EXECUTIONS[newer["name"]] = newer
        _, second = listing({"pageSize": "2", "pageToken": first["nextPageToken"]})
        self.assertEqual(names(second), ["004", "003"])

    def test_a_negative_page_size_and_a_broken_token_are_refused(self):
        self.assertEqual([listing({"pageSize": "-1"})[0], listing({"pageToken": "zz"})[0]], [400, 400])


class Create(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        with open(os.path.join(self.dir.name, "echo.yaml"), "w") as f:
            f.write("main:\n  params: [a]\n  steps:\n    - done:\n        return: ${a}\n")
        self.saved = settings.WORKFLOWS_DIR, settings.MAX_ACTIVE
        settings.WORKFLOWS_DIR = self.dir.name

    def tearDown(self):
        settings.WORKFLOWS_DIR, settings.MAX_ACTIVE = self.saved
        self.dir.cleanup()

    def create(self, body, wid="echo"):
        return executions.create_execution("p", "l", wid, body)

    def wait(self, name, states=("SUCCEEDED", "FAILED", "CANCELLED")):
        for _ in range(600):
            with executions._LOCK:
                e = dict(executions._EXECUTIONS[name])
            if e["state"] in states:
                return e
            time.sleep(0.05)
        raise AssertionError(f"{name} is still {e['state']}")

    def test_an_execution_runs_with_its_argument_and_ends_SUCCEEDED_with_its_result(self):
        code, e = self.create({"argument": '{"x": 1}'})
        self.assertEqual((code, e["state"]), (200, "ACTIVE"))
        done = self.wait(e["name"])
        self.assertEqual((done["state"], done["result"]), ("SUCCEEDED", '{"x": 1}'))

    def test_an_unknown_workflow_is_404(self):
        self.assertEqual(self.create({}, wid="nope")[0], 404)

    def test_labels_outside_googles_rules_are_refused(self):
        for labels in ({"Upper": "x"}, {"k": "UPPER"}, {"k" * 64: "x"}, {f"k{i}": "v" for i in range(65)}):
            self.assertEqual(self.create({"labels": labels})[0], 400, labels)

    def test_an_argument_over_32_KiB_or_not_JSON_is_refused(self):
        self.assertEqual([self.create({"argument": '"' + "x" * 32 * 1024 + '"'})[0], self.create({"argument": "{"})[0]],
                         [400, 400])

    def test_beyond_the_quota_executions_wait_QUEUED_without_a_startTime_and_begin_in_creation_order(self):
        settings.MAX_ACTIVE = 1
        holder = execution(1, state="ACTIVE")  # takes the one slot (no thread runs it)
        holder["name"] = "projects/p/locations/l/workflows/hold/executions/001"
        with executions._LOCK:
            executions._EXECUTIONS[holder["name"]] = holder
        _, first = self.create({"argument": "1"})
        _, second = self.create({"argument": "2"})
        self.assertEqual([first["state"], second["state"]], ["QUEUED", "QUEUED"])
        self.assertNotIn("startTime", first)
        with executions._LOCK:  # the holder ends, as _run ends an execution
            holder["state"] = "SUCCEEDED"
            executions._admit_next_locked()
            self.assertEqual(executions._EXECUTIONS[second["name"]]["state"], "QUEUED")
        self.assertIn("startTime", self.wait(first["name"]))
        self.assertEqual(self.wait(second["name"])["result"], "2")
        del executions._EXECUTIONS[holder["name"]]

    def test_each_execution_counts_its_own_steps(self):
        _, e = self.create({"argument": "1"})
        self.wait(e["name"])
        self.assertEqual(executions._STEP_COUNTERS[e["name"]].steps, 1)


if __name__ == "__main__":
    unittest.main()
