#!/usr/bin/env python3
"""Prints a markdown table from a bench/run_cpu.sh result file (quern and, when
present, llama.cpp's llama-bench on the same files).

Usage: python3 bench/summarize_cpu.py OUT/cpu-YYYYMMDD.json   (then bench/append_results.py cpu it)
"""
import json
import sys

d = json.load(open(sys.argv[1]))
print(f"Host: {d['host']}, {d['threads']} threads, {d['date']}\n")
print("| engine | model file | activations | test | tok/s (mean ± sd) | rate |")
print("| --- | --- | --- | --- | ---: | ---: |")
for run in d["runs"]:
    if isinstance(run, dict) and "llama_bench" in run:
        for x in run["llama_bench"]:
            test = f"pp{x['n_prompt']}" if x["n_prompt"] else f"tg{x['n_gen']}"
            name = x["model_filename"].split("/")[-1]
            print(f"| llama.cpp {x.get('build_commit', '')} | {name} | 8-bit | {test} | "
                  f"{x['avg_ts']:.1f} ± {x['stddev_ts']:.1f} | |")
        continue
    for x in run:
        acts = "two-level 8-bit" if x["precise_activations"] else "8-bit (--fast-act)"
        rate = f"{x['gflops']:.0f} GFLOP/s" if "gflops" in x else f"{x['weight_gbps']:.1f} GB/s"
        print(f"| quern | {x['model']} | {acts} | {x['test']} | {x['avg_ts']:.1f} ± {x['stddev_ts']:.1f} | {rate} |")
