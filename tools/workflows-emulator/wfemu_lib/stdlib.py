"""The standard library as Google documents it: the package's gaps filled and its functions made strict, and
expressions rendered with Google's semantics. patches.py installs these."""
from __future__ import annotations

import json
import logging
import types as _types
import urllib.parse as _up

from workflows_emulator import render as wf_render
from workflows_emulator.lib import json_utils as _json_utils
from workflows_emulator.lib import sys_utils, text_utils

from .runtime import _clock_now, _delay
from .values import _plain

# text.url_encode leaves letters, digits and .-_ alone (https://cloud.google.com/workflows/docs/reference/stdlib/text/url_encode).
def url_encode(source):
    return _up.quote(source, safe="-_.")


def url_encode_plus(source):
    return _up.quote_plus(source, safe="-_.~")


def url_decode(source):
    return _up.unquote_plus(source)


# GCW's json.encode / encode_to_string do not indent unless asked; the package indented by default.
_json_encode = _json_utils.encode


def json_encode(data, indent=False):
    return _json_encode(data, indent)


def json_encode_to_string(data, indent=False):
    return _json_encode(data, indent).decode()


def _get_type(value):
    """get_type that also names the package's dict/list subclasses (variables are stored as those)."""
    for py, name in ((bool, "bool"), (bytes, "bytes"), (float, "double"), (int, "int"), (str, "string"),
                     (dict, "map"), (list, "list")):
        if isinstance(value, py):
            return name
    if value is None:
        return "null"
    raise ValueError(f"unknown type {type(value)}")



def _expressions(value: str):
    """(start, end, code) of each ${...}, braces balanced and string literals respected (the package's
    regex stopped at the first '}', so map literals and "}" in strings broke)."""
    i = 0
    while (i := value.find("${", i)) >= 0:
        depth, j, quote = 1, i + 2, None
        while j < len(value) and depth:
            c = value[j]
            if quote:
                if c == "\\":
                    j += 1
                elif c == quote:
                    quote = None
            elif c in "\"'":
                quote = c
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            j += 1
        if depth:
            raise SyntaxError(f"unterminated expression in {value!r}")
        yield i, j, value[i + 2:j - 1]
        i = j


def _render_str(value, context):
    """GCW semantics: a value that is one whole expression keeps the expression's type (null stays null;
    the package turned it into the string "None" by re-parsing str() as YAML)."""
    if not isinstance(value, str) or "${" not in value:
        return value
    parts = list(_expressions(value))
    if len(parts) == 1 and parts[0][0] == 0 and parts[0][1] == len(value):
        return wf_render.run_code(parts[0][2], context)
    out, last = [], 0
    for start, end, code in parts:
        v = wf_render.run_code(code, context)
        out.append(value[last:start])
        out.append(json.dumps(v) if isinstance(v, (list, dict)) or v is None or isinstance(v, bool) else str(v))
        last = end
    out.append(value[last:])
    return "".join(out)


# ---------------------------------------------------------------- strict standard library
# Expressions run as Python, and the package's functions accept whatever Python does (int(5), string("x"),
# len(b"..."), text.substring with negative indexes, text.re / sys.os as "functions"). Google accepts only
# the documented names and argument types, so a workflow that works here could fail in the cloud. Every
# function below checks its arguments against Google's reference and raises TypeError (a catchable error
# tagged TypeError, as Google raises) otherwise; modules expose only documented names, and an unknown name
# fails the execution. References: https://cloud.google.com/workflows/docs/reference/stdlib/overview and
# .../stdlib/expression-helpers (conversion: int() takes a string or double, double() a string or integer,
# string() an integer, double or boolean; keys() a map; len() a list, map or string).
_TYPE_NAMES = {"int": "integer", "double": "double", "string": "string", "bool": "boolean", "bytes": "bytes",
               "list": "list", "map": "map", "null": "null"}


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    for py, name in ((int, "int"), (float, "double"), (str, "string"), (bytes, "bytes"), (dict, "map"), (list, "list")):
        if isinstance(value, py):
            return name
    return type(value).__name__


