#!/usr/bin/env python3
"""Appends a benchmark run's output to its results file, bench/results/BENCH.jsonl.

One file per benchmark, one JSON record per line. Every record says where it came
from: `bench` (the benchmark), `source` (the run's file name), `date`, `commit`,
`machine` and `switches` (as given here, or as the record already holds them; null
when unknown), and then the figures as the run wrote them:

  a JSON array            one record per element (quern bench --json)
  a JSON object           one record
  JSON lines              one record per line
  CSV                     one record per row (the header's names as keys)
  anything else (text)    one record {"text": the whole file}

The markdown summaries beside the results name records as BENCH.jsonl#SOURCE.

  bench/append_results.py decode-cuda-h200 out/bench.json --commit 5c95932 \\
      --machine "H200 SXM, 1980 MHz, driver 580.159.04" --switches defaults
"""
import argparse
import csv
import io
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def records(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    stripped = text.strip()
    if stripped.startswith("[") or stripped.startswith("{"):
        try:
            data = json.loads(stripped)
            return data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            pass
        try:
            return [json.loads(line) for line in stripped.splitlines() if line.strip()]
        except json.JSONDecodeError:
            pass
    if path.endswith(".csv"):
        return [dict(row) for row in csv.DictReader(io.StringIO(text))]
    return [{"text": text}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", help="benchmark name: the records go to bench/results/BENCH.jsonl")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--commit")
    ap.add_argument("--machine")
    ap.add_argument("--switches")
    ap.add_argument("--date", help="YYYY-MM-DD (default: from a date in the file name)")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    out = os.path.join(args.out_dir, args.bench + ".jsonl")
    n = 0
    with open(out, "a", encoding="utf-8") as f:
        for path in args.files:
            name = os.path.basename(path)
            m = re.search(r"(20\d\d)(\d\d)(\d\d)", name)
            date = args.date or (f"{m.group(1)}-{m.group(2)}-{m.group(3)}" if m else None)
            for r in records(path):
                if not isinstance(r, dict):
                    r = {"value": r}
                head = {"bench": args.bench, "source": name}
                for key, given in (("date", date), ("commit", args.commit), ("machine", args.machine),
                                   ("switches", args.switches)):
                    head[key] = r.pop(key, None) if given is None else given
                f.write(json.dumps({**head, **r}, sort_keys=False) + "\n")
                n += 1
    print(f"append_results: {n} records to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
