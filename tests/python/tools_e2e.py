#!/usr/bin/env python3
"""Tool calls end to end: `quern serve` with a real tool-calling model
(Qwen2.5-Coder-0.5B-Instruct, tools/fetch-tool-model.sh) and the official
`openai` client, unchanged:
  - a chat request with a function tool comes back with structured
    `tool_calls` (the function and its JSON arguments) and finish_reason
    "tool_calls", streamed (delta.tool_calls) and not, the two agreeing;
  - the client sends the call and its result back (the assistant message as
    the client built it, arguments as JSON text) and the model answers in
    text (finish_reason "stop");
  - tool_choice "none" gets text and no calls; "required" and a named
    function get a call, streamed with its arguments in pieces;
  - the Responses API with the same client: text, a function tool (a
    function_call item), streamed (the SDK's event accumulation) and not,
    the function_call_output round trip through previous_response_id;
  - the official `anthropic` client, unchanged, against /v1/messages: a
    plain message, the same tool as a tool_use block (stop_reason tool_use),
    streamed (the SDK's event accumulation) and not, the tool_result round
    trip, count_tokens, and an error in Anthropic's shape.

Usage: tools_e2e.py --quern build/quern --model FILE
Exits 1 on the first failure ("tools_e2e: all passed" on success).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_e2e import Server, check  # noqa: E402
import openai  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def structured_checks(srv):
    """Structured output with a pydantic model (the client sends its JSON schema): the reply parses."""
    import pydantic

    class City(pydantic.BaseModel):
        name: str
        country: str
        population: int
        landmarks: list[str]

    c = srv.client()
    r = c.chat.completions.parse(model=srv.model_id, response_format=City, max_tokens=200, temperature=0,
                                 messages=[{"role": "user", "content": "Describe Paris as JSON."}])
    ch = r.choices[0]
    if ch.finish_reason == "stop":
        check(isinstance(ch.message.parsed, City), f"parsed: {ch.message!r}")
        print("tools_e2e: structured output (pydantic) ->", ch.message.parsed)
    else:  # cut by max_tokens: still a prefix of valid JSON for the schema
        print("tools_e2e: structured output cut at max_tokens:", repr(ch.message.content[:80]))
    obj = c.chat.completions.create(model=srv.model_id, response_format={"type": "json_object"}, max_tokens=120,
                                    temperature=0, messages=[{"role": "user", "content": "Give me a JSON object."}])
    if obj.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(obj.choices[0].message.content), dict), f"json_object: {obj.choices[0]!r}")
    print("tools_e2e: json_object ->", repr(obj.choices[0].message.content[:60]))


R_TOOLS = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
            "parameters": TOOLS[0]["function"]["parameters"]}]


def responses_checks(srv):
    c = srv.client()
    r = c.responses.create(model=srv.model_id, input="Say hello.", max_output_tokens=32, temperature=0)
    check(r.status in ("completed", "incomplete") and r.output_text, f"responses text: {r!r}")
    print("tools_e2e: responses ->", repr(r.output_text[:60]), r.status)

    t = c.responses.create(model=srv.model_id, input="What is the weather in Paris right now?", tools=R_TOOLS,
                           max_output_tokens=128, temperature=0)
    calls = [o for o in t.output if o.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"responses tool: {t.output!r}")
    args = json.loads(calls[0].arguments)
    check("paris" in str(args.get("city", "")).lower(), f"responses arguments {args!r}")
    print("tools_e2e: responses function_call ->", calls[0].arguments)

    with c.responses.stream(model=srv.model_id, input="What is the weather in Paris right now?", tools=R_TOOLS,
                            max_output_tokens=128, temperature=0) as s:
        final = s.get_final_response()
    scalls = [o for o in final.output if o.type == "function_call"]
    check(len(scalls) == 1 and json.loads(scalls[0].arguments) == args, f"streamed: {final.output!r}")
    print("tools_e2e: responses streamed -> the same function_call")

    r2 = c.responses.create(model=srv.model_id, previous_response_id=t.id, tools=R_TOOLS, max_output_tokens=64,
                            temperature=0, input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                   "output": json.dumps({"temperature_c": 18, "sky": "cloudy"})}])
    check(r2.output and r2.previous_response_id == t.id, f"previous_response_id round trip: {r2!r}")
    try:
        c.responses.create(model=srv.model_id, input="x", previous_response_id="resp_nope")
        check(False, "an unknown previous_response_id was accepted")
    except openai.NotFoundError:
        pass
    print("tools_e2e: responses function_call_output via previous_response_id ->", r2.status)


A_TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                             "required": ["city"]}}]


def anthropic_checks(srv):
    import anthropic
    a = anthropic.Anthropic(base_url=f"http://127.0.0.1:{srv.port}", api_key="none", max_retries=0)
    m = a.messages.create(model=srv.model_id, max_tokens=32, messages=[{"role": "user", "content": "Say hello."}],
                          extra_body={"temperature": 0})
    check(m.type == "message" and m.role == "assistant" and m.content and m.content[0].type == "text",
          f"messages: {m!r}")
    check(m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0, f"messages: {m!r}")
    print("tools_e2e: anthropic messages ->", repr(m.content[0].text[:60]), m.stop_reason)

    t = a.messages.create(model=srv.model_id, max_tokens=128, tools=A_TOOLS, extra_body={"temperature": 0},
                          messages=[{"role": "user", "content": "What is the weather in Paris right now?"}])
    uses = [b for b in t.content if b.type == "tool_use"]
    check(t.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather", f"tool_use: {t!r}")
    check("paris" in str(uses[0].input.get("city", "")).lower() and uses[0].id.startswith("toolu_"), f"{uses[0]!r}")
    print("tools_e2e: anthropic tool_use ->", uses[0].input)

    with a.messages.stream(model=srv.model_id, max_tokens=128, tools=A_TOOLS, extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": "What is the weather in Paris right now?"}]) as s:
        final = s.get_final_message()
    suses = [b for b in final.content if b.type == "tool_use"]
    check(final.stop_reason == "tool_use" and len(suses) == 1 and suses[0].input == uses[0].input,
          f"streamed tool_use: {final!r}")
    print("tools_e2e: anthropic streamed -> the same tool_use")

    r = a.messages.create(model=srv.model_id, max_tokens=64, tools=A_TOOLS, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": "What is the weather in Paris right now?"},
        {"role": "assistant", "content": [b.model_dump() for b in t.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})}]}])
    check(r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use"), f"tool_result round trip: {r!r}")
    print("tools_e2e: anthropic tool_result round trip ->", r.stop_reason)

    n = a.messages.count_tokens(model=srv.model_id, messages=[{"role": "user", "content": "Say hello."}])
    check(n.input_tokens > 3, f"count_tokens: {n!r}")
    try:
        a.messages.create(model=srv.model_id, max_tokens=8, messages=[])
        check(False, "an empty message list was accepted")
    except anthropic.BadRequestError as e:
        check(e.body.get("type") == "error" and e.body["error"]["type"] == "invalid_request_error", f"{e.body!r}")
    print("tools_e2e: anthropic count_tokens", n.input_tokens, "and a 400 in Anthropic's shape")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quern", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    srv = Server(a.quern, ["-c", "4096", "--parallel", "2", "-q"], a.model)
    try:
        c = srv.client()
        r = c.chat.completions.create(model=srv.model_id, messages=ASK, tools=TOOLS, extra_body={"temperature": 0}, max_tokens=128)
        ch = r.choices[0]
        check(ch.finish_reason == "tool_calls", f"finish_reason {ch.finish_reason!r}, content {ch.message.content!r}")
        calls = ch.message.tool_calls
        check(calls and len(calls) == 1 and calls[0].function.name == "get_weather", f"tool_calls {calls!r}")
        args = json.loads(calls[0].function.arguments)
        check(isinstance(args, dict) and "paris" in str(args.get("city", "")).lower(), f"arguments {args!r}")
        check(calls[0].id.startswith("call_") and calls[0].type == "function", f"call {calls[0]!r}")
        print("tools_e2e: chat with a tool -> tool_calls", calls[0].function.arguments)

        stream = c.chat.completions.create(model=srv.model_id, messages=ASK, tools=TOOLS, extra_body={"temperature": 0},
                                           max_tokens=128, stream=True)
        got, finish, text = {}, None, ""
        for chunk in stream:
            if not chunk.choices:
                continue
            d = chunk.choices[0].delta
            text += d.content or ""
            for t in d.tool_calls or []:
                e = got.setdefault(t.index, {"id": "", "name": "", "arguments": ""})
                e["id"] += t.id or ""
                e["name"] += (t.function.name or "") if t.function else ""
                e["arguments"] += (t.function.arguments or "") if t.function else ""
            finish = chunk.choices[0].finish_reason or finish
        check(finish == "tool_calls" and list(got) == [0], f"stream: finish {finish!r}, calls {got!r}")
        check(got[0]["name"] == "get_weather" and json.loads(got[0]["arguments"]) == args,
              f"stream call {got[0]!r} differs from {args!r}")
        check(text == "", f"stream content {text!r}")
        print("tools_e2e: streamed -> the same call")

        msgs = ASK + [ch.message.model_dump(exclude_none=True),
                      {"role": "tool", "tool_call_id": calls[0].id,
                       "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})}]
        r2 = c.chat.completions.create(model=srv.model_id, messages=msgs, tools=TOOLS, extra_body={"temperature": 0}, max_tokens=96)
        check(r2.choices[0].finish_reason in ("stop", "length") and r2.choices[0].message.content,
              f"round trip: {r2.choices[0]!r}")
        print("tools_e2e: the tool's result sent back ->", repr(r2.choices[0].message.content[:80]))

        r3 = c.chat.completions.create(model=srv.model_id, messages=ASK, tools=TOOLS, tool_choice="none",
                                       temperature=0, max_tokens=64)
        check(not r3.choices[0].message.tool_calls and r3.choices[0].finish_reason != "tool_calls",
              f"tool_choice none: {r3.choices[0]!r}")
        print("tools_e2e: tool_choice none -> text")
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            f = c.chat.completions.create(model=srv.model_id, tool_choice=choice, tools=TOOLS, temperature=0,
                                          max_tokens=96, messages=[{"role": "user", "content": "Tell me a joke."}])
            fc = f.choices[0]
            check(fc.finish_reason == "tool_calls" and fc.message.tool_calls and
                  fc.message.tool_calls[0].function.name == "get_weather" and
                  isinstance(json.loads(fc.message.tool_calls[0].function.arguments).get("city"), str),
                  f"tool_choice {choice!r}: {fc!r}")
        print("tools_e2e: tool_choice required / named -> a call even to a joke request")
        # Streamed, the call's arguments come in pieces (OpenAI's shape: the
        # first chunk names it, later ones add arguments) adding up to the
        # non-streamed call.
        chunks = list(c.chat.completions.create(
            model=srv.model_id, tool_choice="required", tools=TOOLS, temperature=0, max_tokens=96, stream=True,
            messages=[{"role": "user", "content": "Tell me a joke."}]))
        pieces = [tc for k in chunks if k.choices for tc in (k.choices[0].delta.tool_calls or [])]
        check(pieces and pieces[0].id and pieces[0].function.name == "get_weather" and
              all(p.index == 0 and not p.id for p in pieces[1:]), f"streamed call pieces: {pieces!r}")
        args = "".join(p.function.arguments or "" for p in pieces)
        check(len(pieces) > 2 and json.loads(args) == json.loads(fc.message.tool_calls[0].function.arguments),
              f"streamed arguments {args!r} in {len(pieces)} pieces")
        print(f"tools_e2e: streamed forced call -> arguments in {len(pieces)} pieces")
        structured_checks(srv)
        responses_checks(srv)
        anthropic_checks(srv)
    finally:
        srv.stop()
    print("tools_e2e: all passed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # noqa: BLE001
        print(f"tools_e2e: FAILED: {e}")
        sys.exit(1)
