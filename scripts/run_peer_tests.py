"""Run a peer project's own tests on the peer and on meshconf's compat layer, and print a table.

Given a checkout of torchtitan's or d9d's repository at a release, and a Python environment
with that release and torch installed (CPU is enough), this copies the peer's test files that
construct its mesh object into a scratch folder twice: once as they are, once with one more
line after each import of that object, which imports meshconf's drop-in under the same name.
It runs both copies with pytest (tests the peer marks ``distributed`` under torchrun, 8 ranks)
and prints how many pass on each, counting apart the tests that fail on the peer because
they need CUDA. Not run by the test suite: it needs the peer's repository and environment.

    python scripts/run_peer_tests.py \\
        --run torchtitan-0.2.1 ~/src/torchtitan-v0.2.1 ~/venvs/tt021/bin/python \\
        --run d9d-0.24.0 ~/src/d9d ~/venvs/d9d/bin/python
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

MESHCONF_ROOT = Path(__file__).resolve().parent.parent
CUDA_FAILURE = re.compile(r"CUDA|cuda|NCCL|nccl|GPU|gpu")
TORCHRUN_RANKS = 8


@dataclass(frozen=True)
class Peer:
    """Where a peer's tests are and what meshconf swaps in for them."""

    distribution: str
    release: str
    tests: str  # glob under the checkout
    support: tuple[str, ...]  # more files the tests need (conftest), copied and swapped too
    sources: tuple[str, ...]  # modules the swapped names are imported from
    target: str  # meshconf's module
    names: tuple[str, ...]  # names meshconf's module gives
    constructed: str  # a test is counted when it (or a helper it calls) calls this name
    torchrun_marker: str | None = None


PEERS = {
    "torchtitan-0.2.1": Peer(
        "torchtitan",
        "0.2.1",
        "tests/unit_tests/test_*.py",
        (),
        ("torchtitan.distributed.parallel_dims", "torchtitan.distributed"),
        "meshconf.compat.torchtitan_v0_2",
        ("ParallelDims",),
        "ParallelDims",
    ),
    "torchtitan-0.3.0": Peer(
        "torchtitan",
        "0.3.0",
        "tests/unit_tests/test_*.py",
        (),
        ("torchtitan.distributed.parallel_dims", "torchtitan.distributed"),
        "meshconf.compat.torchtitan",
        ("ParallelDims",),
        "ParallelDims",
    ),
    "d9d-0.24.0": Peer(
        "d9d",
        "0.24.0",
        "test/d9d_test/core/test_dist_context.py",
        (
            "test/d9d_test/conftest.py",
            "test/d9d_test/__init__.py",
            "test/d9d_test/core/__init__.py",
        ),
        ("d9d.core.dist_context",),
        "meshconf.compat.d9d",
        (
            "DeviceMeshParameters",
            "BATCH_DOMAIN",
            "DENSE_DOMAIN",
            "EXPERT_DOMAIN",
            "FLAT_DOMAIN",
            "REGULAR_DOMAIN",
        ),
        "DeviceMeshParameters",
        torchrun_marker="distributed",
    ),
}


def _uses(node: ast.AST, name: str) -> bool:
    """Whether ``node`` calls ``name`` or one of its class methods (``name.from_config``)."""
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        function = call.func
        if isinstance(function, ast.Attribute):
            function = function.value
        if isinstance(function, ast.Name) and function.id == name:
            return True
    return False


def counted_tests(path: Path, name: str) -> list[str]:
    """Node ids (relative to the file) of the tests that call ``name`` themselves, through a
    method of their class, or through a module-level function they call."""
    tree = ast.parse(path.read_text())
    helpers = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and not node.name.startswith("test")
        and _uses(node, name)
    }

    def counts(test: ast.AST, owner: ast.ClassDef | None) -> bool:
        if _uses(test, name) or any(_uses(test, helper) for helper in helpers):
            return True
        return owner is not None and any(
            isinstance(member, ast.FunctionDef)
            and not member.name.startswith("test")
            and _uses(member, name)
            for member in owner.body
        )

    ids = []
    for node in tree.body:
        if (
            isinstance(node, ast.FunctionDef)
            and node.name.startswith("test")
            and counts(node, None)
        ):
            ids.append(node.name)
        if isinstance(node, ast.ClassDef):
            ids.extend(
                f"{node.name}::{member.name}"
                for member in node.body
                if isinstance(member, ast.FunctionDef)
                and member.name.startswith("test")
                and counts(member, node)
            )
    return ids


