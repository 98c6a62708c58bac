#!/usr/bin/env python3
"""Compares quern's token masks with llguidance's (an independent constrained-
decoding engine, used here only as a reference).

Reads the JSON file test_mask_llguidance writes:
  {"tokens": [hex bytes by id], "eog": [ids],
   "cases": [{"name", "gbnf", "ids": [the document's tokens],
              "masks": [hex of quern's mask bits before each token and at the end]}]}
For each case it runs llguidance's matcher over the same grammar (GBNF, which
llguidance converts to its Lark form) and tokens, and compares the allowed sets
step by step. Prints each difference with the token's bytes; exits 1 on any.
One difference is by design: where the grammar forces the next bytes,
llguidance allows only their canonical tokenization, quern every piece of them.
"""
import json
import sys

import numpy as np

try:
    import llguidance
    from llguidance import grammar_from
except ImportError:
    sys.exit("mask_diff.py: the llguidance package is missing (tools/install-deps.sh installs it)")


def main():
    data = json.load(open(sys.argv[1]))
    tokens = [bytes.fromhex(t) for t in data["tokens"]]
    eog = data["eog"]
    lut = {t: i for i, t in enumerate(tokens) if t and i not in eog}
    longest = max(len(t) for t in tokens)

    class Vocab:
        """What llguidance.TokenizerWrapper wants: the token bytes, the end
        token, and a tokenizer (greedy longest match; llguidance uses it to
        tokenize forced text)."""

        eos_token_id = eog[0]
        bos_token_id = None
        special_token_ids = eog

        def __init__(self):
            self.tokens = [t if i not in eog else b"<|eog|>" for i, t in enumerate(tokens)]

        def __call__(self, b):
            out, i = [], 0
            while i < len(b):
                for n in range(min(longest, len(b) - i), 0, -1):
                    t = lut.get(b[i:i + n])
                    if t is not None:
                        out.append(t)
                        i += n
                        break
                else:
                    raise ValueError(f"no token for {b[i:i + 1]!r}")
            return out

    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocab()))
    n_vocab = len(tokens)
    failures = 0
    steps = 0
    for case in data["cases"]:
        m = llguidance.LLMatcher(tok, grammar_from("gbnf", case["gbnf"]))
        if m.is_error():
            print(f"{case['name']}: llguidance refused the grammar: {m.get_error()}")
            failures += 1
            continue
        ids = case["ids"]
        for step, hexmask in enumerate(case["masks"]):
            ref = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")[:n_vocab]
            ours = np.unpackbits(np.frombuffer(bytes.fromhex(hexmask), dtype=np.uint8), bitorder="little")[:n_vocab]
            # llguidance allows only its one end token; quern every end-of-generation token.
            ours = ours.copy()
            for e in eog[1:]:
                ours[e] = ref[e]
            diff = np.nonzero(ref != ours)[0]
            # Where the grammar forces the next bytes, llguidance allows only the
            # tokens of their canonical tokenization (its "forced tokens"); quern
            # allows every token the grammar does, shorter pieces of the forced
            # text too. Those extra pieces are no difference in language.
            forced = m.compute_ff_bytes()
            if forced:
                diff = [i for i in diff if not (ours[i] and not ref[i] and tokens[i] and forced.startswith(tokens[i]))]
            steps += 1
            if len(diff):
                failures += 1
                shown = ", ".join(f"{tokens[i]!r}: quern {ours[i]} llguidance {ref[i]}" for i in diff[:8])
                print(f"{case['name']} step {step} (after {b''.join(tokens[t] for t in ids[:step])[-40:]!r}): "
                      f"{len(diff)} tokens differ: {shown}")
                break
            if step < len(ids) and not m.consume_token(ids[step]):
                print(f"{case['name']} step {step}: llguidance refused token {tokens[ids[step]]!r}: {m.get_error()}")
                failures += 1
                break
    print(f"mask_diff: {steps} steps of {len(data['cases'])} documents compared, {failures} with differences")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
