#!/usr/bin/env python3
"""`quern chat` in a pseudo-terminal, as a person uses it:
  - /help prints the commands;
  - the up arrow recalls the last line (sent again, it gets a second reply);
  - Ctrl-C during a reply stops it and returns to the prompt, the
    conversation kept (/save shows both turns);
  - /save then /load restores a conversation;
  - Ctrl-C twice at an empty prompt leaves, with status 0.

Usage: chat_pty.py --quern build/quern --model FILE
Exits 1 on the first failure ("chat_pty: all passed" on success).
"""
import argparse
import json
import os
import pty
import select
import signal
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quern", required=True)
    ap.add_argument("--model", required=True)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    saved = os.path.join(tmp, "conv.json")
    # Long replies (Ctrl-C has something to stop), greedy, the CPU.
    argv = [a.quern, "chat", "-m", a.model, "--device", "cpu", "--temp", "0", "-n", "4000", "-c", "8192"]
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm"
        os.execv(argv[0], argv)
    buf = b""

    def read_until(pattern, timeout=120):
        nonlocal buf
        end = time.time() + timeout
        while pattern.encode() not in buf:
            left = end - time.time()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {pattern!r}; got:\n{buf.decode(errors='replace')[-2000:]}")
            r, _, _ = select.select([fd], [], [], left)
            if r:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    raise AssertionError(f"quern exited waiting for {pattern!r}:\n{buf.decode(errors='replace')[-2000:]}")
                buf += chunk
        at = buf.index(pattern.encode()) + len(pattern)
        seen, buf = buf[:at], buf[at:]
        return seen.decode(errors="replace")

    def send(s):
        os.write(fd, s.encode())

    def reply_started():
        """Waits for the end of the line just sent (its newline) and the reply's first bytes."""
        nonlocal buf
        read_until("\n")
        end = time.time() + 120
        while len(buf) < 12 and time.time() < end:
            r, _, _ = select.select([fd], [], [], 0.1)
            if r:
                buf += os.read(fd, 4096)

    def fail(what):
        print("chat_pty: FAILED:", what)
        os.kill(pid, signal.SIGKILL)
        sys.exit(1)

    try:
        read_until("> ")
        send("/help\r")
        read_until("/save FILE")
        read_until("> ")
        print("chat_pty: /help ok")
        # A reply, then Ctrl-C during the next one.
        send("Write a very long story about a dragon.\r")
        read_until("Once upon a time")  # the greedy reply's start: the line was taken and the reply runs
        send("\x03")  # Ctrl-C typed: the terminal sends SIGINT
        read_until("(stopped)")
        read_until("> ")
        print("chat_pty: Ctrl-C stopped the reply; the prompt is back")
        # The up arrow recalls the line; Ctrl-C again stops that reply too.
        send("\x1b[A")
        read_until("dragon")
        send("\r")
        reply_started()
        send("\x03")  # Ctrl-C typed: the terminal sends SIGINT
        read_until("(stopped)")
        read_until("> ")
        print("chat_pty: up arrow recalled the last line")
        send(f"/save {saved}\r")
        read_until("saved to")
        read_until("> ")
        conv = json.load(open(saved))
        users = [m["content"] for m in conv if m["role"] == "user"]
        if users != ["Write a very long story about a dragon."] * 2 or len(conv) != 4:
            fail(f"the conversation after two stopped replies: {conv!r}")
        print("chat_pty: both turns kept:", len(conv), "messages")
        send("/clear\r")
        read_until("cleared")
        send(f"/load {saved}\r")
        read_until("loaded from")
        read_until("> ")
        send(f"/save {saved}.2\r")
        read_until("saved to")
        read_until("> ")
        if json.load(open(saved + ".2")) != conv:
            fail("/load then /save changed the conversation")
        print("chat_pty: /save then /load restores the conversation")
        send("\x03")  # Ctrl-C typed: the terminal sends SIGINT
        read_until("Ctrl-C again")
        send("\x03")  # Ctrl-C typed: the terminal sends SIGINT
        _, status = os.waitpid(pid, 0)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            fail(f"two Ctrl-C at the prompt: status {status}")
        print("chat_pty: Ctrl-C twice at the prompt leaves with status 0")
    except AssertionError as e:
        fail(str(e))
    print("chat_pty: all passed")


if __name__ == "__main__":
    main()
