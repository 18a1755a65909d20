#!/usr/bin/python3
"""record.py - write a GGUF fixture's reference.json from llama.cpp.

Usage: scripts/llama-ref/record.py CASE_DIR N_GREEDY TOL_PROMPT TOL_GREEDY IDS [IDS...]

CASE_DIR holds model.gguf (tests/fixtures/gguf/<case>/).  With
REF_MODEL=path in the environment the logits come from that file instead:
a quantized model.gguf's reference is then llama.cpp on the exact values
its blocks decode to (an f32 file), so the tolerance measures the kernels.  Runs
scripts/llama-ref/make.sh logits on it for each prompt (IDS: "1,2,3") and
writes CASE_DIR/reference.json: llama.cpp's logits at every prompt position,
its greedy tokens and the logits each was chosen from, the tolerance the
test holds Petrel to (max |logit difference|, prompt rows and decode rows),
and where it all came from.  The tolerance is the caller's: f32 weights
against f32 arithmetic in both engines differ only by summation order, so
1e-4 is usual; a family that amplifies rounding says why it needs more.
"""
import hashlib
import json
import os
import subprocess
import sys


def main():
    if len(sys.argv) < 6:
        sys.exit(__doc__)
    case_dir, n_greedy, tol_p, tol_g = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    model = os.path.join(case_dir, "model.gguf")
    ref_model = os.environ.get("REF_MODEL", model)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([os.path.join(root, "scripts/llama-ref/make.sh"), "logits", ref_model, n_greedy]
                         + sys.argv[5:], check=True, capture_output=True, text=True).stdout
    ref = json.loads(out)
    with open(model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    meta = {
        "format_version": 1,
        "case": os.path.basename(os.path.normpath(case_dir)),
        "reference": "llama.cpp 34af94cd9ab277632e27caeec2d41de2fd091b31 (anchor CPU build), "
                     "scripts/llama-ref/llama_ref_logits.c: f32 KV cache, flash attention off, 2 threads",
        "model_sha256": sha,
        **({"reference_model": "the exact f32 values of model.gguf's blocks (" + os.path.basename(ref_model) + ")"}
           if ref_model != model else {}),
        "tolerance": {"prompt": tol_p, "greedy": tol_g},
    }
    meta.update(ref)
    with open(os.path.join(case_dir, "reference.json"), "w") as f:
        json.dump(meta, f, separators=(",", ":"))
        f.write("\n")
    worst = min(p["min_margin"] for p in ref["prompts"])
    print(f"{case_dir}: {len(ref['prompts'])} prompts, smallest top-2 margin {worst:.4g}")


if __name__ == "__main__":
    main()
