#!/usr/bin/env python3
"""Differential test of quern's Jinja engine against Python jinja2.

Generates random templates from a grammar of the constructs chat templates
use (text with whitespace control, output, if/elif/else, for with loop
variables and filters, set, namespace, macros and call blocks, filter blocks,
comments, raw; expressions with every operator, literals, attribute and item
access, slices, filters, tests, str/list/dict methods, tojson, % and format)
over a context of varied values, renders each with jinja2 set up as Hugging
Face does and with `quern template --jsonl`, and compares: the output bytes,
or -- when jinja2 raises -- the exception class and message.

  python3 tests/python/jinja_diff.py --quern build/quern [--n 3000] [--seed 1]

Exit status 0 when everything agrees. Requires jinja2.
"""
import argparse
import copy
import json
import os
import random
import re
import warnings
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import make_chat_fixtures as fx  # noqa: E402  (the HF environment and FIXED_NOW)

CONTEXT = {
    "s": "Hello, World",
    "u": "héllo wörld ñ 日本 🙂",
    "e": "",
    "sp": "  padded\ttext \n",
    "ml": "line one\nline two\n\nline four",
    "q": "it's \"quoted\" \\ back",
    "num": "42",
    "fnum": " 3.75 ",
    "n": 0,
    "i": 42,
    "neg": -7,
    "f": 3.5,
    "f2": 0.1,
    "big": 10 ** 15,
    "t": True,
    "fa": False,
    "none": None,
    "xs": [1, 2, 3],
    "ys": ["b", "a", "C"],
    "ws": ["x y", " pad ", "a\nb", ""],
    "mixed": [1, "a", None, True, 2.5],
    "empty": [],
    "d": {"a": 1, "b": [1, 2], "c": {"x": "y"}, "role": "user", "items": "shadow"},
    "ed": {},
    "msgs": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": " part two"}]},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                 "parameters": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                                "required": ["x"]}}}],
}

NAMES = list(CONTEXT) + ["missing", "loop", "ns", "m", "x", "y", "k", "v", "item", "range", "namespace",
                         "raise_exception", "strftime_now"]
SLICEABLE = ["s", "u", "e", "sp", "ml", "q", "xs", "ys", "ws", "mixed", "empty", "msgs"]
STR_METHODS = [("strip", ["", "' .'"]), ("lstrip", [""]), ("rstrip", ["", "'\\n '"]), ("upper", [""]),
               ("lower", [""]), ("title", [""]), ("capitalize", [""]), ("split", ["", "','", "' ', 1", "'l'"]),
               ("rsplit", ["' ', 1", ""]), ("splitlines", [""]), ("startswith", ["'He'", "('a', 'H')"]),
               ("endswith", ["'d'", "'\\n'"]), ("replace", ["'l', 'L'", "'o', '0', 1"]), ("find", ["'o'", "'zz'"]),
               ("count", ["'l'"]), ("join", ["['a', 'b']", "ys"]), ("format", ["1, 'x'", "i"]), ("center", ["20", "9, '*'"]),
               ("ljust", ["10"]), ("zfill", ["5"]), ("isdigit", [""]), ("isalpha", [""]), ("isspace", [""]),
               ("islower", [""]), ("partition", ["','"]), ("removeprefix", ["'He'"]), ("swapcase", [""])]
