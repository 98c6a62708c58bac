#!/usr/bin/env python3
"""Prints the side-by-side table of a bench/run_cpu_decode.sh output folder:
per model file, thread count and test (pp512, tg128), quern's and llama.cpp's
median tok/s, their ratio, and for decode quern's weight GB/s against the
machine's read bandwidth at that thread count (read_bw.txt).

Usage: python3 bench/summarize_cpu_decode.py OUT_DIR [--json]
  --json: the rows as JSON lines (bench/append_results.py input) instead.
"""
import json
import os
import statistics
import sys

out = sys.argv[1]
as_json = "--json" in sys.argv[2:]


def lines(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    return [json.loads(x) for x in open(path) if x.strip().startswith("{")]


read_bw = {}
path = os.path.join(out, "read_bw.txt")
if os.path.exists(path):
    for x in open(path):
        t, g = x.split()
        read_bw[int(t)] = float(g)

quern, llama, order = {}, {}, []
for r in lines("quern.jsonl"):
    key = (r["file"], r["threads"], r["test"])
    quern[key] = (r["median_ts"], r.get("gbps"))
    if key not in order:
        order.append(key)
for r in lines("llama.jsonl"):
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    key = (r["file"], r["n_threads"], test)
    llama[key] = statistics.median(r["samples_ts"])
    if key not in order:
        order.append(key)

rows = []
for key in order:
    f, t, test = key
    q, gbps = quern.get(key, (None, None))
    lc = llama.get(key)
    rows.append({"file": f, "threads": t, "test": test, "quern_tps": q, "llamacpp_tps": lc,
                 "ratio": q / lc if q and lc else None, "quern_gbps": gbps,
                 "read_bw_gbps": read_bw.get(t) if test.startswith("tg") else None})

if as_json:
    for r in rows:
        print(json.dumps(r))
    sys.exit(0)


def num(v, fmt):
    return format(v, fmt) if v is not None else ""


print("| model file | threads | test | quern tok/s | llama.cpp tok/s | quern / llama.cpp | quern GB/s (of read bw) |")
print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
for r in rows:
    bw = ""
    if r["quern_gbps"] is not None and r["read_bw_gbps"]:
        bw = f"{r['quern_gbps']:.1f} ({100 * r['quern_gbps'] / r['read_bw_gbps']:.0f} %)"
    ratio = f"{r['ratio']:.2f}×" if r["ratio"] else ""
    print(f"| {r['file']} | {r['threads']} | {r['test']} | {num(r['quern_tps'], '.2f')} | "
          f"{num(r['llamacpp_tps'], '.2f')} | {ratio} | {bw} |")
