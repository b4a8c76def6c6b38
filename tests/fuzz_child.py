"""Runs a batch of meshconf command lines in one process, under a memory limit and a time
limit per command, and reports what each did as JSON on stdout.

Used by tests/test_fuzz*.py: starting one interpreter per hostile input would make the suite
slow; one process per batch keeps it fast while each command still runs through
``meshconf.cli.main`` exactly as ``python -m meshconf`` does.

The time limit counts CPU time (user and system), so that a loaded machine does not fail a
command that is fast; a wall-clock limit ten times as long catches a command that waits.

Input (stdin, JSON): ``{"memory_mib": N, "seconds": S, "cases": [{"argv": [...], "cwd": DIR,
"env": {...}}, ...]}``. Output: one object per case with the exit code, stdout, stderr, the
time taken, the files changed under ``cwd``, and ``crash`` (a traceback) when the command
raised instead of exiting.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any


class _TimeUp(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    raise _TimeUp


def _snapshot(folder: str) -> dict[str, tuple[int, int]]:
    found = {}
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            info = path.stat()
            found[str(path.relative_to(folder))] = (info.st_size, info.st_mtime_ns)
    return found


def run_case(case: dict[str, Any], seconds: float) -> dict[str, Any]:
    from meshconf.cli import main

    os.chdir(case["cwd"])
    saved_env = dict(os.environ)
    os.environ.update(case.get("env", {}))
    before = _snapshot(case["cwd"])
    out, err = io.StringIO(), io.StringIO()
    code: int | str
    crash = None
    start, wall = time.process_time(), time.perf_counter()
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, 10 * seconds)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(case["argv"])
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
    except _TimeUp:
        code = "timeout"
    except BaseException:  # the point is to catch anything that escapes as a traceback
        code = "crash"
        crash = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
    elapsed, wall = time.process_time() - start, time.perf_counter() - wall
    api = _api(case["api"], seconds) if case.get("api") else None
    os.environ.clear()
    os.environ.update(saved_env)
    after = _snapshot(case["cwd"])
    return {
        "code": code,
        "stdout": out.getvalue()[:200_000],
        "stdout_bytes": len(out.getvalue().encode("utf-8", "surrogatepass")),
        "stderr": err.getvalue()[:20_000],
        "seconds": elapsed,
        "wall_seconds": wall,
        "changed": sorted(
            name for name in set(before) | set(after) if before.get(name) != after.get(name)
        ),
        "crash": crash,
        "api": api,
    }


def _api(call: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``load_config`` on the same input: it returns, or raises a MeshconfError."""
    from meshconf import MeshconfError, load_config

    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        load_config(call["path"], call["overrides"])
        return {"raised": None, "crash": None}
    except MeshconfError as error:
        return {"raised": type(error).__name__, "crash": None}
    except _TimeUp:
        return {"raised": None, "crash": "timeout"}
    except BaseException:  # anything but a MeshconfError is a failure to report
        return {"raised": None, "crash": traceback.format_exc()}
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


def main() -> None:
    request = json.load(sys.stdin)
    limit = request["memory_mib"] * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGPROF, _on_alarm)
    results = [run_case(case, request["seconds"]) for case in request["cases"]]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()