def _strict(name: str, fn, *allowed, optional: int = 0):
    """fn(*args) after checking each positional/keyword argument's kind against allowed[i] (a set of kinds,
    or None for any). The last `optional` parameters may be omitted."""
    params = list(fn.__code__.co_varnames[: fn.__code__.co_argcount]) if hasattr(fn, "__code__") else []

    def call(*args, **kwargs):
        values = list(args)
        for p in params[len(args):]:
            if p in kwargs:
                values.append(kwargs[p])
        if len(values) < len(allowed) - optional or len(values) > len(allowed) or len(values) != len(args) + len(kwargs):
            raise TypeError(f"{name}: expected {len(allowed) - optional}..{len(allowed)} arguments, got {len(args) + len(kwargs)}")
        for i, (v, kinds) in enumerate(zip(values, allowed)):
            if kinds is not None and _kind(v) not in kinds:
                want = " or ".join(_TYPE_NAMES[k] for k in sorted(kinds))
                raise TypeError(f"{name}: argument {i + 1} must be {want}, got {_TYPE_NAMES.get(_kind(v), _kind(v))}")
        return fn(*args, **kwargs)

    return call


_NUM, _STR = {"int", "double"}, {"string"}


def _substring(source, start, end):
    if start < 0 or end < 0:  # Python would count from the end; Google has no such meaning
        raise ValueError(f"text.substring: negative index ({start}, {end})")
    return source[start:end]


def _map_get(obj, keys):
    for key in [keys] if isinstance(keys, str) else keys:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _sleep(seconds):
    if seconds < 0:
        raise ValueError("sys.sleep: negative duration")
    _delay(seconds)  # like retry backoff: --backoff-scale 0 makes polling loops instant, on the execution's clock


def _namespace(**functions):
    return _types.SimpleNamespace(**functions)


