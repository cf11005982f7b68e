"""A hostile operator against the control socket, as another Unix account (run as root; it drops
to USER first, as tests.security.raw_request does, so the server sees USER by SO_PEERCRED):

`python -m tests.security.socket_flood flood USER SOCKET COUNT`: hold COUNT connections, each
having sent only the start of a request, and reopen any the server closes, until stdin ends.
It prints `ready` once every connection was opened and the server has refused one, then, at
the end, one JSON line: how many times each answer came back, and how many connects failed.

`python -m tests.security.socket_flood trickle USER SOCKET GAP_S`: one connection that sends
a request a byte every GAP_S seconds, never its end; prints one JSON line when the server
closes it: the seconds it stayed open and the answer it got.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import sys
import time
from collections import Counter

from tests.integration.as_account import become

HALF = b'{"v":1,'
STOP = "stdin"


def _open(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(0.0)  # a full queue is EAGAIN at once, not a wait
    try:
        conn.connect(path)
        conn.send(HALF)
    except OSError:
        conn.close()
        return None
    return conn


def flood(path: str, count: int) -> None:
    chosen = selectors.DefaultSelector()
    chosen.register(sys.stdin, selectors.EVENT_READ, STOP)
    answers: Counter[str] = Counter()
    failed = opened = 0
    held: set[socket.socket] = set()
    ready = False
    while True:
        while len(held) < count:  # reopen whatever the server closed
            conn = _open(path)
            if conn is None:
                failed += 1
                break  # a full queue: try again after the next events
            opened += 1
            held.add(conn)
            chosen.register(conn, selectors.EVENT_READ, conn)
        if not ready and opened >= count and answers:
            print("ready", flush=True)
            ready = True
        for key, _ in chosen.select(timeout=0.01):
            if key.data == STOP:
                for conn in held:
                    conn.close()
                print(json.dumps({"answers": answers, "failed": failed, "opened": opened}))
                return
            conn = key.data
            with contextlib.suppress(OSError):
                got = conn.recv(65_536)
                if got:
                    error = json.loads(got.split(b"\n")[0]).get("error", {})
                    answers[str(error.get("message"))] += 1
            chosen.unregister(conn)
            held.discard(conn)
            conn.close()


def trickle(path: str, gap_s: float) -> None:
    request = b'{"v":1,"op":"hello","args":{' + b" " * 10_000
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    start = time.monotonic()
    answer = b""
    conn.settimeout(gap_s)
    for byte in request:
        try:
            answer = conn.recv(65_536)
        except TimeoutError:  # still open: the next byte
            with contextlib.suppress(OSError):
                conn.sendall(bytes([byte]))
            continue
        except OSError:
            pass
        break
    print(json.dumps({"open_s": time.monotonic() - start, "answer": answer.decode()}))


def main() -> None:
    mode, user, path, amount = sys.argv[1:]
    become(user)
    if mode == "flood":
        flood(path, int(amount))
    else:
        trickle(path, float(amount))


if __name__ == "__main__":
    main()
