#!/usr/bin/env python3
"""progress_modes.py PETREL_BIN - progress while loading and converting, as
a terminal shows it and as a log gets it (CTest cli/progress_modes, issue
18 item 4):

  - on a terminal (a pseudo-terminal here) `petrel generate` draws a bar
    redrawn with '\\r' that reaches 100% with bytes and an ETA, then a
    "done" line; no plain progress lines;
  - with stderr a pipe the same run writes plain lines, one per tenth,
    percentages rising to 100%, no '\\r';
  - `petrel convert` does the same in both modes;
  - without PETREL_PROGRESS a quick load prints no progress at all, and
    PETREL_PROGRESS=0 turns it off.
PETREL_PROGRESS=1 shows progress from the start (the default waits 1 s,
longer than stories260K takes to load).
"""
import os
import pty
import re
import shutil
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
GEN = [BIN, "generate", "-n", "2", "--temp", "0", "-t", "1", "Once"]
LINE = re.compile(r"^petrel: (loading weights|converting): +(\d+)%", re.M)
fails = 0


def fail(msg):
    global fails
    print("FAIL:", msg)
    fails += 1


def on_tty(argv, env):
    """Runs argv with stdout and stderr on a pseudo-terminal; returns what it wrote."""
    pid, fd = pty.fork()
    if pid == 0:
        os.execve(argv[0], argv, dict(os.environ, **env))
    out = b""
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        fail(f"{argv[1]} on a terminal: status {status}: {out[-400:]!r}")
    return out.decode("utf-8", "replace")


def on_pipe(argv, env):
    r = subprocess.run(argv, env=dict(os.environ, **env), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=600)
    if r.returncode != 0:
        fail(f"{argv[1]} on a pipe: status {r.returncode}: {r.stderr[-400:]!r}")
    return r.stderr.decode("utf-8", "replace")


def check_bar(out, what):
    bars = re.findall(r"\r" + re.escape(what) + r" \[[#.]{24}\] +(\d+)%  ([^\r\n]*)", out)
    if not bars:
        fail(f"no {what} bar on the terminal: {out[:400]!r}")
        return
    pcts = [int(p) for p, _ in bars]
    if pcts != sorted(pcts) or pcts[-1] != 100:
        fail(f"{what} bar percentages {pcts}")
    last = bars[-1][1]
    if not re.search(r"\d+(\.\d+)? [KMG]?i?B of \d+(\.\d+)? [KMG]?i?B, .*/s, ETA \d+ s", last):
        fail(f"{what} bar lacks bytes, rate or ETA: {last!r}")
    if not re.search(r"petrel: " + re.escape(what) + r": done in \d", out):
        fail(f"no 'done' line after the {what} bar")
    if LINE.search(out):
        fail(f"plain progress lines on a terminal: {out[:400]!r}")


def check_lines(err, what):
    if "\r" in err:
        fail(f"'\\r' in {what} progress written to a pipe")
    pcts = [int(p) for w, p in LINE.findall(err) if w == what]
    if not pcts or pcts != sorted(set(pcts)) or pcts[-1] != 100 or len(pcts) > 11:
        fail(f"{what} lines on a pipe: percentages {pcts}: {err[:400]!r}")


# generate: loading weights
check_bar(on_tty(GEN, {"PETREL_PROGRESS": "1"}), "loading weights")
check_lines(on_pipe(GEN, {"PETREL_PROGRESS": "1"}), "loading weights")
for env in ({}, {"PETREL_PROGRESS": "0"}):
    quiet = {k: v for k, v in os.environ.items() if k != "PETREL_PROGRESS"}
    r = subprocess.run(GEN, env=dict(quiet, **env), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=600)
    if b"loading weights" in r.stderr:
        fail(f"progress shown with {env or 'no PETREL_PROGRESS'} on a quick load")
    out = on_tty(GEN, env) if env else ""
    if "loading weights" in out:
        fail("progress on a terminal with PETREL_PROGRESS=0")

# convert: a small Hugging Face model
src = os.path.join(os.getcwd(), "tests/fixtures/hf/llama2")
tmp = tempfile.mkdtemp()
try:
    conv = lambda dst: [BIN, "convert", "--bits", "4", src, os.path.join(tmp, dst)]
    check_bar(on_tty(conv("a"), {"PETREL_PROGRESS": "1"}), "converting")
    check_lines(on_pipe(conv("b"), {"PETREL_PROGRESS": "1"}), "converting")
finally:
    shutil.rmtree(tmp)

if fails:
    sys.exit(1)
print("progress_modes: all passed")
