"""The standard library and expressions as Google documents them, where the package differs
(https://cloud.google.com/workflows/docs/reference/stdlib/overview). Argument types, unknown names and switch
are tested through the emulator in test/workflows/strict-stdlib.test.ts; these are the other replacements."""
import json
import unittest

from support import returning, run, tags_of, value_of
from wfemu_lib import settings
from wfemu_lib.stdlib import _render_str
from workflows_emulator import render as wf_render


class Expressions(unittest.TestCase):
    def test_a_value_that_is_one_whole_expression_keeps_its_type_null_included(self):
        self.assertEqual([value_of("null"), value_of("1 + 1"), value_of("[1, 2]")], [None, 2, [1, 2]])

    def test_expressions_inside_text_are_joined_as_text_maps_lists_and_null_as_JSON(self):
        self.assertEqual(value_of('"a" + string(1)'), "a1")
        r = run(returning(("init", {"assign": [{"m": {"k": None}}]}), ("done", {"return": "m=${m} n=${null} b=${true}"})))
        self.assertEqual(r.result, 'm={"k": null} n=null b=true')

    def test_a_map_literal_and_a_closing_brace_in_a_string_stay_inside_their_expression(self):
        self.assertEqual(value_of('{"a": {"b": "}"}}'), {"a": {"b": "}"}})
        self.assertEqual(value_of('"{" + "}"'), "{}")

    def test_an_unterminated_expression_is_an_error(self):
        with self.assertRaisesRegex(SyntaxError, "unterminated expression"):
            _render_str("a ${1 + ", {})

    def test_a_brace_inside_a_string_literal_does_not_end_the_expression(self):
        self.assertEqual(value_of('"${" + "x}"'), "${x}")


class Helpers(unittest.TestCase):
    def test_default_returns_the_fallback_only_for_null(self):
        self.assertEqual([value_of("default(0, 1)"), value_of('default("", "x")'), value_of("default(false, true)"),
                          value_of("default(null, 7)")], [0, "", False, 7])

    def test_keys_are_the_maps_own_keys(self):
        self.assertEqual(value_of("keys(m)", m={"a": 1, "b": 2}), ["a", "b"])

    def test_get_type_names_variables_stored_as_the_packages_map_and_list(self):
        self.assertEqual([value_of("get_type(m)", m={"a": 1}), value_of("get_type(l)", l=[1]), value_of("get_type(1.5)"),
                          value_of("get_type(null)"), value_of("get_type(true)")], ["map", "list", "double", "null", "bool"])

    def test_python_helpers_google_has_not_are_gone(self):
        for name in ("set", "not"):
            self.assertNotIn(name, wf_render.STANDARD_LIBRARY)

    def test_true_false_and_null_are_names(self):
        self.assertEqual([value_of("true"), value_of("false")], [True, False])


class Text(unittest.TestCase):
    def test_url_encode_leaves_only_letters_digits_and_dot_dash_underscore(self):
        self.assertEqual(value_of('text.url_encode("a b/c~d-e_f.g?")'), "a%20b%2Fc~d-e_f.g%3F")

    def test_url_encode_plus_writes_spaces_as_plus(self):
        self.assertEqual(value_of('text.url_encode_plus("a b/c")'), "a+b%2Fc")

    def test_url_decode_reads_both(self):
        self.assertEqual(value_of('text.url_decode("a+b%20c")'), "a b c")


class Json(unittest.TestCase):
    def test_json_encode_to_string_does_not_indent_unless_asked(self):
        text = value_of('json.encode_to_string({"a": [1, 2]})')
        self.assertNotIn("\n", text)
        self.assertEqual(json.loads(text), {"a": [1, 2]})

    def test_json_encode_gives_bytes(self):
        self.assertEqual(json.loads(value_of('json.encode({"a": 1})')), {"a": 1})


class Sys(unittest.TestCase):
    def test_get_env_reads_the_executions_own_variables_then_the_user_env_then_the_default(self):
        from wfemu_lib.runtime import _USER_ENV

        _USER_ENV["SETTING"] = "user"
        try:
            r = run(returning(("done", {"return": '${[sys.get_env("GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID"), '
                                                   'sys.get_env("SETTING"), sys.get_env("NONE", "fallback")]}'})),
                    env={"GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID": "e1"})
        finally:
            del _USER_ENV["SETTING"]
        self.assertEqual(r.result, ["e1", "user", "fallback"])

    def test_sleep_with_the_fast_clock_moves_sys_now_on_by_the_whole_delay(self):
        settings.FAST_CLOCK = True
        try:
            r = run(returning(("t0", {"assign": [{"t0": "${sys.now()}"}]}),
                              ("nap", {"call": "sys.sleep", "args": {"seconds": 3600}}),
                              ("done", {"return": "${sys.now() - t0}"})))
        finally:
            settings.FAST_CLOCK = False
        self.assertGreaterEqual(r.result, 3600)
        self.assertLess(r.result, 3660)

    def test_sleep_without_the_fast_clock_leaves_the_clock_alone(self):
        r = run(returning(("nap", {"call": "sys.sleep", "args": {"seconds": 3600}}), ("done", {"return": 1})))
        self.assertEqual((r.result, r.skipped), (1, 0))

    def test_a_negative_sleep_is_a_ValueError(self):
        r = run(returning(("nap", {"try": {"call": "sys.sleep", "args": {"seconds": -1}},
                                   "except": {"as": "e", "steps": [{"c": {"return": "${e.tags}"}}]}})))
        self.assertEqual(r.result, ["ValueError"])

    def test_log_takes_exactly_one_of_text_json_data(self):
        r = run(returning(("l", {"try": {"call": "sys.log", "args": {"text": "a", "json": {"b": 1}}},
                                 "except": {"as": "e", "steps": [{"c": {"return": "${e.tags}"}}]}})))
        self.assertEqual(r.result, ["TypeError"])

    def test_log_refuses_an_unknown_severity(self):
        r = run(returning(("l", {"try": {"call": "sys.log", "args": {"text": "a", "severity": "LOUD"}},
                                 "except": {"as": "e", "steps": [{"c": {"return": "${e.tags}"}}]}})))
        self.assertEqual(r.result, ["ValueError"])


class Substring(unittest.TestCase):
    def test_negative_indexes_are_an_error_not_counted_from_the_end(self):
        r = run(returning(("s", {"try": {"return": '${text.substring("abc", -2, 3)}'},
                                 "except": {"as": "e", "steps": [{"c": {"return": "${e.tags}"}}]}})))
        self.assertEqual(r.result, ["ValueError"], tags_of(r.error) if r.error else None)


if __name__ == "__main__":
    unittest.main()
