#!/usr/bin/env python3
"""End-to-end test of `quern serve` with the official `openai` client.

Starts a real server on a free loopback port (`--port 0`; the port is read
from its start-up line) with the default model, and checks:
  - chat and completions, streamed and not; stream == non-stream for the same
    seed; the same seed twice gives the same text; n choices use seed + i;
  - multi-byte UTF-8 never arrives split or as U+FFFD (raw SSE bytes too);
  - stop strings that span tokens (held back while streaming, never sent);
  - usage-chunk rules (exactly one final chunk with empty choices with
    stream_options.include_usage, none without), usage and cached tokens;
  - logprobs in both formats;
  - /v1/embeddings (the client's default base64 and floats, dimensions,
    token-id input, errors);
  - every error status: 400 (bad values, prompt longer than the context),
    401, 404 (route, model), 413, 429, 503 (while shutting down);
  - isolation: 16 concurrent requests with different prompts and parameters
    each equal the same request run alone;
  - a chat template repeating empty sequences 2^63 - 1 times, given by
    --chat-template-file and by a GGUF: chat answers at once, /health too;
  - shutdown with 20 connections that never finish a request: exit within
    the stop deadline, at once on a second signal;
  - robustness: malformed JSON, wrong types, huge / negative / NaN numbers,
    unknown fields, empty messages, 1 MB prompts, abrupt disconnects,
    interleaved with valid requests that must all be answered correctly; a
    client that disconnects mid-stream frees its sequence at once.

Usage: server_e2e.py --quern build/quern [--model FILE]
Prints one line per check; exits 1 on the first failure ("server_e2e: all
passed" on success).
"""

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"  # the server is local, whatever proxy is set
import openai  # noqa: E402


