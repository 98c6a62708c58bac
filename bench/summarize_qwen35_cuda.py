#!/usr/bin/env python3
"""Prints the side-by-side table of a bench/run_qwen35_cuda.sh output folder:
quern and llama.cpp per preset and test (prefill, decode at each depth,
batched decode: decode-phase tok/s, llama-batched-bench's S_TG), with the ratio, and quern's achieved weight bandwidth.

Usage: python3 bench/summarize_qwen35_cuda.py OUT_DIR [PEAK_GB_S]
  PEAK_GB_S: the GPU's memory bandwidth for the roofline column (3350: H100 SXM).
"""
import json
import os
import re
import sys

out = sys.argv[1]
peak = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0


def lines(name):
    path = os.path.join(out, name)
    if not os.path.exists(path):
        return []
    return [json.loads(x) for x in open(path) if x.strip().startswith("{")]


def preset_of(path):
    m = re.search(r"(qwen3\.5-[0-9a-z-]+?)-Q", os.path.basename(path))
    return m.group(1) if m else os.path.basename(path)


quern, llama = {}, {}
for r in lines("quern.jsonl"):
    if "parallel" in r:
        quern[(r["file"], f"batch {r['parallel']}", 0)] = (r["decode_tps_median"], None)
    else:
        test = r["test"].split(" @ ")[0]  # "tg128 @ d4096": the depth is a column of its own
        quern[(r["file"], test, r["n_depth"])] = (r["median_ts"], r.get("gbps"))
for r in lines("llama.jsonl"):
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    llama[(preset_of(r["model_filename"]), test, r.get("n_depth", 0))] = (r["avg_ts"], None)
# llama-batched-bench: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
cur = None
path = os.path.join(out, "llama-batched.txt")
if os.path.exists(path):
    for x in open(path):
        if x.startswith("== "):  # run_qwen35_cuda.sh names each preset's run
            cur = x[3:].strip()
        cells = [c.strip() for c in x.strip().strip("|").split("|")]
        if len(cells) == 10 and cells[0].isdigit() and cur:
            llama[(cur, f"batch {cells[2]}", 0)] = (float(cells[7]), None)

print("| preset | test | depth | quern tok/s | llama.cpp tok/s | quern / llama.cpp |"
      + (" quern GB/s (of peak) |" if peak else ""))
print("| --- | --- | ---: | ---: | ---: | ---: |" + (" ---: |" if peak else ""))
for key in sorted(quern, key=lambda k: (k[0], k[1][:2], int(re.sub(r"\D", "", k[1]) or 0), k[2])):
    q, gbps = quern[key]
    l = llama.get(key, (None, None))[0]
    ratio = f"{q / l:.2f}×" if l else ""
    bw = ""
    if peak:
        bw = f" {gbps:.0f} ({100 * gbps / peak:.0f} %) |" if gbps else " |"
    print(f"| {key[0]} | {key[1]} | {key[2]} | {q:.1f} | {l:.1f} | {ratio} |{bw}" if l else
          f"| {key[0]} | {key[1]} | {key[2]} | {q:.1f} | | |{bw}")