def swap_imports(source: str, peer: Peer) -> str:
    """``source`` with meshconf's import of the peer's names after each import of them."""
    lines = source.splitlines()
    inserts: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom) or node.module not in peer.sources:
            continue
        names = [alias for alias in node.names if alias.name in peer.names]
        if names:
            imported = ", ".join(
                alias.name + (f" as {alias.asname}" if alias.asname else "") for alias in names
            )
            indent = " " * node.col_offset
            assert node.end_lineno is not None
            inserts.append((node.end_lineno, f"{indent}from {peer.target} import {imported}"))
    for line_number, text in sorted(inserts, reverse=True):
        lines.insert(line_number, text)
    return "\n".join(lines) + "\n"


def _outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """``file.py::Class::test[param]`` -> (passed/failed/skipped, the failure's text), from a
    JUnit report."""
    results: dict[str, tuple[str, str]] = {}
    if not report.exists():
        return results
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        owner = [parts.pop()] if parts and parts[-1][:1].isupper() else []
        key = "::".join(["/".join(parts) + ".py", *owner, case.get("name", "")])
        state, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                state = "skipped" if child.tag == "skipped" else "failed"
                message = f"{child.get('message', '')}\n{child.text or ''}"
        results[key] = (state, message)
    return results


def _run_pytest(
    python: str, root: Path, ids: list[str], env: dict[str, str], marker: str | None
) -> dict[str, tuple[str, str]]:
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600", *ids]
    results: dict[str, tuple[str, str]] = {}
    if marker is None:
        report = root / "report.xml"
        subprocess.run(
            [*command, f"--junitxml={report}"],
            cwd=root,
            env=env,
            capture_output=True,
            timeout=3600,
            check=False,
        )
        return _outcomes(report)
    local = root / "report_local.xml"
    subprocess.run(
        [*command, "-m", f"not {marker}", f"--junitxml={local}"],
        cwd=root,
        env=env,
        capture_output=True,
        timeout=3600,
        check=False,
    )
    results.update(_outcomes(local))
    runner = root / "run_rank.py"
    runner.write_text(
        "import os, sys, pytest\n"
        f"sys.exit(pytest.main({[*command[3:], '-m', marker]!r} + "
        f"[f'--junitxml={root}/report_rank{{os.environ[\"RANK\"]}}.xml']))\n"
    )
    torchrun = [
        python,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={TORCHRUN_RANKS}",
        str(runner),
    ]
    # A hung rank leaves its report unwritten, and its tests count as failed.
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(torchrun, cwd=root, env=env, capture_output=True, timeout=900, check=False)
    per_rank = [_outcomes(root / f"report_rank{rank}.xml") for rank in range(TORCHRUN_RANKS)]
    for key in set().union(*per_rank):
        states = [ranks.get(key, ("failed", "no result from this rank")) for ranks in per_rank]
        failed = [state for state in states if state[0] != "passed"]
        results[key] = failed[0] if failed else ("passed", "")
    return results