DICT_METHODS = [("get", ["'a'", "'zz'", "'zz', 5"]), ("items", [""]), ("keys", [""]), ("values", [""])]
LIST_METHODS = [("index", ["2"]), ("count", ["1"])]
FILTERS = [("length", [None]), ("count", [None]), ("trim", [None, "'.'"]), ("upper", [None]), ("lower", [None]),
           ("title", [None]), ("capitalize", [None]), ("string", [None]), ("list", [None]), ("first", [None]),
           ("last", [None]), ("join", [None, "', '", "'|'"]), ("default", ["'dflt'", "'x', true", "none"]),
           ("d", ["0"]), ("int", [None, "7"]), ("float", [None]), ("abs", [None]), ("round", [None, "1", "0, 'floor'"]),
           ("tojson", [None, "indent=2", "sort_keys=true", "ensure_ascii=true", "separators=(',', ':')", "indent=0"]),
           ("items", [None]), ("dictsort", [None, "reverse=true"]), ("sort", [None, "reverse=true", "attribute='role'"]),
           ("unique", [None]), ("reverse", [None]), ("map", ["'upper'", "attribute='role'", "'string'"]),
           ("select", [None, "'odd'", "'string'"]), ("reject", ["'none'", "'defined'"]),
           ("selectattr", ["'role'", "'role', 'equalto', 'user'", "'content', 'string'"]),
           ("rejectattr", ["'content'", "'role', 'eq', 'tool'"]), ("replace", ["'a', 'b'", "'l', ''"]),
           ("indent", [None, "2", "4, true", "'> ', first=true, blank=true"]), ("center", ["12"]), ("wordcount", [None]),
           ("min", [None]), ("max", [None]), ("sum", [None]), ("batch", ["2"]), ("slice", ["2"]), ("e", [None]),
           ("safe", [None]), ("truncate", ["8", "10, true"]), ("format", ["1, 2"]), ("striptags", [None]),
           ("attr", ["'a'", "'upper'"]), ("dictsort", ["false, 'value'"])]
TESTS = [("defined", None), ("undefined", None), ("none", None), ("string", None), ("number", None),
         ("integer", None), ("float", None), ("mapping", None), ("iterable", None), ("sequence", None),
         ("boolean", None), ("true", None), ("false", None), ("odd", None), ("even", None), ("callable", None),
         ("divisibleby", "3"), ("eq", "1"), ("equalto", "'user'"), ("ne", "2"), ("in", "xs"), ("in", "'Hello'"),
         ("lt", "5"), ("gt", "0"), ("ge", "1"), ("le", "3"), ("lower", None), ("upper", None), ("sameas", "none"),
         ("escaped", None)]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]
STRINGS = ["'a'", "'abc'", "\"x\\ny\"", "'tab\\there'", "'é ü'", "''", "'  sp  '", "'%s-%d'", "'{} and {}'",
           "'<b>&amp;</b>'", "\"it's\"", "'\\u00e9\\x41'", "'multi\nline'", "'-'", "'user'", "'content'", "'a,b,,c'"]


STR_NAMES = ["s", "u", "e", "sp", "ml", "q", "num", "fnum"]
LIST_NAMES = ["xs", "ys", "ws", "mixed", "empty", "msgs", "tools", "msgs[1:]", "(ys|sort)", "(xs|list)"]
DICT_NAMES = ["d", "ed", "msgs[0]", "msgs[2]", "msgs[2].tool_calls[0].function", "tools[0]", "d.c"]
NUM_NAMES = ["n", "i", "neg", "f", "f2", "big", "xs|length", "1", "2", "0.5", "-3"]
TYPED_FILTERS = {
    "str": ["trim", "upper", "lower", "title", "capitalize", "length", "replace('l', 'L')", "indent(2)", "center(16)",
            "wordcount", "tojson", "first", "last", "list", "reverse", "e", "string", "truncate(6)", "int", "float",
            "default('x', true)", "format(1)", "striptags"],
    "list": ["length", "first", "last", "join(', ')", "join", "sort", "unique|list", "reverse|list", "tojson",
             "tojson(indent=2)", "map('string')|join('|')", "select|list", "reject('none')|list", "batch(2)|list",
             "slice(2)|list", "min", "max", "list", "string", "selectattr('role')|list",
             "selectattr('role', 'equalto', 'user')|list", "map(attribute='role')|list", "rejectattr('content')|list"],
    "dict": ["length", "items|list", "dictsort", "tojson", "tojson(sort_keys=true)", "list", "string", "first",
             "tojson(indent=1, separators=(',', ': '))", "dictsort(reverse=true)", "xmlattr"],
    "num": ["abs", "round", "round(1)", "int", "float", "string", "default(3)", "round(0, 'ceil')", "tojson"],
}
TYPED_METHODS = {
    "str": [m + "(" + a + ")" for m, aa in STR_METHODS for a in aa],
    "list": ["index(1)", "count(1)", "count('a')"],
    "dict": ["get('a')", "get('role', 'none')", "items()", "keys()", "values()", "get('content')"],
    "num": [],
}


