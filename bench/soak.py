#!/usr/bin/env python3
"""Soak test of `quern serve`: many streaming clients for a while, mixed with
hostile ones, then a check that nothing leaked or went wrong.

    python3 bench/soak.py --quern build/quern [--model FILE] [--clients 256]
                          [--minutes 10] [--json OUT.jsonl]

For --minutes, --clients workers each loop over well-formed streaming chat
requests (temperature 0, a prompt from a fixed set, 8-32 tokens). Beside
them run hostile workers: clients that disconnect mid-stream, slowloris
connections (one header byte a second), oversized bodies (Content-Length and
chunked), bad JSON. At the end:
  - errors by kind, and 5xx answers (must be 0);
  - every well-formed stream's text equals that prompt's text alone (each
    prompt run once, alone, before the soak);
  - the server's running / in-flight gauges back to 0;
  - peak RSS and thread count of the server;
  - with 1,000 idle keep-alive connections open, the time a new request takes.
Prints a table and, with --json, appends one record.
"""

import argparse
import http.client
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from server_e2e import Server  # noqa: E402

PROMPTS = ["Write a haiku about the sea.", "What is 17 times 23?", "Name three colours.",
           "Say hello in French.", "Describe a cat in one sentence.", "List two prime numbers.",
           "What is the capital of Italy?", "Give me a short motto."]


def stream_chat(port, prompt, max_tokens, timeout=300, cut_after=None):
    """(status, text, finish_reason) of one streamed chat request; cut_after:
    close after that many chunks."""
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                       "temperature": 0, "stream": True})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        data = r.read()
        c.close()
        return r.status, data.decode(errors="replace"), None
    text, finish, chunks = "", None, 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        for ch in j.get("choices", []):
            text += ch.get("delta", {}).get("content") or ""
            finish = ch.get("finish_reason") or finish
        chunks += 1
        if cut_after is not None and chunks >= cut_after:
            c.close()
            return 200, text, "cut"
    c.close()
    return 200, text, finish


def raw(port, data, read=True, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        return s.recv(64) if read else b""
    except OSError:
        return b""
    finally:
        s.close()


def status_of(resp):
    try:
        return int(resp.split(b" ")[1])
    except (IndexError, ValueError):
        return 0


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}

    def add(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1


def proc_stat(pid):
    rss = threads = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) // 1024
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quern", required=True)
    ap.add_argument("--model")
    ap.add_argument("--clients", type=int, default=256)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    srv = Server(a.quern, ["--parallel", "32", "--max-queue", "1024", "-c", "512", "-q"], a.model)
    port = srv.port
    try:
        alone = {(p, n): stream_chat(port, p, n)[1] for p in PROMPTS for n in (8, 32)}
        st = Stats()
        stop = time.time() + a.minutes * 60
        mismatches = []
        peak_threads = [0]

        def client(seed):
            rng = random.Random(seed)
            while time.time() < stop:
                p, n = rng.choice(PROMPTS), rng.choice((8, 32))
                try:
                    code, text, _ = stream_chat(port, p, n)
                except Exception as e:  # noqa: BLE001
                    st.add(f"client error {type(e).__name__}")
                    continue
                st.add(f"stream {code}")
                if code == 200 and text != alone[(p, n)]:
                    mismatches.append((p, n, text))

        def hostile(seed):
            rng = random.Random(seed)
            while time.time() < stop:
                kind = rng.choice(["disconnect", "slowloris", "oversized", "chunked", "badjson"])
                try:
                    if kind == "disconnect":
                        stream_chat(port, rng.choice(PROMPTS), 64, cut_after=2)
                        st.add("disconnect done")
                    elif kind == "slowloris":
                        s = socket.create_connection(("127.0.0.1", port), timeout=30)
                        try:
                            for b in b"GET /health HTTP/1.1\r\n":
                                if time.time() >= stop:
                                    break
                                s.send(bytes([b]))
                                time.sleep(1)
                            st.add("slowloris done")
                        except OSError:  # the header deadline passed: the server answered and closed
                            st.add(f"slowloris cut {s.recv(64)[9:12].decode(errors='replace') or '-'}")
                        s.close()
                    elif kind == "oversized":
                        r = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                                      b"\r\nContent-Length: 99999999999\r\n\r\n{")
                        st.add(f"oversized {status_of(r)}")
                    elif kind == "chunked":
                        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                        try:
                            c.request("POST", "/v1/chat/completions", iter([b" " * 65536] * 256),
                                      {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                                      encode_chunked=True)
                            st.add(f"chunked {c.getresponse().status}")
                        except OSError:  # the server answered 413 at the limit and stopped reading
                            st.add("chunked cut")
                        c.close()
                    else:
                        r = raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/"
                                      b"json\r\nContent-Length: 8\r\n\r\n{\"messag")
                        st.add(f"badjson {status_of(r)}")
                except Exception as e:  # noqa: BLE001
                    st.add(f"hostile error {type(e).__name__}")

        def watch():
            while time.time() < stop:
                peak_threads[0] = max(peak_threads[0], proc_stat(srv.proc.pid)[1])
                time.sleep(1)

        workers = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        workers += [threading.Thread(target=hostile, args=(10000 + i,)) for i in range(max(4, a.clients // 16))]
        workers.append(threading.Thread(target=watch))
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        time.sleep(1)
        running, in_flight = srv.metric("quern_requests_running"), srv.metric("quern_http_requests_in_flight")
        # 1,000 idle keep-alive connections, then a new request.
        idle = []
        for _ in range(1000):
            k = socket.create_connection(("127.0.0.1", port))
            k.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            k.recv(256)
            idle.append(k)
        times = []
        for _ in range(5):
            t0 = time.time()
            status_of(raw(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
            times.append((time.time() - t0) * 1000)
        for k in idle:
            k.close()
        peak_rss, _ = proc_stat(srv.proc.pid)
        fivexx = sum(v for k, v in st.counts.items() if k.split()[-1].startswith("5"))
        rec = {"clients": a.clients, "minutes": a.minutes, "requests": sum(st.counts.values()),
               "by_kind": dict(sorted(st.counts.items())), "fivexx": fivexx,
               "streams_checked": st.counts.get("stream 200", 0), "outputs_identical": not mismatches,
               "running_after": running, "in_flight_after": in_flight, "peak_rss_mib": peak_rss,
               "peak_threads": peak_threads[0], "health_ms_with_1000_idle_median": sorted(times)[2]}
        for k, v in rec.items():
            print(f"{k:36} {v}")
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(rec) + "\n")
        ok = fivexx == 0 and not mismatches and running == 0 and in_flight == 0
        print("soak:", "passed" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
