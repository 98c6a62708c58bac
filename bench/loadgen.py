#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible server (quern serve, or any other).

For each concurrency level, keeps that many streamed requests in flight (each
client task sends its next request as soon as the previous one ends) until
--requests requests have completed, and reports:
  - throughput: completion tokens / wall time of the level (tok/s, all requests),
  - TTFT: time from sending a request to its first content chunk,
  - ITL: time between consecutive content chunks of a request,
  - per-request decode rate.
Percentiles are over all requests (TTFT) or all intervals (ITL) of the level.
The streams of a level are split over several client processes (--processes;
default half the CPUs): one Python process parses only about 8-9k SSE chunks a
second, which would otherwise cap the measured throughput.

Usage:
  python3 bench/loadgen.py --base-url http://127.0.0.1:8080/v1 --concurrency 1,4,16,64 \\
      --requests 64 --max-tokens 64 --json /tmp/serve-cpu.json   # then: bench/append_results.py serve-cpu /tmp/serve-cpu.json
  python3 bench/loadgen.py --concurrency 64 --max-tokens 128 --response-format schema:bench/schemas/loadgen.json
      # constrained decoding: every request's output under that JSON schema
Needs the `openai` package (pip install openai).
"""

import argparse
import asyncio
import os
import json
import statistics
import sys
import time

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator works to a ten-year-old.",
    "List five facts about the planet Mars.",
    "What are the main differences between Python and C++?",
    "Describe a walk through a forest in autumn.",
    "Give three tips for learning a new language.",
    "Why is the sky blue?",
    "Summarize the plot of a detective novel you invent.",
]


def pct(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def one_request(client, model, prompt, max_tokens, seed, temperature, response_format=None):
    t0 = time.perf_counter()
    first = None
    last = None
    itl = []
    tokens = 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        stream=True,
        stream_options={"include_usage": True},
        **({"response_format": response_format} if response_format else {}),
    )
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta and chunk.choices[0].delta.content:
            if first is None:
                first = now
            else:
                itl.append(now - last)
            last = now
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    t1 = time.perf_counter()
    return {
        "ttft": (first - t0) if first is not None else float("nan"),
        "itl": itl,
        "tokens": tokens,
        "latency": t1 - t0,
        "decode_tps": (tokens - 1) / (last - first) if first is not None and last and last > first and tokens > 1 else float("nan"),
    }


async def run_requests(client, model, conc, indices, max_tokens, seed0, temperature, response_format):
    """Keeps `conc` requests in flight over the request numbers in `indices`."""
    results = []
    todo = list(indices)

    async def worker():
        while todo:
            i = todo.pop(0)
            results.append(await one_request(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, seed0 + i,
                                             temperature, response_format))

    await asyncio.gather(*(worker() for _ in range(conc)))
    return results


def process_main(base_url, api_key, model, conc, indices, max_tokens, seed0, temperature, response_format, start_at,
                 out):
    """One client process: waits for the common start time, runs its share, returns its results."""
    from openai import AsyncOpenAI

    async def go():
        client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600)
        delay = start_at - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        return await run_requests(client, model, conc, indices, max_tokens, seed0, temperature, response_format)

    out.put(asyncio.run(go()))


def summarize(conc, results, wall):
    ttft = [r["ttft"] for r in results if r["ttft"] == r["ttft"]]
    itl = [x for r in results for x in r["itl"]]
    toks = sum(r["tokens"] for r in results)
    dec = [r["decode_tps"] for r in results if r["decode_tps"] == r["decode_tps"]]
    return {
        "concurrency": conc,
        "requests": len(results),
        "completion_tokens": toks,
        "wall_s": wall,
        "throughput_tps": toks / wall if wall > 0 else float("nan"),
        "ttft_ms": {"p50": 1e3 * pct(ttft, 50), "p90": 1e3 * pct(ttft, 90), "p99": 1e3 * pct(ttft, 99)},
        "itl_ms": {"p50": 1e3 * pct(itl, 50), "p90": 1e3 * pct(itl, 90), "p99": 1e3 * pct(itl, 99)},
        "per_request_decode_tps_median": statistics.median(dec) if dec else float("nan"),
    }


def run_level(args, model, conc, n_requests, processes):
    """`conc` streams split over `processes` client processes (one Python
    process parses only so many SSE chunks a second: ~8-9k on one core)."""
    import multiprocessing as mp

    p = max(1, min(processes, conc))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 1.0 + 0.2 * p  # after every process has started
    procs = []
    for k in range(p):
        share = conc // p + (1 if k < conc % p else 0)
        idx = list(range(k, n_requests, p))
        procs.append(ctx.Process(target=process_main, args=(args.base_url, args.api_key, model, share, idx,
                                                            args.max_tokens, args.seed, args.temperature,
                                                            args.response_format, start_at, out)))
    for pr in procs:
        pr.start()
    results = []
    for _ in procs:
        results += out.get()
    wall = time.time() - start_at
    for pr in procs:
        pr.join()
    return summarize(conc, results, wall)


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of every request (0: greedy)")
    ap.add_argument("--processes", type=int, default=0,
                    help="client processes sharing the streams (default: half the CPUs, at most the concurrency)")
    ap.add_argument("--response-format", default=None,
                    help="constrain every request's output: json_object, or schema:FILE (a JSON schema, sent as "
                         "response_format json_schema)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    if args.response_format == "json_object":
        args.response_format = {"type": "json_object"}
    elif args.response_format and args.response_format.startswith("schema:"):
        with open(args.response_format[len("schema:"):]) as f:
            args.response_format = {"type": "json_schema",
                                    "json_schema": {"name": "loadgen", "schema": json.load(f), "strict": True}}
    elif args.response_format:
        sys.exit("loadgen: --response-format takes json_object or schema:FILE")
    try:
        from openai import AsyncOpenAI
    except ImportError:
        sys.exit("loadgen: the openai package is missing (pip install openai)")
    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    model = args.model or (await client.models.list()).data[0].id
    levels = []
    tty = sys.stderr.isatty()
    for conc in [int(c) for c in args.concurrency.split(",")]:
        n = args.requests or max(8, 2 * conc)
        if tty:
            print(f"loadgen: concurrency {conc}, {n} requests...", file=sys.stderr)
        procs = args.processes or max(1, (os.cpu_count() or 2) // 2)
        levels.append(run_level(args, model, conc, n, procs))
    print("| concurrency | requests | tokens | wall s | throughput tok/s | TTFT p50 / p90 ms | ITL p50 / p90 ms | per-request tok/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for L in levels:
        print(f"| {L['concurrency']} | {L['requests']} | {L['completion_tokens']} | {L['wall_s']:.1f} | "
              f"{L['throughput_tps']:.1f} | {L['ttft_ms']['p50']:.0f} / {L['ttft_ms']['p90']:.0f} | "
              f"{L['itl_ms']['p50']:.1f} / {L['itl_ms']['p90']:.1f} | {L['per_request_decode_tps_median']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"base_url": args.base_url, "model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
                       "response_format": args.response_format, "levels": levels}, f,
                      indent=1)


if __name__ == "__main__":
    asyncio.run(main())
