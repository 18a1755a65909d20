#!/usr/bin/python3
"""kl.py - how far one model's next-token distributions are from another's.

Usage: scripts/llama-ref/kl.py BASE.json OTHER.json

Both files hold logits for the same prompts (record.py's reference.json,
make.sh logits or petrel_logits.c output).  Over every prompt position:
mean and largest KL(base || other) in nats, and how often the argmax
agrees.  Used for quantized files: BASE the f32 model, OTHER its Q8_0 or
Q4_0 version, each run by the same engine.
"""
import json
import sys

import numpy as np


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = (json.load(open(p)) for p in sys.argv[1:])
    kls, same, n = [], 0, 0
    for pa, pb in zip(a["prompts"], b["prompts"]):
        if pa["tokens"] != pb["tokens"]:
            sys.exit("different token ids")
        la, lb = log_softmax(np.array(pa["logits"], np.float64)), log_softmax(np.array(pb["logits"], np.float64))
        kls += list((np.exp(la) * (la - lb)).sum(axis=-1))
        same += int((la.argmax(-1) == lb.argmax(-1)).sum())
        n += len(la)
    kls = np.array(kls)
    print(f"KL mean {kls.mean():.3g} max {kls.max():.3g} nats over {n} positions; "
          f"top-1 agrees {same}/{n}")


if __name__ == "__main__":
    main()
