#!/usr/bin/python3
"""crosscheck.py - two reference.json files of the same prompts, compared.

Usage: scripts/llama-ref/crosscheck.py A/reference.json B/reference.json

Prints, per prompt, the largest |logit difference| over the prompt
positions and over the greedy steps both made, and whether argmax and
greedy tokens agree; then the overall maxima.  Used to validate
hf_to_gguf.py: llama.cpp's logits on the converted file (record.py)
against transformers' on the Hugging Face fixture, two implementations
nobody here wrote.  Exit status 1 if a greedy token differs.
"""
import json
import sys

import numpy as np


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = (json.load(open(p)) for p in sys.argv[1:])
    worst_p = worst_g = 0.0
    same = True
    for i, (pa, pb) in enumerate(zip(a["prompts"], b["prompts"])):
        if pa["tokens"] != pb["tokens"]:
            sys.exit(f"prompt {i}: different token ids")
        dp = float(np.abs(np.array(pa["logits"]) - np.array(pb["logits"])).max())
        n = min(len(pa["greedy"]), len(pb["greedy"]))
        agree = next((k for k in range(n) if pa["greedy"][k] != pb["greedy"][k]), n)
        # greedy_logits[k] chose greedy[k]; rows compare only while the tokens agree
        k = min(agree + 1, n)
        ga, gb = np.array(pa["greedy_logits"][:k]), np.array(pb["greedy_logits"][:k])
        dg = float(np.abs(ga - gb).max())
        am = pa["argmax"] == pb["argmax"]
        print(f"prompt {i} ({len(pa['tokens'])} tokens): prompt max|d| {dp:.3g}, greedy max|d| "
              f"{dg:.3g}, argmax {'same' if am else 'DIFFERENT'}, greedy same for {agree}/{n}")
        worst_p, worst_g = max(worst_p, dp), max(worst_g, dg)
        same = same and am and agree == n
    print(f"max |logit diff|: prompt {worst_p:.3g}, greedy {worst_g:.3g}; "
          f"{'identical argmax and greedy' if same else 'argmax or greedy DIFFER'}")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
