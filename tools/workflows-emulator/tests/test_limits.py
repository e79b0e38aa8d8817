"""Google's per-execution limits (https://cloud.google.com/workflows/quotas): at most 100,000 steps, and at most
512 KB of variables; past either the execution fails with a ResourceLimitError no except catches."""
import unittest

from support import returning, run, tags_of
from wfemu_lib.connectors import _polls
from wfemu_lib.limits import MEMORY_LIMIT, ResourceLimitExceeded, StepCounter

LOOP = returning(
    ("init", {"assign": [{"i": 0}]}),
    ("guarded", {
        "try": {"steps": [{"loop": {"assign": [{"i": "${i + 1}"}], "next": "loop"}}]},
        "except": {"as": "e", "steps": [{"caught": {"return": "caught"}}]},
    }),
)


class StepBudget(unittest.TestCase):
    def test_the_step_that_would_pass_the_limit_raises_and_is_not_counted(self):
        counter = StepCounter(3)
        counter.add(2)
        counter.add()
        with self.assertRaises(ResourceLimitExceeded):
            counter.add()
        self.assertEqual(counter.steps, 3)

    def test_a_batch_of_steps_past_the_limit_raises_and_the_count_stops_at_the_limit(self):
        counter = StepCounter(10)
        with self.assertRaises(ResourceLimitExceeded):
            counter.add(11)
        self.assertEqual(counter.steps, 10)

    def test_every_step_entered_counts_each_step_of_a_try_body_included(self):
        r = run(returning(("a", {"assign": [{"x": 1}]}), ("t", {"try": {"steps": [{"b": {"assign": [{"y": 2}]}}]}}),
                          ("done", {"return": "${x + y}"})))
        self.assertEqual(r.result, 3)
        self.assertEqual(r.steps.steps, 5)  # a, t, t's steps block, b, done

    def test_an_execution_past_its_limit_fails_with_ResourceLimitError_that_except_does_not_catch(self):
        r = run(LOOP, step_limit=50)
        self.assertIsInstance(r.error, ResourceLimitExceeded)
        self.assertEqual(tags_of(r.error), ["ResourceLimitError"])
        self.assertEqual(r.steps.steps, 50)

    def test_a_retry_cannot_catch_it_either(self):
        r = run(returning(("go", {
            "try": {"steps": [{"loop": {"assign": [{"i": 1}], "next": "loop"}}]},
            "retry": {"max_retries": 5, "backoff": {"initial_delay": 1, "max_delay": 1, "multiplier": 1}},
        })), step_limit=30)
        self.assertIsInstance(r.error, ResourceLimitExceeded)


class FrameSize(unittest.TestCase):
    def test_a_frame_whose_variables_pass_512_KB_fails_the_execution_beyond_except(self):
        r = run(returning(
            ("init", {"assign": [{"s": "x" * 1024}]}),
            ("guarded", {
                "try": {"steps": [{"grow": {"for": {"value": "i", "range": [1, 10],
                                                    "steps": [{"double": {"assign": [{"s": "${s + s}"}]}}]}}}]},
                "except": {"as": "e", "steps": [{"caught": {"return": "caught"}}]},
            }),
        ))
        self.assertIsInstance(r.error, ResourceLimitExceeded)
        self.assertIn(f"exceeded {MEMORY_LIMIT} bytes", str(r.error))
        self.assertEqual(tags_of(r.error), ["ResourceLimitError"])

    def test_the_largest_frame_is_recorded_in_JSON_bytes(self):
        r = run(returning(("init", {"assign": [{"s": "x" * 1000}]}), ("done", {"return": "${len(s)}"})))
        self.assertEqual(r.result, 1000)
        self.assertGreaterEqual(r.steps.max_bytes, 1000)
        self.assertLess(r.steps.max_bytes, 1100)

    def test_subworkflow_definitions_kept_beside_the_variables_are_not_counted(self):
        counter = StepCounter(10)
        counter.held({"sub": {"steps": [{"s": {"return": "y" * 600_000}}]}, "x": 1})
        self.assertLess(counter.max_bytes, 100)

    def test_exactly_the_limit_is_allowed_one_byte_more_is_not(self):
        counter = StepCounter(10)
        filler = MEMORY_LIMIT - len('{"s": ""}')
        counter.held({"s": "x" * filler})
        self.assertEqual(counter.max_bytes, MEMORY_LIMIT)
        with self.assertRaises(ResourceLimitExceeded):
            counter.held({"s": "x" * (filler + 1)})


class ConnectorPolling(unittest.TestCase):
    """A connector that waits for a long-running operation polls it, each poll a step: by default after 1 s,
    then 1.25 times longer each time, at most 60 s apart (https://cloud.google.com/workflows/docs/connectors)."""

    def test_an_operation_done_at_once_costs_one_poll(self):
        self.assertEqual(_polls(0, {}), 1)

    def test_the_default_policy_polls_at_1_then_2_25_then_3_81_seconds(self):
        self.assertEqual([_polls(s, {}) for s in (1, 2.25, 2.26, 3.8125, 3.82)], [1, 2, 3, 3, 4])

    def test_polls_are_at_most_max_delay_apart(self):
        self.assertEqual(_polls(100, {"initial_delay": 10, "multiplier": 3, "max_delay": 30}), 4)  # at 10, 40, 70, 100 s


if __name__ == "__main__":
    unittest.main()
