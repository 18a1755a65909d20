#!/usr/bin/env python3
"""chat_pty.py PETREL_BIN - `petrel chat` driven through a pseudo-terminal,
as a person at a terminal drives it (CTest cli/chat_pty, issue 18 item 5).

Session 1 (greedy): an answer streams back and a prompt follows; the next
turn's prompt holds the history (more tokens than the first turn's prompt
and answer, part of it from the prefix cache); /reset brings back the
first turn's prompt size and the same answer; /system TEXT makes the
prompt larger and /reset keeps it; Ctrl-C at the prompt abandons the
half-typed line (the next question gets the same prompt and answer as
without it), not the program;
/exit leaves with status 0.

Session 2 (PETREL_CHAT_HOLD=1: the first token of each answer waits for a
SIGINT, so that the test interrupts an answer whatever the model's speed):
Ctrl-C typed during an answer ends it with "[interrupted]", and the chat
goes on to the next question and can be interrupted again.  Ctrl-C is
sent as the terminal's interrupt character (^C), so the line discipline
makes the signal, as it would for a person.
"""
import os
import pty
import re
import select
import sys

BIN = sys.argv[1]
GUARD_S = 300  # a hung child fails the test instead of hanging it (not a timing check)
STATS = re.compile(rb"\[(\d+) prompt tokens \((\d+) cached\), (\d+) generated")


class Session:
    def __init__(self, env_extra):
        env = dict(os.environ, **env_extra)
        argv = [BIN, "chat", "--temp", "0", "-n", "40", "-t", "1"]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(BIN, argv, env)
        self.buf = b""

    def expect(self, pattern):
        """Reads until pattern (bytes regex) matches what arrived since the
        last expect; returns the match and consumes through it."""
        rx = re.compile(pattern)
        while True:
            m = rx.search(self.buf)
            if m:
                before = self.buf[: m.end()]
                self.buf = self.buf[m.end():]
                return m, before
            r, _, _ = select.select([self.fd], [], [], GUARD_S)
            if not r:
                sys.exit(f"FAIL: waited {GUARD_S} s for {pattern!r}; got {self.buf[-500:]!r}")
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                data = b""
            if not data:
                sys.exit(f"FAIL: the chat ended while waiting for {pattern!r}; got {self.buf[-500:]!r}")
            self.buf += data

    def send(self, data):
        os.write(self.fd, data)

    def ask(self, line):
        """Sends a line; returns (answer text, prompt tokens, cached, generated)."""
        self.send(line.encode() + b"\r")
        _, out = self.expect(STATS)
        m = STATS.search(out)
        self.expect(rb"> ")
        text = out[: m.start()]
        echo = text.find(line.encode())
        assert echo >= 0, f"the line was not echoed: {out!r}"
        text = text[echo + len(line):].strip()
        return text, int(m.group(1)), int(m.group(2)), int(m.group(3))

    def finish(self):
        _, status = os.waitpid(self.pid, 0)
        os.close(self.fd)
        return status


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


# --- session 1 ---------------------------------------------------------------
s = Session({})
s.expect(rb"/help for commands")
s.expect(rb"> ")
a1, p1, c1, g1 = s.ask("Tell me a story")
check(len(a1) > 0 and g1 > 0, f"no answer: {a1!r}")
a2, p2, c2, g2 = s.ask("What happened next?")
check(p2 > p1 + g1 // 2, f"the second prompt ({p2}) does not hold the first turn ({p1} + {g1})")
check(c2 > 0, "the second turn reused nothing of the first from the prefix cache")
s.send(b"/reset\r")
s.expect(rb"\(conversation cleared\)")
s.expect(rb"> ")
a3, p3, _, _ = s.ask("Tell me a story")
check(p3 == p1, f"after /reset the prompt is {p3} tokens, the first was {p1}")
check(a3 == a1, f"after /reset the greedy answer differs: {a3!r} vs {a1!r}")
s.send(b"/system You are a storyteller who loves dogs.\r")
s.expect(rb"\(system message set; conversation cleared\)")
s.expect(rb"> ")
a4, p4, _, _ = s.ask("Tell me a story")
check(p4 > p1, f"with a system message the prompt is {p4} tokens, without {p1}")
s.send(b"/reset\r")  # keeps the system message
s.expect(rb"\(conversation cleared\)")
s.expect(rb"> ")
s.send(b"half a line")
s.send(b"\x03")  # ^C at the prompt: the line is dropped, the chat stays
s.expect(rb"> ")
a5, p5, _, _ = s.ask("Tell me a story")
check(p5 == p4 and a5 == a4, f"Ctrl-C at the prompt did not drop the line: {p5} vs {p4} tokens, {a5!r}")
s.send(b"/exit\r")
status = s.finish()
check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"/exit: status {status}")

# --- session 2: Ctrl-C during an answer -----------------------------------------
s = Session({"PETREL_CHAT_HOLD": "1"})
s.expect(rb"> ")
for q in ["Tell me a long story", "Tell me another one"]:
    s.send(q.encode() + b"\r")
    s.expect(rb"\(holding for Ctrl-C\)")
    s.send(b"\x03")
    _, out = s.expect(STATS)
    check(b"[interrupted]" in out, f"the answer to {q!r} was not interrupted: {out!r}")
    m = STATS.search(out)
    check(int(m.group(3)) == 1, f"the interrupted answer kept going: {out!r}")
    s.expect(rb"> ")
s.send(b"\x04")  # Ctrl-D at an empty prompt: end of input
status = s.finish()
check(os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"Ctrl-D: status {status}")
print("chat_pty: all passed")
