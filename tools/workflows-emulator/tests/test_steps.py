"""Execution semantics the package gets wrong or leaves out (steps.py): retry backoff, parallel branches'
scopes and shared variables, switch conditions, assign errors. The first-true switch rule is tested through
the emulator in test/workflows/strict-stdlib.test.ts, cancellation in test/workflows/cancel.test.ts."""
import threading
import unittest

from support import returning, run
from wfemu_lib import settings
from workflows_emulator import main as wf

FAILING = {"raise": {"message": "boom", "tags": ["ConnectionError"]}}


def retrying(max_retries, backoff, predicate=None):
    retry = {"max_retries": max_retries, "backoff": backoff}
    if predicate:
        retry["predicate"] = predicate
    return {
        "main": {"steps": [
            {"init": {"assign": [{"n": 0}, {"t0": "${sys.now()}"}]}},
            {"go": {"try": {"steps": [{"count": {"assign": [{"n": "${n + 1}"}]}}, {"fail": FAILING}]},
                    "retry": retry, "except": {"as": "e", "steps": [{"gave_up": {"return": {"tries": "${n}",
                                                                                           "waited": "${sys.now() - t0}"}}}]}}},
        ]},
        "never": {"params": ["e"], "steps": [{"no": {"return": False}}]},
    }


class Retry(unittest.TestCase):
    def setUp(self):
        settings.FAST_CLOCK = True  # the execution's clock shows the delays the retries waited (for none of it)

    def tearDown(self):
        settings.FAST_CLOCK = False

    def test_retries_wait_initial_delay_then_multiplier_times_longer_each(self):
        r = run(retrying(3, {"initial_delay": 1, "max_delay": 100, "multiplier": 2}))
        self.assertEqual(r.result["tries"], 4)
        self.assertGreaterEqual(r.result["waited"], 1 + 2 + 4)
        self.assertLess(r.result["waited"], 1 + 2 + 4 + 5)

    def test_no_retry_waits_longer_than_max_delay(self):
        r = run(retrying(4, {"initial_delay": 10, "max_delay": 15, "multiplier": 3}))
        self.assertGreaterEqual(r.result["waited"], 10 + 15 + 15 + 15)
        self.assertLess(r.result["waited"], 10 + 15 + 15 + 15 + 5)

    def test_a_predicate_that_refuses_ends_the_retries_at_once(self):
        r = run(retrying(5, {"initial_delay": 1, "max_delay": 1, "multiplier": 1}, predicate="${never}"))
        self.assertEqual(r.result["tries"], 1)

    def test_every_attempt_counts_its_steps_again(self):
        once = run(retrying(0, {"initial_delay": 1, "max_delay": 1, "multiplier": 1})).steps.steps
        thrice = run(retrying(2, {"initial_delay": 1, "max_delay": 1, "multiplier": 1})).steps.steps
        self.assertEqual(thrice - once, 2 * 3)  # each further attempt: the try's steps block, count, fail


class Parallel(unittest.TestCase):
    def test_shared_maps_merge_each_branchs_keys_back(self):
        r = run(returning(
            ("init", {"assign": [{"m": {}}]}),
            ("fan", {"parallel": {"shared": ["m"], "for": {"value": "k", "in": ["a", "b", "c"], "steps": [
                {"put": {"assign": [{"m[k]": "${k + k}"}]}}]}}}),
            ("done", {"return": "${m}"}),
        ))
        self.assertEqual(r.result, {"a": "aa", "b": "bb", "c": "cc"})

    def test_shared_lists_merge_each_branchs_changed_indexes_back(self):
        r = run(returning(
            ("init", {"assign": [{"l": [0, 0, 0]}]}),
            ("fan", {"parallel": {"shared": ["l"], "for": {"value": "i", "range": [0, 2], "steps": [
                {"put": {"assign": [{"l[i]": "${i + 10}"}]}}]}}}),
            ("done", {"return": "${l}"}),
        ))
        self.assertEqual(r.result, [10, 11, 12])

    def test_a_branchs_variables_that_are_not_shared_stay_in_the_branch(self):
        r = run(returning(
            ("init", {"assign": [{"x": 1}]}),
            ("fan", {"parallel": {"branches": [{"b1": {"steps": [{"set": {"assign": [{"x": 2}]}}]}}]}}),
            ("done", {"return": "${x}"}),
        ))
        self.assertEqual(r.result, 1)

    def test_concurrency_limit_may_be_an_expression(self):
        r = run(returning(
            ("init", {"assign": [{"m": {}}, {"limit": 2}]}),
            ("fan", {"parallel": {"shared": ["m"], "concurrency_limit": "${limit}", "for": {
                "value": "k", "in": ["a", "b", "c"], "steps": [{"put": {"assign": [{"m[k]": 1}]}}]}}}),
            ("done", {"return": "${len(keys(m))}"}),
        ))
        self.assertEqual((r.error, r.result), (None, 3))

    def test_after_the_parallel_step_the_clock_is_the_latest_branchs(self):
        settings.FAST_CLOCK = True
        try:
            r = run(returning(
                ("t0", {"assign": [{"t0": "${sys.now()}"}]}),
                ("fan", {"parallel": {"for": {"value": "s", "in": [10, 500, 20], "steps": [
                    {"nap": {"call": "sys.sleep", "args": {"seconds": "${s}"}}}]}}}),
                ("done", {"return": "${sys.now() - t0}"}),
            ))
        finally:
            settings.FAST_CLOCK = False
        self.assertGreaterEqual(r.result, 500)
        self.assertLess(r.result, 530)

    def test_a_failing_branch_fails_the_parallel_step_with_its_error(self):
        r = run(returning(
            ("fan", {"try": {"parallel": {"branches": [{"ok": {"steps": [{"a": {"assign": [{"x": 1}]}}]}},
                                                       {"bad": {"steps": [{"f": FAILING}]}}]}},
                     "except": {"as": "e", "steps": [{"c": {"return": "${e}"}}]}}),
        ))
        self.assertIn("boom", str(r.result))


class Switch(unittest.TestCase):
    def test_a_condition_that_is_not_a_boolean_is_a_TypeError(self):
        r = run(returning(("pick", {"try": {"switch": [{"condition": "${1}", "return": "one"}]},
                                    "except": {"as": "e", "steps": [{"c": {"return": "${e.tags}"}}]}})))
        self.assertEqual(r.result, ["TypeError"])

    def test_with_no_true_condition_it_goes_on_to_the_next_step(self):
        r = run(returning(("pick", {"switch": [{"condition": "${false}", "return": "no"}]}), ("done", {"return": "next"})))
        self.assertEqual(r.result, "next")


class Assign(unittest.TestCase):
    def test_an_expression_error_in_an_assign_releases_the_packages_lock(self):
        r = run(returning(("bad", {"try": {"assign": [{"x": "${int(5)}"}]},  # int() of an integer: TypeError
                                   "except": {"as": "e", "steps": [{"c": {"return": "${e.tags}"}}]}})))
        self.assertEqual(r.result, ["TypeError"])
        self.assertTrue(wf.LOCK.acquire(blocking=False), "the assign lock is still held")
        wf.LOCK.release()

    def test_after_an_assign_failed_another_executions_assigns_still_run(self):
        run(returning(("bad", {"assign": [{"x": "${int(5)}"}]})))
        done = threading.Event()
        threading.Thread(target=lambda: (run(returning(("ok", {"assign": [{"y": 1}]}))), done.set()), daemon=True).start()
        self.assertTrue(done.wait(30), "a later assign hung")


if __name__ == "__main__":
    unittest.main()