def library(lib: dict) -> dict:
    """The entries of the package's STANDARD_LIBRARY (`lib`) to replace or add; the strict ones wrap the
    package's own functions where those are right."""
    _pkg_text, _pkg_json, _pkg_b64, _pkg_map, _pkg_list, _pkg_time, _pkg_sys, _pkg_math = (
        lib["text"], lib["json"], lib["base64"], lib["map"], lib["list"], lib["time"], lib["sys"], lib["math"])
    return {
        # GCW default(a, b) returns b only when a is null; the package used `a or b` (wrong for 0, "", false).
        "default": lambda value, fallback: fallback if value is None else value,
        "get_type": _get_type,
        # Workflows literals are JSON's; expressions run as Python, so name them.
        "null": None, "true": True, "false": False,
        # expression helpers
        "int": _strict("int", lambda value: int(value), {"string", "double"}),
        "double": _strict("double", lambda value: float(value), {"string", "int"}),
        "string": _strict("string", lambda value: ("true" if value else "false") if isinstance(value, bool) else str(value),
                          {"int", "double", "bool"}),
        # The package's maps list Python context variables among their keys(); keys() must be the map's own.
        "keys": _strict("keys", lambda value: list(dict.keys(value)), {"map"}),
        "len": _strict("len", lambda value: len(value), {"list", "map", "string"}),
        "text": _namespace(
            decode=_strict("text.decode", lambda data, charset="UTF-8": data.decode(charset), {"bytes"}, _STR, optional=1),
            encode=_strict("text.encode", lambda text, charset="UTF-8": text.encode(charset), _STR, _STR, optional=1),
            find_all=_strict("text.find_all", lambda source, substr: [i for i in range(len(source)) if source.startswith(substr, i)],
                             _STR, _STR),
            find_all_regex=_strict("text.find_all_regex", _pkg_text.find_all_regex, _STR, _STR),
            match_regex=_strict("text.match_regex", _pkg_text.match_regex, _STR, _STR),
            replace_all=_strict("text.replace_all", _pkg_text.replace_all, _STR, _STR, _STR),
            replace_all_regex=_strict("text.replace_all_regex", _pkg_text.replace_all_regex, _STR, _STR, _STR),
            split=_strict("text.split", _pkg_text.split, _STR, _STR),
            substring=_strict("text.substring", _substring, _STR, {"int"}, {"int"}),
            to_lower=_strict("text.to_lower", _pkg_text.to_lower, _STR),
            to_upper=_strict("text.to_upper", _pkg_text.to_upper, _STR),
            url_decode=_strict("text.url_decode", lambda source: text_utils.url_decode(source), _STR),
            url_encode=_strict("text.url_encode", lambda source: text_utils.url_encode(source), _STR),
            url_encode_plus=_strict("text.url_encode_plus", lambda source: text_utils.url_encode_plus(source), _STR),
        ),
        "json": _namespace(
            decode=_strict("json.decode", lambda data: _pkg_json.decode(data), {"bytes", "string"}),
            encode=_strict("json.encode", lambda data, indent=False: _pkg_json.encode(data, indent), None, {"bool", "map"}, optional=1),
            encode_to_string=_strict("json.encode_to_string", lambda data, indent=False: _pkg_json.encode_to_string(data, indent),
                                     None, {"bool", "map"}, optional=1),
        ),
        "base64": _namespace(
            decode=_strict("base64.decode", lambda data, padding=True: _pkg_b64.decode(data, padding), _STR, {"bool"}, optional=1),
            encode=_strict("base64.encode", lambda data, padding=True: _pkg_b64.encode(data, padding), {"bytes"}, {"bool"}, optional=1),
        ),
        "map": _namespace(
            # map.get of a non-map, or of a missing key at any depth, is null (map.get reference); only the keys are typed.
            get=_strict("map.get", _map_get, None, {"string", "list"}),
            delete=_strict("map.delete", _pkg_map.delete, {"map"}, _STR),
            merge=_strict("map.merge", _pkg_map.merge, {"map"}, {"map"}),
            merge_nested=_strict("map.merge_nested", _pkg_map.merge_nested, {"map"}, {"map"}),
        ),
        "list": _namespace(
            concat=_strict("list.concat", _pkg_list.concat, {"list"}, None),
            prepend=_strict("list.prepend", _pkg_list.prepend, {"list"}, None),
        ),
        "math": _namespace(
            abs=_strict("math.abs", _pkg_math.abs, _NUM),
            floor=_strict("math.floor", lambda x: int(_pkg_math.floor(x)), _NUM),
            max=_strict("math.max", _pkg_math.max, _NUM, _NUM),
            min=_strict("math.min", _pkg_math.min, _NUM, _NUM),
        ),
        "time": _namespace(
            format=_strict("time.format", lambda seconds, timezone="UTC": _pkg_time.format(seconds, timezone), _NUM, _STR, optional=1),
            parse=_strict("time.parse", _pkg_time.parse, _STR),
        ),
        "sys": _namespace(
            get_env=_strict("sys.get_env", lambda name, default=None: sys_utils.get_env(name, default), _STR, {"string", "null"},
                            optional=1),
            log=lambda *args, **kwargs: _sys_log(*args, **kwargs),
            now=lambda: _clock_now(),
            sleep=_strict("sys.sleep", _sleep, _NUM),
            sleep_until=_strict("sys.sleep_until", _pkg_sys.sleep_until, _STR),
        ),
        "uuid": _namespace(generate=lib["uuid"].generate),
    }


# Python helpers the package added; Google has neither.
REMOVED = ("set", "not")


_JSON = json


def _sys_log(data=None, severity="DEFAULT", text=None, json=None, timeout=None):  # noqa: A002 - Google's names, in its order
    given = [v for v in (text, json, data) if v is not None]
    if len(given) != 1:
        raise TypeError("sys.log: pass exactly one of text, json, data")
    if json is not None and not isinstance(json, dict):
        raise TypeError("sys.log: json must be a map")
    if severity not in ("DEFAULT", "DEBUG", "INFO", "NOTICE", "WARNING", "ERROR", "CRITICAL", "ALERT", "EMERGENCY"):
        raise ValueError(f"sys.log: unknown severity {severity!r}")
    level = {"DEFAULT": "INFO", "NOTICE": "INFO", "ALERT": "CRITICAL", "EMERGENCY": "CRITICAL"}.get(severity, severity)
    message = given[0] if isinstance(given[0], str) else _JSON.dumps(_plain(given[0]))
    logging.getLogger("workflows").log(logging.getLevelName(level), message)
