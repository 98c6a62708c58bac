#!/usr/bin/env python3
"""Renders every chat template of ../shared/testdata/chat-templates with Python
jinja2, set up the way Hugging Face transformers sets it up for
apply_chat_template, over a fixed set of conversations, and stores the
expected outputs (or error messages) under tests/data/chat/.

  python3 tools/make_chat_fixtures.py            # rewrite the fixtures
  python3 tools/make_chat_fixtures.py --check    # compare with the stored ones
  python3 tools/make_chat_fixtures.py --unicode-tables   # rewrite src/chat/pystr_tables.inc

The Unicode tables are Python's own str classification and case mapping
(isalpha/isdigit/.../isprintable, upper/lower/title with their special
cases), so quern's str methods give the bytes Python's do.

Files written:
  tests/data/chat/conversations.json   the cases: messages, tools,
                                       add_generation_prompt, extra kwargs
  tests/data/chat/expected/NAME.json   per template: {"template": file,
                                       "kwargs": extra variables for every render,
                                       "results": {case: {"output": text} |
                                       {"error": message, "kind": class}}}

The C++ test tests/unit/chat_templates_test.cpp renders the same cases with
quern's engine and compares bytes.

Hugging Face's environment (transformers/utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, loopcontrols]); a tojson filter that is
json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=); globals
raise_exception(msg) (raises TemplateError(msg)) and strftime_now(fmt). Here
strftime_now uses the fixed time FIXED_NOW so outputs are reproducible (the
C++ test passes the same time). The render call is
template.render(messages=..., tools=tools or None, documents=None,
add_generation_prompt=..., bos_token=..., eos_token=..., **kwargs).
Requires jinja2 (tested with 3.1.6).
"""
import argparse
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATES = os.path.join(ROOT, "..", "shared", "testdata", "chat-templates")
OUT = os.path.join(ROOT, "tests", "data", "chat")
FIXED_NOW = datetime.datetime(2025, 3, 14, 9, 26, 53)
BOS = "<s>"
EOS = "</s>"