class Gen:
    def __init__(self, rng):
        self.r = rng
        self.depth = 0
        self.typed = rng.random() < 0.7  # mostly well-typed templates (render), the rest anything goes (errors)

    def typed_expr(self):
        cat = self.pick(["str", "list", "dict", "num"])
        e = self.pick({"str": STR_NAMES + STRINGS, "list": LIST_NAMES, "dict": DICT_NAMES, "num": NUM_NAMES}[cat])
        if cat == "dict" and self.r.random() < 0.4:
            e += "." + self.pick(["a", "role", "content", "b", "name"])
            return e
        if self.r.random() < 0.4 and TYPED_METHODS[cat]:
            e += "." + self.pick(TYPED_METHODS[cat])
            return e
        if self.r.random() < 0.6:
            e += "|" + self.pick(TYPED_FILTERS[cat])
        if self.r.random() < 0.15:
            name, arg = self.pick(TESTS)
            e = f"{e} is " + name + ("" if arg is None else f"({arg})")
        return e

    def pick(self, xs):
        return self.r.choice(xs)

    def atom(self):
        k = self.r.random()
        if k < 0.45:
            return self.pick(NAMES[:len(CONTEXT)] if self.r.random() < 0.85 else NAMES)
        if k < 0.6:
            return self.pick(["0", "1", "2", "-1", "3", "10", "255", "1_000", "0x1F", "2.5", "1e3", "0.1", "true",
                              "false", "none", "True", "None"])
        if k < 0.8:
            return self.pick(STRINGS)
        if k < 0.88:
            return "[" + ", ".join(self.expr() for _ in range(self.r.randint(0, 3))) + "]"
        if k < 0.94:
            keys = self.r.sample(["'a'", "'b'", "'role'", "'content'", "1"], self.r.randint(0, 3))
            return "{" + ", ".join(f"{kk}: {self.expr()}" for kk in keys) + "}"
        return "(" + self.expr() + ", " + self.expr() + ")"

    def postfix(self, e):
        k = self.r.random()
        if k < 0.25:
            return e + "." + self.pick(["a", "role", "content", "b", "c", "x", "0", "1", "function", "arguments", "zz"])
        if k < 0.45:
            return e + "[" + self.pick(["0", "-1", "1", "'a'", "'role'", "'content'", "'b'", "5", "i", "n"]) + "]"
        if k < 0.55:  # (jinja2 folds constant slices at compile time through getitem; keep to names)
            return self.pick(SLICEABLE) + "[" + self.pick(["1:", ":2", "::-1", "1:-1", "::2", "-2:", ":"]) + "]"
        if k < 0.75:
            m, args = self.pick(STR_METHODS)
            return e + "." + m + "(" + self.pick(args) + ")"
        if k < 0.85:
            m, args = self.pick(DICT_METHODS)
            return e + "." + m + "(" + self.pick(args) + ")"
        m, args = self.pick(LIST_METHODS)
        return e + "." + m + "(" + self.pick(args) + ")"

    def primary(self):
        e = self.atom()
        while self.r.random() < 0.35:
            e = self.postfix(e)
        while self.r.random() < 0.3:
            name, args = self.pick(FILTERS)
            a = self.pick(args)
            e = e + "|" + name + ("" if a is None else "(" + a + ")")
        if self.r.random() < 0.12:
            name, arg = self.pick(TESTS)
            neg = " not" if self.r.random() < 0.3 else ""
            e = f"{e} is{neg} {name}" + ("" if arg is None else (f"({arg})" if self.r.random() < 0.5 else f" {arg}"))
        return e

    def expr(self):
        if self.typed and self.r.random() < 0.75:
            k = self.r.random()
            if k < 0.6:
                return self.typed_expr()
            if k < 0.8:
                a = self.typed_expr()
                return f"{a} {self.pick(['~', '==', '!=', 'and', 'or', 'in', 'not in'])} {self.typed_expr()}"
            if k < 0.9:
                return f"({self.typed_expr()}) ~ '|' ~ ({self.typed_expr()})"
            return f"{self.typed_expr()} if {self.typed_expr()} else {self.typed_expr()}"
        self.depth += 1
        try:
            if self.depth > 4:
                return self.atom()
            k = self.r.random()
            if k < 0.5:
                return self.primary()
            if k < 0.78:
                return f"{self.primary()} {self.pick(BINOPS)} {self.primary()}"
            if k < 0.85:
                return f"not {self.primary()}"
            if k < 0.9:
                return f"-{self.primary()}"
            if k < 0.96:
                return f"{self.primary()} if {self.expr()} else {self.primary()}"
            return f"({self.expr()})"
        finally:
            self.depth -= 1

    def ws(self):
        return self.pick(["", "", " ", "\n", "  ", "\n  ", " \n", "\t", "\n\n"])

    def open(self, kind="%"):
        return "{" + kind + self.pick(["", "", "-", "+"] if kind != "{" else ["", "", "-"]) + " "

    def close(self, kind="%"):
        end = {"%": "%}", "{": "}}", "#": "#}"}[kind]
        return " " + self.pick(["", "", "-"] + (["+"] if kind == "%" else [])) + end

    def text(self):
        return self.pick(["", "a", "text ", " b ", "\n", "x\n  ", "  ", "<s>", "[INST]", "é", "\n\n", "\t"])

    def body(self, n=None, in_loop=False, in_macro=False):
        out = []
        for _ in range(n if n is not None else self.r.randint(1, 4)):
            out.append(self.ws() + self.stmt(in_loop, in_macro) + self.ws())
        return "".join(out)

    def stmt(self, in_loop, in_macro):
        self.depth += 1
        try:
            k = self.r.random()
            if self.depth > 3 or k < 0.3:
                return self.text() + self.open("{") + self.expr() + self.close("{")
            if k < 0.45:
                s = self.open() + "if " + self.expr() + self.close() + self.body(None, in_loop, in_macro)
                if self.r.random() < 0.4:
                    s += self.open() + "elif " + self.expr() + self.close() + self.body(None, in_loop, in_macro)
                if self.r.random() < 0.5:
                    s += self.open() + "else" + self.close() + self.body(None, in_loop, in_macro)
                return s + self.open() + "endif" + self.close()
            if k < 0.6:
                target = self.pick(["x", "x", "item", "k, v"])
                seq = self.pick(["xs", "ys", "msgs", "ws", "d", "d.items()", "s", "range(3)", "empty", "mixed",
                                 "msgs[1:]", "tools", "none", "missing", "xs|reverse", "d|dictsort", "u"])
                cond = (" if " + self.expr()) if self.r.random() < 0.2 else ""
                s = self.open() + f"for {target} in {seq}{cond}" + self.close()
                inner = self.body(None, True, in_macro)
                inner += self.pick(["", "{{ loop.index }}", "{{ loop.index0 }}{{ loop.first }}",
                                    "{% if loop.last %}L{% endif %}", "{{ loop.length }}{{ loop.revindex }}",
                                    "{{ loop.previtem }}|{{ loop.nextitem }}", "{% if x == 2 %}{% break %}{% endif %}",
                                    "{% if loop.first %}{% continue %}{% endif %}!", "{{ loop.cycle('o', 'e') }}"])
                s += inner
                if self.r.random() < 0.2:
                    s += self.open() + "else" + self.close() + self.body(1, in_loop, in_macro)
                return s + self.open() + "endfor" + self.close()
            if k < 0.72:
                if self.r.random() < 0.5:
                    return self.open() + "set " + self.pick(["x", "y", "s", "i", "ns.v", "ns.acc"]) + " = " + self.expr() + self.close()
                return (self.open() + "set " + self.pick(["x", "y"]) + self.pick(["", " | upper", " | trim"]) + self.close()
                        + self.body(1, in_loop, in_macro) + self.open() + "endset" + self.close())
            if k < 0.78:
                return ("{% set ns = namespace(v=0, acc='') %}" + self.open() + "for x in " + self.pick(["xs", "ys", "msgs"])
                        + self.close() + "{% set ns.v = ns.v + 1 %}{% set ns.acc = ns.acc ~ x %}"
                        + self.open() + "endfor" + self.close() + "{{ ns.v }}:{{ ns.acc }}")
            if k < 0.86 and not in_macro:
                params = self.pick(["", "a", "a, b=2", "a='d', b=none"])
                call = self.pick(["m()", "m(1)", "m('x', 3)", "m(b=5)", "m(1, 2, 3)", "m(a=s)", "m(none)"])
                body = self.body(1, False, True) + self.pick(["{{ a }}", "{{ a }}{{ b }}", "{{ varargs }}", "{{ kwargs }}", ""])
                s = self.open() + f"macro m({params})" + self.close() + body + self.open() + "endmacro" + self.close()
                if self.r.random() < 0.25:
                    s = (self.open() + "macro m(a=1)" + self.close() + "[{{ caller() }}:{{ a }}]" + self.open()
                         + "endmacro" + self.close() + "{% call m(2) %}" + self.body(1, False, True) + "{% endcall %}")
                    return s
                return s + "{{ " + call + " }}"
            if k < 0.9:
                return (self.open() + "filter " + self.pick(["upper", "trim", "replace('a', 'b')", "indent(2)", "title"])
                        + self.close() + self.body(1, in_loop, in_macro) + self.open() + "endfilter" + self.close())
            if k < 0.94:
                return self.open("#") + self.pick(["comment", "{{ x }}", "multi\nline"]) + self.close("#")
            if k < 0.97:
                return "{% raw %}" + self.pick(["{{ raw }}", "{% if %}", " x "]) + self.open() + "endraw" + self.close()
            return self.open() + "with w = " + self.expr() + self.close() + "{{ w }}" + self.open() + "endwith" + self.close()
        finally:
            self.depth -= 1

    def template(self):
        return self.body(self.r.randint(1, 6))