def run(peer: Peer, checkout: Path, python: str, swapped: bool) -> dict[str, tuple[str, str]]:
    """Outcome of every counted test, by ``file::test`` id."""
    with tempfile.TemporaryDirectory(prefix="peer-tests-") as scratch:
        root = Path(scratch)
        ids: list[str] = []
        files = sorted(checkout.glob(peer.tests)) + [checkout / path for path in peer.support]
        for source in files:
            if not source.exists():
                continue
            relative = source.relative_to(checkout)
            target = root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            text = source.read_text()
            target.write_text(swap_imports(text, peer) if swapped else text)
            if source.name.startswith("test_"):
                ids.extend(
                    f"{relative}::{test}" for test in counted_tests(source, peer.constructed)
                )
        for folder in {path.parent for path in root.rglob("*.py")}:
            init = folder / "__init__.py"
            if not init.exists() and folder != root:
                init.write_text("")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if swapped:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(MESHCONF_ROOT), env.get("PYTHONPATH")])
            )
        outcomes = _run_pytest(python, root, ids, env, peer.torchrun_marker)
        results = {key: value for key, value in outcomes.items() if key.split("[")[0] in set(ids)}
        for test_id in ids:
            if not any(key.split("[")[0] == test_id for key in results):
                results[test_id] = ("failed", "not collected")
        shutil.rmtree(root, ignore_errors=True)
        return results


def installed_version(python: str, distribution: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "not installed"


Outcomes = dict[str, tuple[str, str]]


def _passed(results: Outcomes, ids: list[str]) -> int:
    return sum(results.get(test_id, ("failed", ""))[0] == "passed" for test_id in ids)


def table_row(peer: Peer, on_peer: Outcomes, on_meshconf: Outcomes) -> tuple[str, list[str]]:
    """The table's row for one peer, and a line for each test that needs CUDA on the peer
    or ends otherwise on meshconf than on the peer."""
    cuda = [
        test_id
        for test_id, (state, message) in on_peer.items()
        if state != "passed" and CUDA_FAILURE.search(message)
    ]
    cpu = [test_id for test_id in on_peer if test_id not in cuda]
    files = sorted({test_id.split("::")[0].rsplit("/", 1)[-1] for test_id in on_peer})
    row = (
        f"| {peer.distribution} {peer.release}: the {len(on_peer)} tests of "
        f"{', '.join(files)} that construct `{peer.constructed}` "
        f"| {_passed(on_peer, cpu)} of {len(cpu)} | {_passed(on_meshconf, cpu)} of {len(cpu)} "
        f"| {f'{_passed(on_meshconf, cuda)} of {len(cuda)}' if cuda else 'none'} |"
    )
    lines = []
    for test_id, (peer_state, _) in on_peer.items():
        state, message = on_meshconf.get(test_id, ("failed", "no result"))
        if test_id in cuda or peer_state != state:
            first = next((line for line in message.splitlines() if line.strip()), "")
            lines.append(
                f"- {peer.distribution} {peer.release} `{test_id}`: "
                f"{'needs CUDA on the peer; ' if test_id in cuda else ''}peer {peer_state}, "
                f"meshconf {state}{f': {first[:160]}' if state != 'passed' else ''}"
            )
    return row, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--run",
        nargs=3,
        action="append",
        required=True,
        metavar=("PEER", "CHECKOUT", "PYTHON"),
        help=f"PEER is one of {', '.join(PEERS)}",
    )
    args = parser.parse_args()
    rows, details = [], []
    for name, checkout, python in args.run:
        peer = PEERS[name]
        version = installed_version(python, peer.distribution)
        if version != peer.release:
            print(
                f"{python} has {peer.distribution} {version}, not {peer.release}", file=sys.stderr
            )
            return 2
        on_peer = run(peer, Path(checkout), python, swapped=False)
        on_meshconf = run(peer, Path(checkout), python, swapped=True)
        row, lines = table_row(peer, on_peer, on_meshconf)
        rows.append(row)
        details.extend(lines)
    print(
        "| peer tests, import swapped only | pass on the peer (CPU, gloo) | pass on meshconf "
        "| need CUDA on the peer: pass on meshconf (CPU, gloo) |"
    )
    print("|---|---:|---:|---:|")
    print("\n".join(rows))
    if details:
        print()
        print("\n".join(details))
    return 0


if __name__ == "__main__":
    sys.exit(main())