class Server:
    """A `quern serve` process on a free loopback port."""

    def __init__(self, quern, args, model=None):
        cmd = [quern, "serve", "--port", "0"] + (["-m", model] if model else []) + args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.lines = []
        self.ready = threading.Event()
        self.port = None
        self.model_id = None
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(120) or self.port is None:
            self.proc.kill()
            raise RuntimeError("quern serve did not start:\n" + "\n".join(self.lines))

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            m = re.search(r"serving '([^']*)' at http://127\.0\.0\.1:(\d+)/v1", line)
            if m:
                self.model_id, self.port = m.group(1), int(m.group(2))
                self.ready.set()
        self.ready.set()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, key="none", retries=0):
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=retries, timeout=120)

    def raw(self, method, path, body=None, headers=None):
        """(status, headers, body bytes) of one plain HTTP request."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def metric(self, name):
        _, _, body = self.raw("GET", "/metrics")
        m = re.search(r"^" + re.escape(name) + r" ([0-9.e+-]+)$", body.decode(), re.M)
        return float(m.group(1)) if m else None

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise RuntimeError("quern serve did not stop within 30 s of a signal")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_status(fn, status, what):
    try:
        fn()
    except openai.APIStatusError as e:
        check(e.status_code == status, f"{what}: status {e.status_code}, expected {status}: {e}")
        body = e.response.json()
        err = body.get("error", {})
        check(isinstance(err.get("message"), str) and err["message"], f"{what}: no error message in {body}")
        check("type" in err and "param" in err and "code" in err, f"{what}: not OpenAI's error shape: {body}")
        return err
    raise AssertionError(f"{what}: no error, expected status {status}")


def chat_text(client, model, messages, **kw):
    r = client.chat.completions.create(model=model, messages=messages, **kw)
    return r


def chat_stream(client, model, messages, **kw):
    """(text per choice, finish per choice, chunks)."""
    chunks = list(client.chat.completions.create(model=model, messages=messages, stream=True, **kw))
    texts, finish = {}, {}
    for ch in chunks:
        for c in ch.choices:
            texts.setdefault(c.index, "")
            if c.delta.content:
                texts[c.index] += c.delta.content
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, chunks


def completion_stream(client, model, prompt, **kw):
    chunks = list(client.completions.create(model=model, prompt=prompt, stream=True, **kw))
    texts, finish = {}, {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, chunks


USER = [{"role": "user", "content": "Name three colors of the rainbow."}]
REPEAT = "Repeat exactly: 你好世界 🙂 café ½\nRepeat exactly: 你好世界 🙂 café ½\nRepeat exactly:"


def test_models(s, c):
    models = c.models.list()
    ids = [m.id for m in models.data]
    check(ids == [s.model_id], f"/v1/models lists {ids}, expected [{s.model_id}]")
    status, _, body = s.raw("GET", "/health")
    check(status == 200 and json.loads(body)["status"] == "ok", f"/health: {status} {body}")


def test_chat(s, c):
    r = chat_text(c, s.model_id, USER, max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", f"chat response shape: {r}")
    check(text and r.choices[0].finish_reason in ("stop", "length"), f"chat: {r}")
    u = r.usage
    check(u.prompt_tokens > 5 and 0 < u.completion_tokens <= 24 and u.total_tokens == u.prompt_tokens + u.completion_tokens,
          f"chat usage: {u}")
    check(u.prompt_tokens_details is not None and u.prompt_tokens_details.cached_tokens >= 0, f"cached_tokens: {u}")
    texts, finish, chunks = chat_stream(c, s.model_id, USER, max_tokens=24, temperature=0)
    check(texts[0] == text, f"streamed chat {texts[0]!r} != non-streamed {text!r}")
    check(finish[0] == r.choices[0].finish_reason, f"finish {finish} vs {r.choices[0].finish_reason}")
    check(chunks[0].choices[0].delta.role == "assistant", f"first chunk has no role: {chunks[0]}")
    check(all(ch.usage is None for ch in chunks), "a usage chunk without stream_options.include_usage")
    check(all(ch.object == "chat.completion.chunk" and ch.id == chunks[0].id for ch in chunks), "chunk ids/objects")


def test_seeds(s, c):
    kw = dict(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    a = chat_text(c, s.model_id, USER, **kw).choices[0].message.content
    b = chat_text(c, s.model_id, USER, **kw).choices[0].message.content
    check(a == b, f"same seed twice: {a!r} != {b!r}")
    texts, _, _ = chat_stream(c, s.model_id, USER, **kw)
    check(texts[0] == a, f"seeded stream {texts[0]!r} != non-stream {a!r}")
    p = "Once upon a time, in a small village,"
    ck = dict(max_tokens=20, temperature=1.0, seed=77)
    one = c.completions.create(model=s.model_id, prompt=p, **ck).choices[0].text
    st, _, _ = completion_stream(c, s.model_id, p, **ck)
    check(st[0] == one, f"completions stream {st[0]!r} != non-stream {one!r}")
    # n choices: choice i is the request alone with seed + i
    r = c.completions.create(model=s.model_id, prompt=p, n=3, **ck)
    got = sorted((ch.index, ch.text) for ch in r.choices)
    check([i for i, _ in got] == [0, 1, 2], f"n=3 indexes: {got}")
    check(got[0][1] == one, f"n=3 choice 0 {got[0][1]!r} != single {one!r}")
    alone2 = c.completions.create(model=s.model_id, prompt=p, **dict(ck, seed=79)).choices[0].text
    check(got[2][1] == alone2, f"n=3 choice 2 {got[2][1]!r} != seed+2 alone {alone2!r}")
    # several prompts: choices per prompt, in order
    r = c.completions.create(model=s.model_id, prompt=[p, "The sea"], max_tokens=8, temperature=0)
    check(len(r.choices) == 2 and r.choices[0].text == c.completions.create(
        model=s.model_id, prompt=p, max_tokens=8, temperature=0).choices[0].text, f"list of prompts: {r}")
    r = c.completions.create(model=s.model_id, prompt=[504, 3458, 314], max_tokens=4, temperature=0)
    check(r.usage.prompt_tokens == 3, f"token-id prompt usage: {r.usage}")


def test_usage_chunk(s, c):
    _, _, chunks = chat_stream(c, s.model_id, USER, max_tokens=8, temperature=0,
                               stream_options={"include_usage": True})
    with_usage = [i for i, ch in enumerate(chunks) if ch.usage is not None]
    check(with_usage == [len(chunks) - 1], f"usage chunks at {with_usage} of {len(chunks)}")
    last = chunks[-1]
    check(last.choices == [] and last.usage.completion_tokens > 0 and last.usage.prompt_tokens > 0, f"usage chunk {last}")
    _, _, cchunks = completion_stream(c, s.model_id, "Hello", max_tokens=5, temperature=0,
                                      stream_options={"include_usage": True})
    check([ch.usage is not None for ch in cchunks].count(True) == 1 and cchunks[-1].choices == []
          and cchunks[-1].usage.completion_tokens == 5, "completions usage chunk")
    # the raw stream ends with [DONE]
    status, headers, body = s.raw("POST", "/v1/completions",
                                  json.dumps({"prompt": "Hi", "max_tokens": 3, "stream": True}))
    check(status == 200 and headers.get("Content-Type") == "text/event-stream", f"SSE headers {headers}")
    check(body.endswith(b"data: [DONE]\n\n"), f"stream does not end with [DONE]: {body[-80:]!r}")


def test_utf8(s, c):
    kw = dict(max_tokens=32, temperature=0)
    one = c.completions.create(model=s.model_id, prompt=REPEAT, **kw).choices[0].text
    check(any(ord(ch) > 0x7FF for ch in one), f"the UTF-8 test needs multi-byte output, got {one!r}")
    texts, _, chunks = completion_stream(c, s.model_id, REPEAT, **kw)
    check(texts[0] == one, f"stream {texts[0]!r} != non-stream {one!r}")
    for ch in chunks:
        for x in ch.choices:
            check("\ufffd" not in x.text, f"U+FFFD in a chunk: {x.text!r}")
    # raw bytes: every event is strict UTF-8 JSON
    status, _, body = s.raw("POST", "/v1/completions", json.dumps(dict(prompt=REPEAT, stream=True, **kw)))
    events = [e for e in body.split(b"\n\n") if e]
    pieces = []
    for e in events:
        check(e.startswith(b"data: "), f"not an SSE data line: {e[:60]!r}")
        payload = e[6:].decode("utf-8")  # raises on a split character
        if payload != "[DONE]":
            pieces.append(json.loads(payload)["choices"][0]["text"])
    check("".join(pieces) == one, "raw stream text differs")
    check(len(pieces) > 10, "the stream should come in many chunks")
    # chat with the same characters
    r = chat_text(c, s.model_id, [{"role": "user", "content": "Write: 你好世界 🙂"}], **kw)
    check("\ufffd" not in r.choices[0].message.content, "U+FFFD in chat output")


def test_stop(s, c):
    # find a token boundary inside the greedy output and stop on text that spans it
    r = chat_text(c, s.model_id, USER, max_tokens=30, temperature=0, logprobs=True, top_logprobs=2)
    full = r.choices[0].message.content
    toks = [t.token for t in r.choices[0].logprobs.content]
    check("".join(toks).startswith(full) or "".join(toks) == full, f"logprob tokens {toks} do not spell {full!r}")
    check(all(len(t.top_logprobs) == 2 for t in r.choices[0].logprobs.content), "top_logprobs count")
    check(all(t.logprob <= 0 for t in r.choices[0].logprobs.content), "logprobs must be <= 0")
    stop = None
    pos = 0
    for i in range(2, len(toks) - 1):
        pos = sum(len(t) for t in toks[:i])
        a, b = toks[i - 1].strip(), toks[i].strip()
        if len(toks[i - 1]) >= 2 and len(toks[i]) >= 2 and a and b:
            stop = full[pos - 2:pos + 2]
            break
    check(stop and len(stop) == 4, f"no two-token stop string found in {toks}")
    expect = full[:full.find(stop)]
    kw = dict(max_tokens=30, temperature=0, stop=[stop, "zzzzqqq"])
    got = chat_text(c, s.model_id, USER, **kw)
    check(got.choices[0].message.content == expect and got.choices[0].finish_reason == "stop",
          f"stop {stop!r}: {got.choices[0].message.content!r} ({got.choices[0].finish_reason}), expected {expect!r}")
    texts, finish, chunks = chat_stream(c, s.model_id, USER, **kw)
    check(texts[0] == expect and finish[0] == "stop", f"streamed stop: {texts[0]!r} {finish}")
    sent = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(stop not in sent and stop[:2] not in sent[len(expect):], "part of the stop string was sent")
    # streamed logprobs arrive with the text of their tokens
    chunks = list(c.chat.completions.create(model=s.model_id, messages=USER, max_tokens=30, temperature=0,
                                            logprobs=True, top_logprobs=2, stream=True))
    stoks = [t.token for ch in chunks if ch.choices and ch.choices[0].logprobs
             for t in ch.choices[0].logprobs.content]
    check(stoks == toks, f"streamed logprob tokens {stoks} != {toks}")
    # completions logprobs format
    r = c.completions.create(model=s.model_id, prompt="The sky is", max_tokens=6, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    check(len(lp.tokens) == 6 and len(lp.token_logprobs) == 6 and len(lp.top_logprobs) == 6
          and all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0, f"completion logprobs {lp}")


def test_errors(s, c, quern, model):
    m = s.model_id
    expect_status(lambda: c.chat.completions.create(model=m, messages=USER, temperature=5), 400, "temperature 5")
    expect_status(lambda: c.chat.completions.create(model=m, messages=[]), 400, "empty messages")
    expect_status(lambda: c.chat.completions.create(model=m, messages=[{"role": "robot", "content": "x"}]), 400, "role")
    expect_status(lambda: c.completions.create(model=m, prompt="x", max_tokens=-1), 400, "negative max_tokens")
    expect_status(lambda: c.completions.create(model=m, prompt="x", n=0), 400, "n=0")
    expect_status(lambda: c.chat.completions.create(model=m, messages=USER, stop=["a"] * 5), 400, "5 stops")
    t0 = time.time()
    err = expect_status(lambda: c.completions.create(model=m, prompt="hello " * 200000), 400, "1 MB prompt")
    check(err["code"] == "context_length_exceeded", f"1 MB prompt code: {err}")
    err = expect_status(lambda: c.chat.completions.create(model=m, messages=USER, stream=True,
                                                          max_tokens=4, top_p=3), 400, "stream with bad top_p")
    check(time.time() - t0 < 10, "refusals should be fast")
    err = expect_status(lambda: c.chat.completions.create(model="gpt-4o", messages=USER), 404, "unknown model")
    check(err["code"] == "model_not_found", f"unknown model code: {err}")
    status, _, body = s.raw("POST", "/v1/audio/speech", "{}")
    check(status == 404 and "error" in json.loads(body), f"unknown route: {status} {body}")
    status, _, body = s.raw("POST", "/v1/completions", json.dumps({"prompt": "x" * (9 << 20)}))
    check(status == 413 and "error" in json.loads(body), f"9 MB body: {status} {body[:200]}")

    # 401, 429, 503 on a second server: one slot, no queue, an API key
    s2 = Server(quern, ["-c", "512", "--parallel", "1", "--max-queue", "0", "--api-key", "sekrit", "-q"], model)
    try:
        expect_status(lambda: s2.client().models.list(), 401, "no key")
        expect_status(lambda: s2.client("wrong").chat.completions.create(model=m, messages=USER), 401, "wrong key")
        good = s2.client("sekrit")
        check(good.models.list().data[0].id == m, "the right key works")
        long_stream = good.completions.create(model=m, prompt="Count: 1, 2, 3,", max_tokens=400, temperature=0,
                                              stream=True, extra_body={"ignore_eos": True})
        first = next(iter(long_stream))  # it now holds the only slot
        check(first.choices[0].text is not None, "first chunk")
        expect_status(lambda: good.completions.create(model=m, prompt="x", max_tokens=2), 429, "queue full")
        long_stream.close()  # abrupt disconnect: the only slot must come back at once
        t0 = time.time()
        r = None
        while r is None and time.time() < t0 + 5:
            try:
                r = good.completions.create(model=m, prompt="x", max_tokens=2)
            except openai.RateLimitError:
                time.sleep(0.01)  # the slot is still taken
        check(r is not None and r.usage.completion_tokens == 2, "a closed stream kept its sequence for 5 s")
        print(f"  slot free {(time.time() - t0) * 1000:.0f} ms after the client closed its stream")
        # graceful shutdown: a running stream finishes; new requests get 503. (Idle
        # keep-alive connections hold the exit for up to their 5 s timeout: close them.)
        good.close()
        sc = s2.client("sekrit")
        stream = sc.completions.create(model=m, prompt="Count: 1, 2, 3,", max_tokens=60, temperature=0,
                                         stream=True, extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)
        s2.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 5
        status = 0
        while time.time() < deadline:
            status, _, _ = s2.raw("GET", "/health")
            if status == 503:
                break
            time.sleep(0.02)
        check(status == 503, "/health during shutdown")
        status, _, body = s2.raw("POST", "/v1/completions", json.dumps({"prompt": "x"}),
                                 {"Authorization": "Bearer sekrit"})
        check(status == 503 and "error" in json.loads(body), f"a request while shutting down: {status} {body}")
        rest = list(it)
        check(rest and rest[-1].choices[0].finish_reason in ("length", "abort"), "the running stream should finish")
        sc.close()
        t0 = time.time()
        s2.proc.wait(30)
        check(time.time() - t0 < 4.5, f"the server took {time.time() - t0:.1f} s to exit after its last request")
        check(s2.proc.returncode == 0, f"exit status {s2.proc.returncode}")
    finally:
        s2.stop()


def isolation_cases(m):
    """16 requests with different prompts and parameters (greedy or seeded)."""
    subjects = ["the moon", "rivers", "bread", "cats", "winter", "music", "the ocean", "trains",
                "gardens", "mountains", "coffee", "libraries", "bees", "volcanoes", "chess", "rain"]
    cases = []
    for i, sub in enumerate(subjects):
        kw = dict(model=m, max_tokens=12 + (i % 4) * 4, temperature=0)
        if i % 3 == 1:
            kw.update(temperature=0.8, seed=100 + i, extra_body={"top_k": 40})
        if i % 4 == 2:
            kw.update(frequency_penalty=0.5, presence_penalty=0.3)
        if i % 5 == 3:
            kw.update(stop=[".", "\n\n"])
        if i % 2:
            cases.append(("chat", dict(messages=[{"role": "user", "content": f"Tell me one fact about {sub}."}], **kw)))
        else:
            cases.append(("completion", dict(prompt=f"A short note about {sub}:", **kw)))
    return cases


def run_case(c, kind, kw, stream=False):
    if kind == "chat":
        if stream:
            return chat_stream(c, kw["model"], kw["messages"], **{k: v for k, v in kw.items()
                                                                   if k not in ("model", "messages")})[0][0]
        return c.chat.completions.create(**kw).choices[0].message.content
    if stream:
        return completion_stream(c, kw["model"], kw["prompt"], **{k: v for k, v in kw.items()
                                                                   if k not in ("model", "prompt")})[0][0]
    return c.completions.create(**kw).choices[0].text


def run_fresh(s, kind, kw, stream=False):
    """run_case on a client of its own (closed after, so no idle connection lingers)."""
    with s.client() as cl:
        return run_case(cl, kind, kw, stream)


def test_isolation(s, c):
    cases = isolation_cases(s.model_id)
    alone = [run_case(c, k, kw) for k, kw in cases]
    with cf.ThreadPoolExecutor(16) as ex:
        together = list(ex.map(lambda a: run_fresh(s, a[1][0], a[1][1], stream=a[0] % 2 == 0),
                               enumerate(cases)))
    for i, (a, b) in enumerate(zip(alone, together)):
        check(a == b, f"request {i} ({cases[i][0]}) alone {a!r} != concurrent {b!r}")
    return alone


def raw_socket(port, data, read=False, close_after=0.0):
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(data)
    if read:
        sock.recv(4096)
    if close_after:
        time.sleep(close_after)
    sock.close()


def test_robustness(s, c, reference):
    """Bad input and abrupt disconnects interleaved with valid requests."""
    m = s.model_id
    cases = isolation_cases(m)[:6]
    port = s.port
    body = lambda d: json.dumps(d).encode()
    post = lambda payload: (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    msg = [{"role": "user", "content": "hi"}]
    bad = [
        (400, b"{\"messages\": [", "truncated JSON"),
        (400, b"\xff\xfe\x00garbage", "binary garbage"),
        (400, b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": NaN}", "NaN literal"),
        (400, b"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 1e999}", "1e999"),
        (400, body({"messages": msg, "max_tokens": 10 ** 30}), "max_tokens 1e30"),
        (400, body({"messages": msg, "max_tokens": 1e308}), "max_tokens 1e308"),
        (400, body({"messages": msg, "temperature": -0.5}), "negative temperature"),
        (400, body({"messages": msg, "top_k": -7}), "negative top_k"),
        (400, body({"messages": msg, "seed": 2 ** 70}), "seed 2^70"),
        (400, body({"messages": msg, "n": "two"}), "n as string"),
        (400, body({"messages": "hi"}), "messages as string"),
        (400, body({"messages": [{"role": "user", "content": {"text": "hi"}}]}), "content as object"),
        (400, body({"messages": []}), "empty messages"),
        (400, body({"messages": [{"role": "user", "content": "x " * 500000}]}), "1 MB message"),
        (400, body({"messages": msg, "logit_bias": {"99999999": 5}}), "logit_bias id"),
        (400, body({"messages": msg, "stop": {"a": 1}}), "stop as object"),
        (400, b"[" * 100000, "deep nesting"),
        (200, body({"messages": msg, "max_tokens": 2, "frobnicate": [1, {"x": None}], "metadata": {"k": "v"}}),
         "unknown fields"),
    ]
    disconnects = [
        lambda: raw_socket(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"mes"),
        lambda: raw_socket(port, post(body({"messages": msg, "max_tokens": 300, "stream": True, "ignore_eos": True})),
                           read=True),
        lambda: raw_socket(port, post(body({"messages": msg, "max_tokens": 300, "ignore_eos": True})), close_after=0.05),
        lambda: raw_socket(port, b"GARBAGE / HTTP/9.9\r\n\r\n"),
        lambda: raw_socket(port, b""),
    ]
    with cf.ThreadPoolExecutor(8) as ex:
        futures = []
        for i in range(max(len(bad), len(disconnects) * 3)):
            k, kw = cases[i % len(cases)]
            futures.append(("valid", i % len(cases), ex.submit(run_fresh, s, k, kw, i % 2 == 0)))
            if i < len(bad):
                st, payload, what = bad[i]
                futures.append(("bad", (st, what), ex.submit(lambda p=payload: s.raw("POST", "/v1/chat/completions", p))))
            futures.append(("disc", i, ex.submit(disconnects[i % len(disconnects)])))
        for kind, info, f in futures:
            res = f.result()
            if kind == "valid":
                check(res == reference[info], f"valid request {info} among bad ones: {res!r} != {reference[info]!r}")
            elif kind == "bad":
                st, what = info
                status, _, b = res
                check(status == st, f"{what}: status {status}, expected {st}: {b[:200]!r}")
                if st != 200:
                    check("error" in json.loads(b), f"{what}: not an error body: {b[:200]!r}")
    # every sequence of the abandoned requests is freed
    busy = lambda: s.metric("quern_http_requests_in_flight") or s.metric("quern_requests_waiting")
    deadline = time.time() + 10
    while time.time() < deadline and busy():
        time.sleep(0.05)
    check(not busy(), "requests of disconnected clients are still in flight")
    status, _, _ = s.raw("GET", "/health")
    check(status == 200, "health after the storm")


def test_prefix_cache(s, c):
    prefix = "Here are some notes about the history of bread. " * 100  # ~1,000 tokens
    t0 = time.time()
    a = c.completions.create(model=s.model_id, prompt=prefix + "First question:", max_tokens=1, temperature=0)
    t1 = time.time()
    b = c.completions.create(model=s.model_id, prompt=prefix + "Second question:", max_tokens=1, temperature=0)
    t2 = time.time()
    cached = b.usage.prompt_tokens_details.cached_tokens
    check(a.usage.prompt_tokens > 900, f"prefix prompt has {a.usage.prompt_tokens} tokens")
    check(cached >= 800, f"second request reports {cached} cached tokens of {b.usage.prompt_tokens}")
    check(s.metric("quern_prompt_tokens_cached_total") >= cached, "cached tokens missing from /metrics")
    print(f"  prefix cache: {cached} of {b.usage.prompt_tokens} prompt tokens cached; "
          f"{(t1 - t0) * 1000:.0f} ms then {(t2 - t1) * 1000:.0f} ms")


def test_embeddings(s, c):
    """/v1/embeddings with the official client (base64 by default, floats
    asked for): unit vectors, one per input in order, the same text the same
    vector, different texts different ones, dimensions cut and renormalized,
    usage counting the tokens; bad inputs get 400 naming the field."""
    texts = ["The cat sat on the mat.", "Quantum chromodynamics describes quarks.", "The cat sat on the mat."]
    r = c.embeddings.create(model=s.model_id, input=texts)
    vecs = [d.embedding for d in r.data]
    check([d.index for d in r.data] == [0, 1, 2] and len(set(len(v) for v in vecs)) == 1, f"embeddings shape: {r!r}")
    norm = lambda v: sum(x * x for x in v) ** 0.5  # noqa: E731
    check(all(abs(norm(v) - 1) < 1e-4 for v in vecs), "embeddings are unit vectors")
    check(max(abs(a - b) for a, b in zip(vecs[0], vecs[2])) < 1e-5, "the same text, the same vector")
    check(max(abs(a - b) for a, b in zip(vecs[0], vecs[1])) > 1e-3, "different texts, different vectors")
    check(r.usage.prompt_tokens == r.usage.total_tokens > 6, f"embeddings usage {r.usage!r}")
    f = c.embeddings.create(model=s.model_id, input=texts[0], encoding_format="float", dimensions=16)
    v = f.data[0].embedding
    check(len(v) == 16 and abs(norm(v) - 1) < 1e-4, f"dimensions 16: {len(v)}")
    scale = norm(vecs[0][:16])
    check(max(abs(a - b / scale) for a, b in zip(v, vecs[0][:16])) < 1e-4, "dimensions: the leading ones, renormalized")
    ids = c.embeddings.create(model=s.model_id, input=[[1, 2, 3]], encoding_format="float")
    check(len(ids.data) == 1, "token-id input")
    for body, param in (({"input": []}, "input"), ({"input": "x", "dimensions": 0}, "dimensions"),
                        ({"input": "x", "encoding_format": "hex"}, "encoding_format"), ({}, "input")):
        st, _, data = s.raw("POST", "/v1/embeddings", json.dumps(body).encode())
        check(st == 400 and json.loads(data)["error"]["param"] == param, f"embeddings {body}: {st} {data[:120]!r}")


HOSTILE_TEMPLATE = ("{{ '' * 9223372036854775807 }}{{ ([] * 9223372036854775807) | length }}"
                    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                    "<|im_start|>assistant\n")


def gguf_with_template(src, dst, template):
    """A copy of GGUF file `src` whose tokenizer.chat_template is `template`."""
    from gguf import GGUFReader, GGUFWriter, GGUFValueType
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "tokenizer.chat_template"):
            continue
        t = f.types[0]
        if t == GGUFValueType.ARRAY:
            w.add_array(name, f.contents())
        else:
            w.add_key_value(name, f.contents(), t)
    w.add_string("tokenizer.chat_template", template)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_hostile_template(quern, model):
    """A chat template that repeats empty sequences 2^63 - 1 times, given by
    --chat-template-file and by a GGUF's tokenizer.chat_template: chat
    answers at once and /health keeps answering."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        tfile = os.path.join(d, "hostile.jinja")
        with open(tfile, "w") as f:
            f.write(HOSTILE_TEMPLATE)
        src = model or os.path.join(os.environ.get("QUERN_HOME", os.path.expanduser("~/.cache/quern")), "models",
                                    "SmolLM2-135M-Instruct.Q4_1.gguf")
        hostile_gguf = os.path.join(d, "hostile.gguf")
        gguf_with_template(src, hostile_gguf, HOSTILE_TEMPLATE)
        for how, args, m in (("--chat-template-file", ["--chat-template-file", tfile], model),
                             ("GGUF tokenizer.chat_template", [], hostile_gguf)):
            s4 = Server(quern, ["--parallel", "2"] + args, m)
            try:
                t0 = time.time()
                status, _, body = s4.raw("POST", "/v1/chat/completions", json.dumps(
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
                took = time.time() - t0
                check(status == 200, f"{how}: status {status} {body[:200]}")
                check(took < 5, f"{how}: the chat request took {took:.1f} s")
                status, _, _ = s4.raw("GET", "/health")
                check(status == 200, f"{how}: /health {status}")
                print(f"  {how}: chat answered in {took * 1000:.0f} ms, /health ok")
            finally:
                s4.stop()


def test_shutdown_aborts_streams(quern, model):
    """SIGTERM with 32 running streams and --shutdown-grace 1: after the grace
    every stream ends with a finish_reason ("abort" for those cut off) and
    [DONE], and the process exits within the grace plus its stop deadline."""
    s5 = Server(quern, ["--parallel", "32", "--shutdown-grace", "1", "-c", "512"], model)
    results = [None] * 32
    started = threading.Barrier(33)

    def one(i):
        c = http.client.HTTPConnection("127.0.0.1", s5.port, timeout=60)
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True, "stream": True})
        c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        first = r.read(1)  # the stream has begun
        started.wait(30)
        data = first + r.read()
        results[i] = [ln[6:] for ln in data.decode().split("\n") if ln.startswith("data: ")]

    try:
        ts = [threading.Thread(target=one, args=(i,)) for i in range(32)]
        for t in ts:
            t.start()
        started.wait(60)
        t0 = time.time()
        s5.proc.send_signal(signal.SIGTERM)
        for t in ts:
            t.join(30)
        s5.proc.wait(30)
        took = time.time() - t0
        check(took < 1 + 3 + 1, f"exit took {took:.1f} s with --shutdown-grace 1")
        reasons = set()
        for i, ev in enumerate(results):
            check(ev and ev[-1] == "[DONE]", f"stream {i} did not end with [DONE]: {ev[-2:] if ev else ev}")
            last = json.loads(ev[-2])
            check("error" not in last, f"stream {i} ended with an error: {ev[-2]}")
            reasons.add(last["choices"][0]["finish_reason"])
        check(reasons == {"abort"}, f"finish reasons {reasons}")
        print(f"  32 streams cut off with finish_reason abort; exit {took:.2f} s after SIGTERM")
    finally:
        s5.stop()