# Second pass: Python's str methods on random Unicode text (case mapping with
# special cases and final sigma, classification, splitting, repr).
UNICODE_POOL = [chr(i) for i in list(range(0x20, 0x250)) + list(range(0x370, 0x530)) + list(range(0x1E00, 0x2000))
                + list(range(0x2100, 0x2200)) + list(range(0xFB00, 0xFB10))
                + [0x130, 0x131, 0x3A3, 0x1C5, 0xDF, 0x149, 0x1F0, 0x10400, 0x1E900, 0x2160, 0x24B6, 0xFF21, 0x3000,
                   0x85, 0xA0, 0x2028, 0x4E2D, 0x1F642, 0x661, 0xBD]]
UNICODE_TEMPLATE = ("{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ s.capitalize() }}|{{ s.swapcase() }}|"
                    "{{ s|title }}|{{ s.isupper() }}{{ s.islower() }}{{ s.istitle() }}{{ s.isalpha() }}"
                    "{{ s.isdigit() }}{{ s.isnumeric() }}{{ s.isdecimal() }}{{ s.isalnum() }}{{ s.isspace() }}"
                    "{{ s.isprintable() }}|{{ s|length }}|{{ s.split() }}|{{ s.strip() }}|{{ [s] }}|{{ s|tojson }}|"
                    "{{ s|tojson(ensure_ascii=true) }}|{{ s[::-1] }}|{{ s|wordcount }}|{{ s.splitlines() }}")


