"""A fork server for the tests' ``meshconf`` commands and Python scripts.

The docs hold a few hundred ``meshconf`` commands and a few dozen Python snippets, and
tests/test_measure.py runs ``meshconf measure`` a dozen times. Each one started as a fresh
interpreter spends its first seconds of CPU importing: about 0.4 s for pydantic and the
models, 6 s more for torch, torch._dynamo (which FSDP2 and DTensor import lazily) and the
runtime. The server imports those once; for each request it forks a child that puts the
request's standard streams in place, changes to its directory and environment, and runs
``meshconf.cli.main`` as the installed script does, or a script as ``python SCRIPT`` does
(``runpy.run_path`` as ``__main__``). bash still runs every docs command line as the docs show
it; only the ``meshconf`` it finds first on PATH is a small shim (:data:`SHIM`) that hands its
arguments, directory, environment and streams to this server. The test code hands its own
requests over with :func:`run`.

What differs from a fresh process: the modules are already imported (a script still imports
what it uses into its own globals, so a missing import still fails), and the child leaves
with ``os._exit`` after flushing its streams. tests/test_cli.py and tests/test_wheel.py run
real processes.

Run as ``python tests/forkserver.py SOCKET [MODULE...]``: it imports the MODULEs, then serves
until the socket is removed. :func:`serving` starts one for a test.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
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

#: What the runtime's tests and snippets import lazily: loaded once in the server.
TORCH_MODULES = ("meshconf.runtime", "torch._dynamo", "torch.distributed.tensor")


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    (length,) = _LENGTH.unpack(data[: _LENGTH.size])
    data = data[_LENGTH.size :]
    while len(data) < length:
        data += connection.recv(length - len(data))
    return json.loads(data), fds


def _run(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the command or the script, run it, and leave with its exit
    code."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    script = request.get("script")
    try:
        if script is not None:
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            runpy.run_path(script, run_name="__main__")
            code: object = 0
        else:
            from meshconf.cli import main

            code = main()
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


def serve(path: str, preload: Sequence[str] = ()) -> None:
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")  # as main() does first
    from meshconf.cli import build_parser

    build_parser()  # imports every verb's module once, for every child
    for module in preload:
        importlib.import_module(module)
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


@contextlib.contextmanager
def serving(folder: Path, preload: Sequence[str] = (), timeout: float = 120) -> Iterator[Path]:
    """A server on ``folder / "socket"``, its MODULEs imported, for as long as the block runs;
    yields the socket's path."""
    socket_path = folder / "socket"
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(socket_path), *preload],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=folder,
    )
    try:
        deadline = time.monotonic() + timeout
        while not socket_path.exists():
            assert server.poll() is None and time.monotonic() < deadline, "no fork server"
            time.sleep(0.05)
        yield socket_path
    finally:
        socket_path.unlink(missing_ok=True)  # the server stops once its requests are done
        try:
            server.wait(timeout)
        except subprocess.TimeoutExpired:
            server.kill()


def run(
    socket_path: Path,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: dict[str, str],
    script: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``meshconf ARGV`` (or, with ``script``, ``python SCRIPT``) in the server, as a
    subprocess would: its exit code and its standard output and error, apart.

    Raises ``subprocess.TimeoutExpired`` when it has not ended after ``timeout`` seconds."""
    request: dict[str, Any] = {"argv": list(argv), "cwd": str(cwd), "env": env}
    if script is not None:
        request["script"] = script
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(socket_path))
        data = json.dumps(request).encode()
        socket.send_fds(connection, [_LENGTH.pack(len(data)) + data], [null, out_write, err_write])
    finally:
        for fd in (null, out_write, err_write):
            os.close(fd)
    chunks: dict[int, list[bytes]] = {out_read: [], err_read: [], connection.fileno(): []}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(list(argv), timeout)
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    chunks[key.fd].append(chunk)
                else:
                    selector.unregister(key.fd)
    os.close(out_read)
    os.close(err_read)
    code = int(b"".join(chunks[connection.fileno()]))
    connection.close()
    stdout, stderr = (b"".join(chunks[fd]).decode() for fd in (out_read, err_read))
    return subprocess.CompletedProcess(list(argv), code, stdout, stderr)


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