class GenerationBlock(Extension):
    """{% generation %}...{% endgeneration %}: renders its body (as HF does
    when no assistant mask is requested)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_render", [])
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    # the names Python prints for these functions, as in transformers
    raise_exception.__qualname__ = "_compile_jinja_template.<locals>.raise_exception"
    strftime_now.__qualname__ = "_compile_jinja_template.<locals>.strftime_now"
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


# ----------------------------------------------------------------- conversations
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. \"Paris\"."},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit."},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"type": "string", "description": "IANA zone name"},
                           "precise": {"type": "boolean", "description": "Include seconds."},
                           "digits": {"type": "integer", "description": "Digits of the year."}},
            "required": ["tz"],
        },
    },
}
TOOLS = [WEATHER_TOOL, TIME_TOOL]

SYS = {"role": "system", "content": "You are a helpful assistant."}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def cases():
    c = []

    def add(name, messages, agp, tools=None, **kwargs):
        c.append({"name": name, "messages": messages, "add_generation_prompt": agp, "tools": tools,
                  "kwargs": kwargs})

    add("user", [user("Hello!")], False)
    add("user_gen", [user("Hello!")], True)
    add("system_user", [SYS, user("What is 2 + 2?")], False)
    add("system_user_gen", [SYS, user("What is 2 + 2?")], True)
    add("multi_turn", [SYS, user("Hi, who are you?"), assistant("I am an assistant."),
                       user("What can you do?")], True)
    add("multi_turn_no_system", [user("Name a color."), assistant("Blue."), user("Another one."),
                                 assistant("Green.")], False)
    add("multi_turn_end_assistant_gen", [user("Name a color."), assistant("Blue.")], True)
    add("tools_available", [SYS, user("What's the weather in Paris?")], True, tools=TOOLS)
    tool_turn = [
        user("What's the weather in Paris?"),
        {"role": "assistant", "content": "",
         "tool_calls": [call("a1b2c3d4e", "get_weather", {"city": "Paris", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather",
         "content": "{\"temperature\": 18, \"sky\": \"cloudy\"}"},
    ]
    add("tool_call", tool_turn, True, tools=TOOLS)
    add("tool_call_system", [SYS] + tool_turn + [assistant("It is 18 °C and cloudy in Paris."),
                                                 user("Thanks!")], True, tools=TOOLS)
    add("tool_call_parallel", [
        user("Weather in Oslo and the time in Tokyo?"),
        {"role": "assistant", "content": None,
         "tool_calls": [call("f5g6h7i8j", "get_weather", {"city": "Oslo"}),
                        call("k9l0m1n2o", "get_time", {"tz": "Asia/Tokyo", "precise": True, "digits": 2})]},
        {"role": "tool", "tool_call_id": "f5g6h7i8j", "name": "get_weather", "content": "-3 C, snow"},
        {"role": "tool", "tool_call_id": "k9l0m1n2o", "name": "get_time", "content": "21:04"},
        assistant("Oslo: -3 °C with snow. Tokyo: 21:04."),
    ], False, tools=TOOLS)
    add("tool_call_parallel_text", [
        user("Weather in Oslo and the time in Tokyo?"),
        {"role": "assistant", "content": "Let me check both.",
         "tool_calls": [call("f5g6h7i8j", "get_weather", {"city": "Oslo"}),
                        call("k9l0m1n2o", "get_time", {"tz": "Asia/Tokyo", "precise": True, "digits": 2})]},
        {"role": "tool", "tool_call_id": "f5g6h7i8j", "name": "get_weather", "content": "-3 C, snow"},
        {"role": "tool", "tool_call_id": "k9l0m1n2o", "name": "get_time", "content": "21:04"},
    ], True, tools=TOOLS)
    add("tool_call_string_args", [
        user("Weather in Rome?"),
        {"role": "assistant", "content": "",
         "tool_calls": [call("p3q4r5s6t", "get_weather", "{\"city\": \"Rome\"}")]},
        {"role": "tool", "tool_call_id": "p3q4r5s6t", "name": "get_weather", "content": "25 C"},
    ], True, tools=TOOLS)
    add("empty_tool_calls", [user("Say hi."), {"role": "assistant", "content": "Hi!", "tool_calls": []},
                             user("Again.")], True)
    add("content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "the sea."}]},
    ], True)
    add("content_parts_assistant", [
        {"role": "user", "content": [{"type": "text", "text": "One word?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Sure."}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
    ], False)
    add("unicode_quotes", [
        {"role": "system", "content": "Réponds en français. «Citations» \"doubles\" et 'simples'."},
        user("Ça va? 日本語 🙂 \\ back\\slash\nnew line\ttab </s> {{ not a tag }} {% raw %}"),
        assistant("Oui — très bien! \u00e9\u0301 \U0001F600"),
        user("  padded with spaces  \n\n"),
    ], True)
    add("reasoning", [
        user("What is 17 * 3?"),
        {"role": "assistant", "content": "51", "reasoning_content": "17 * 3 = 51."},
        user("And 17 * 4?"),
    ], True)
    add("thinking_off", [SYS, user("Quick answer: capital of Italy?")], True, enable_thinking=False)
    add("thinking_on", [user("Think: capital of Spain?")], True, enable_thinking=True)
    add("long_history", [SYS] + [m for i in range(4) for m in (user(f"Question {i}?"), assistant(f"Answer {i}."))]
        + [user("Last question?")], True)
    return c


# Extra variables some templates need on every render (as a caller of
# apply_chat_template would pass them).
TEMPLATE_KWARGS = {
    "fireworks-ai-llama-3-firefunction-v2.jinja": {
        "functions": json.dumps([t["function"] for t in TOOLS], indent=2), "datetime": "2025-03-14"},
}


# ----------------------------------------------------------------- rendering
def render(tmpl, case, extra):
    if isinstance(tmpl, dict):  # the template did not compile
        return tmpl
    try:
        out = tmpl.render(messages=case["messages"], tools=case["tools"], documents=None,
                          add_generation_prompt=case["add_generation_prompt"], bos_token=BOS, eos_token=EOS,
                          **extra, **case["kwargs"])
        return {"output": out}
    except Exception as e:  # noqa: BLE001 - every error kind is a fixture
        return {"error": str(e), "kind": type(e).__name__}


def compile_template(env, source):
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": e.message, "kind": "syntax"}


def write_unicode_tables(path):
    import unicodedata

    def chars():
        for cp in range(0x110000):
            if not 0xD800 <= cp <= 0xDFFF:
                yield cp, chr(cp)

    def ranges(pred):
        out, start = [], None
        for cp in range(0x110001):
            v = cp < 0x110000 and not 0xD800 <= cp <= 0xDFFF and pred(chr(cp))
            if v and start is None:
                start = cp
            elif not v and start is not None:
                out.append((start, cp - 1))
                start = None
        return out

    props = {
        "Alpha": str.isalpha, "Decimal": str.isdecimal, "Digit": str.isdigit, "Numeric": str.isnumeric,
        "Printable": str.isprintable, "Upper": str.isupper, "Lower": str.islower,
        "Titlecase": lambda c: unicodedata.category(c) == "Lt",
        "Cased": lambda c: c.isupper() or c.islower() or unicodedata.category(c) == "Lt",
        "CaseIgnorable": lambda c: unicodedata.category(c) in ("Mn", "Me", "Cf", "Lm", "Sk") or c in "'.:^`\u00b7\u2018\u2019\u2024\u2027",
    }
    lines = ["// Python's str classification and case mapping, generated by",
             "// tools/make_chat_fixtures.py --unicode-tables from Python %s (Unicode %s). Do not edit."
             % (sys.version.split()[0], unicodedata.unidata_version), ""]
    for name, pred in props.items():
        rs = ranges(pred)
        lines.append("static const uint32_t k%sRanges[][2] = {" % name)
        for i in range(0, len(rs), 6):
            lines.append("    " + " ".join("{0x%X, 0x%X}," % r for r in rs[i:i + 6]))
        lines.append("};")
    # Title lists only the characters whose title case differs from their upper case
    for name, fn, same in (("Upper", str.upper, lambda c: c), ("Lower", str.lower, lambda c: c),
                           ("Title", str.title, str.upper)):
        lines.append("static const CaseMap k%sMap[] = {" % name)
        for cp, c in chars():
            m = fn(c)
            if m == same(c):
                continue
            cps = [ord(x) for x in m] + [0] * (3 - len(m))
            lines.append("    {0x%X, {0x%X, 0x%X, 0x%X}}," % (cp, *cps))
        lines.append("};")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("make_chat_fixtures: wrote", os.path.relpath(path, ROOT))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the stored fixtures, write nothing")
    ap.add_argument("--unicode-tables", action="store_true", help="write src/chat/pystr_tables.inc and exit")
    ap.add_argument("--templates", default=TEMPLATES)
    args = ap.parse_args()
    if args.unicode_tables:
        write_unicode_tables(os.path.join(ROOT, "src", "chat", "pystr_tables.inc"))
        return 0
    env = make_env()
    cs = cases()
    files = {os.path.join(OUT, "conversations.json"): json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "now": FIXED_NOW.isoformat(), "cases": cs},
        ensure_ascii=False, indent=1) + "\n"}
    summary = []
    for fn in sorted(os.listdir(args.templates)):
        if not fn.endswith(".jinja"):
            continue
        with open(os.path.join(args.templates, fn), encoding="utf-8") as f:
            source = f.read()
        extra = TEMPLATE_KWARGS.get(fn, {})
        tmpl = compile_template(env, source)
        results = {c["name"]: render(tmpl, c, extra) for c in cs}
        n_err = sum(1 for r in results.values() if "error" in r)
        summary.append(f"{fn}: {len(results) - n_err} rendered, {n_err} errors")
        name = fn[: -len(".jinja")]
        files[os.path.join(OUT, "expected", name + ".json")] = json.dumps(
            {"template": fn, "kwargs": extra, "results": results}, ensure_ascii=False, indent=1) + "\n"
    bad = 0
    for path, text in files.items():
        if args.check:
            try:
                with open(path, encoding="utf-8") as f:
                    same = f.read() == text
            except FileNotFoundError:
                same = False
            if not same:
                print(f"make_chat_fixtures: {os.path.relpath(path, ROOT)} differs from jinja2's output")
                bad += 1
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    if not args.check:
        print("\n".join(summary))
    if args.check:
        print("make_chat_fixtures: " + ("all fixtures match jinja2" if not bad else f"{bad} files differ"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