def norm(text):
    """Object addresses differ between runs: Python prints them, quern prints 0x0."""
    return re.sub(r" 0x[0-9a-f]+", " 0x0", text, flags=re.I)


def classify(e):
    import jinja2
    if isinstance(e, jinja2.exceptions.TemplateSyntaxError):
        return "TemplateSyntaxError", e.message
    return type(e).__name__, str(e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quern", required=True)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=10, help="mismatches to print")
    ap.add_argument("--dump", help="write the differing templates to this file (JSON lines)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # Python's SyntaxWarnings about constant subscripts in compiled templates
    rng = random.Random(args.seed)
    env = fx.make_env()
    cases, expected = [], []
    for _ in range(args.n):
        src = Gen(rng).template()
        try:
            # a fresh copy per render: templates can mutate lists (jinja2's indent does `s += "\n"`)
            out = env.from_string(src).render(**copy.deepcopy(CONTEXT))
            exp = {"output": norm(out)}
        except RecursionError:
            continue
        except Exception as e:  # noqa: BLE001
            kind, msg = classify(e)
            exp = {"error": msg, "type": kind}
        cases.append((src, CONTEXT))
        expected.append(exp)
    n_unicode = max(1, args.n // 2)
    for _ in range(n_unicode):
        text = "".join(rng.choice(UNICODE_POOL) for _ in range(rng.randint(1, 10)))
        cases.append((UNICODE_TEMPLATE, {"s": text}))
        expected.append({"output": env.from_string(UNICODE_TEMPLATE).render(s=text)})
    lines = "".join(json.dumps({"template": c[0], "context": c[1], "now": fx.FIXED_NOW.isoformat()}, ensure_ascii=False)
                    + "\n" for c in cases)
    proc = subprocess.run([args.quern, "template", "--jsonl"], input=lines.encode(), capture_output=True, timeout=600)
    if proc.returncode != 0:
        print("jinja_diff: quern failed:", proc.stderr.decode(errors="replace")[-2000:])
        return 1
    got = [json.loads(x) for x in proc.stdout.decode().split("\n") if x]  # (not splitlines: U+2028 is in the JSON)
    if len(got) != len(cases):
        print(f"jinja_diff: quern answered {len(got)} of {len(cases)} templates")
        return 1
    bad = 0
    n_err = 0
    dump = open(args.dump, "w", encoding="utf-8") if args.dump else None
    for (src, _), exp, g in zip(cases, expected, got):
        if "error" in exp:
            n_err += 1
            ok = "error" in g and (g["error"] == exp["error"] or exp["type"] == "MemoryError") and (
                g["type"] == exp["type"] or (exp["type"] == "TemplateSyntaxError" and g["type"] in (
                    "TemplateSyntaxError", "TemplateAssertionError")))
        else:
            ok = "output" in g and norm(g["output"]) == exp["output"]
        if not ok:
            bad += 1
            if dump:
                dump.write(json.dumps({"template": src, "jinja2": exp, "quern": g}, ensure_ascii=False) + "\n")
            if bad <= args.show:
                print("---- template:", json.dumps(src, ensure_ascii=False))
                print("  jinja2:", json.dumps(exp, ensure_ascii=False)[:600])
                print("  quern: ", json.dumps(g, ensure_ascii=False)[:600])
    print(f"jinja_diff: {len(cases) - n_unicode} random templates ({n_err} raise in jinja2) and {n_unicode} "
          f"random Unicode strings through the str methods, {bad} differ")
    if bad == 0:
        print("jinja_diff: all agree")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
