"""A fork server for the docs test's ``meshconf`` commands.

The docs hold a few hundred ``meshconf`` commands, and each one started as a fresh interpreter
spends about 0.4 s of CPU importing pydantic and building the models before it reads its
arguments. bash still runs every command line as the docs show it; only the ``meshconf`` it
finds first on PATH is a small shim (:data:`SHIM`) that hands its arguments, working
directory, environment and standard streams to this server. The server imported the command
line once; for each command it forks a child that puts those streams in place, changes to that
directory and environment, and runs ``meshconf.cli.main`` as the installed script does. The
shim exits with the child's exit code.

What differs from a fresh process: the modules the command line imports are already loaded,
and the child leaves with ``os._exit`` after flushing its streams. tests/test_cli.py and
tests/test_wheel.py run real processes.

Run as ``python tests/forkserver.py SOCKET``; it serves until the socket is removed.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Any

_LENGTH = struct.Struct("!Q")

#: The ``meshconf`` the docs' commands run: ``{python}`` is this interpreter. ``-I`` keeps it
#: quick (no site-packages, no environment); it needs only the standard library.
SHIM = """\
#!{python} -I
import json, os, socket, struct, sys

connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.connect(os.environ["MESHCONF_FORKSERVER"])
request = json.dumps({{"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(connection, [struct.pack("!Q", len(request)) + request], [0, 1, 2])
reply = b""
while chunk := connection.recv(64):
    reply += chunk
sys.exit(int(reply))
"""


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    (length,) = _LENGTH.unpack(data[: _LENGTH.size])
    data = data[_LENGTH.size :]
    while len(data) < length:
        data += connection.recv(length - len(data))
    return json.loads(data), fds


def _run(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the command, run it, and leave with its exit code."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    from meshconf.cli import main

    try:
        code: object = main()
    except SystemExit as leaving:
        code = leaving.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)  # as sys.exit("message") does
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def serve(path: str) -> None:
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")  # as main() does first
    from meshconf.cli import build_parser

    build_parser()  # imports every verb's module once, for every child
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    running: dict[int, socket.socket] = {}
    while os.path.exists(path) or running:
        ready, _, _ = select.select([listener], [], [], 0.01 if running else 0.5)
        if ready:
            connection, _ = listener.accept()
            request, fds = _receive(connection)
            pid = os.fork()
            if pid == 0:
                listener.close()
                connection.close()
                _run(request, fds)
            for fd in fds:
                os.close(fd)
            running[pid] = connection
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                connection = running.pop(pid)
                connection.sendall(str(os.waitstatus_to_exitcode(status)).encode())
                connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
