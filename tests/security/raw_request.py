"""Send one hand-written request to a control socket as another Unix account, the way a hostile
operator would, bypassing every check the CLI makes: `python -m tests.security.raw_request USER
SOCKET` (as root) reads the JSON request on stdin and prints the server's answer line.

It starts as root, drops to USER's uid, gid and groups for good (tests.integration.as_account),
then connects: the server sees USER, by SO_PEERCRED.
"""

from __future__ import annotations

import socket
import sys

from tests.integration.as_account import become


def main() -> None:
    user, path = sys.argv[1:]
    request = sys.stdin.buffer.read().rstrip(b"\n") + b"\n"
    become(user)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(60)
    try:
        conn.connect(path)
        conn.sendall(request)
        with conn.makefile("rb") as stream:
            sys.stdout.buffer.write(stream.readline())
    finally:
        conn.close()


if __name__ == "__main__":
    main()