def test_shutdown_with_open_connections(quern, model):
    """SIGTERM with connections that never finish a request (slowloris, idle):
    they hold no request, so the server exits at once. With a stream still
    running, the first signal waits for it (the grace period); a second one
    exits at once."""
    for second_signal in (False, True):
        s3 = Server(quern, ["--parallel", "2"], model)
        socks = []
        try:
            for i in range(20):
                k = socket.create_connection(("127.0.0.1", s3.port))
                if i % 2 == 0:
                    k.sendall(b"P")  # one byte of a request line
                socks.append(k)
            if second_signal:  # a long stream keeps the first signal waiting
                k = socket.create_connection(("127.0.0.1", s3.port))
                body = json.dumps({"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True, "stream": True})
                k.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
                check(b"200 OK" in k.recv(4096), "the long stream did not start")
                socks.append(k)
            time.sleep(0.3)
            t0 = time.time()
            s3.proc.send_signal(signal.SIGTERM)
            if second_signal:
                time.sleep(0.5)
                check(s3.proc.poll() is None, "the first signal did not wait for the running stream")
                s3.proc.send_signal(signal.SIGTERM)
            s3.proc.wait(30)
            took = time.time() - t0
            limit = 1.5
            check(took < limit, f"exit took {took:.1f} s with 20 open connections (second signal: {second_signal})")
            want = 130 if second_signal else 0
            check(s3.proc.returncode == want, f"exit status {s3.proc.returncode}, expected {want}")
            print(f"  exited {took:.2f} s after SIGTERM{' x2' if second_signal else ''} with 20 open connections")
        finally:
            for k in socks:
                k.close()
            s3.stop()


STALLING_TEMPLATE = ("{% if messages[0].content == 'stall' %}{% set s = 'x' * 4000000 %}"
                     "{% for i in range(100000) %}{% for j in range(100) %}{% if 'y' in s %}{% endif %}"
                     "{% endfor %}{% endfor %}{% endif %}"
                     "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                     "<|im_start|>assistant\n")


def test_shutdown_with_stuck_render(quern, model):
    """SIGTERM while a chat-template render runs (a loop that would spend its
    whole 5 s render budget scanning a 4 MB string): with --shutdown-grace
    0.5 the process exits by the grace plus the 3 s stop deadline, before the
    render would have ended."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        tfile = os.path.join(d, "stall.jinja")
        with open(tfile, "w") as f:
            f.write(STALLING_TEMPLATE)
        s6 = Server(quern, ["--parallel", "2", "--shutdown-grace", "0.5", "--chat-template-file", tfile], model)
        try:
            status, _, body = s6.raw("POST", "/v1/chat/completions", json.dumps(
                {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            check(status == 200, f"a chat request that does not stall: {status} {body[:200]}")
            k = socket.create_connection(("127.0.0.1", s6.port))
            body = json.dumps({"messages": [{"role": "user", "content": "stall"}], "max_tokens": 2})
            k.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            time.sleep(0.5)  # the render is under way
            t0 = time.time()
            s6.proc.send_signal(signal.SIGTERM)
            s6.proc.wait(30)
            took = time.time() - t0
            k.settimeout(5)
            try:
                answer = k.recv(4096)
            except OSError:
                answer = b""
            k.close()
            check(answer == b"", f"the stalled request was answered before the exit: {answer[:120]!r}")
            check(took < 0.5 + 3 + 1, f"exit took {took:.1f} s with a render running and --shutdown-grace 0.5")
            check(any("stop deadline were dropped" in ln for ln in s6.lines), "no stop-deadline line in the log")
            print(f"  exit {took:.2f} s after SIGTERM with a template render still running")
        finally:
            s6.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quern", required=True)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    t_start = time.time()
    s = Server(args.quern, ["-c", "4096", "--parallel", "4", "--max-queue", "64"], args.model)
    c = s.client()
    try:
        steps = [
            ("models", lambda: test_models(s, c)),
            ("chat", lambda: test_chat(s, c)),
            ("seeds", lambda: test_seeds(s, c)),
            ("usage chunk", lambda: test_usage_chunk(s, c)),
            ("utf-8", lambda: test_utf8(s, c)),
            ("stop strings and logprobs", lambda: test_stop(s, c)),
            ("errors", lambda: test_errors(s, c, args.quern, args.model)),
            ("embeddings", lambda: test_embeddings(s, c)),
            ("shutdown with open connections", lambda: test_shutdown_with_open_connections(args.quern, args.model)),
            ("shutdown cuts streams off", lambda: test_shutdown_aborts_streams(args.quern, args.model)),
            ("hostile template", lambda: test_hostile_template(args.quern, args.model)),
            ("shutdown with a stuck render", lambda: test_shutdown_with_stuck_render(args.quern, args.model)),
        ]
        for name, fn in steps:
            t = time.time()
            fn()
            print(f"ok {name} ({time.time() - t:.1f} s)", flush=True)
        t = time.time()
        reference = test_isolation(s, c)
        print(f"ok isolation ({time.time() - t:.1f} s)", flush=True)
        t = time.time()
        test_robustness(s, c, reference)
        print(f"ok robustness ({time.time() - t:.1f} s)", flush=True)
        t = time.time()
        test_prefix_cache(s, c)
        print(f"ok prefix cache ({time.time() - t:.1f} s)", flush=True)
    except Exception:
        print("server log (last 40 lines):\n  " + "\n  ".join(s.lines[-40:]), file=sys.stderr)
        raise
    finally:
        c.close()
        t = time.time()
        s.stop()
    check(time.time() - t < 4.5, f"the server took {time.time() - t:.1f} s to stop")
    print(f"server_e2e: all passed in {time.time() - t_start:.1f} s")


if __name__ == "__main__":
    main()
