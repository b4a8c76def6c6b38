"""Hostile inputs through the command line, generated per class of failure, run in batches
(tests/fuzz_child.py) under a memory limit and a per-command time limit.

Every command must exit 1 with only located lines (``FILE:LINE:COL: ...``, ``FILE: ...`` or
``override '...': ...``) or exit 2 with one ``meshconf: error:`` line; never
a traceback, never past the time limit (5 s of CPU time), never writing a file. Commands on valid but huge
inputs must exit 0 with bounded output.

``MESHCONF_FUZZ_LONG=1`` runs ten times as many generated cases (a few minutes).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

LONG = os.environ.get("MESHCONF_FUZZ_LONG") == "1"
SCALE = 10 if LONG else 1
# A hang or a blow-up runs past any bound; the slowest command a user may legitimately give
# (plan on 720,720 GPUs: 89,600 rows to rank) takes 1 to 2.7 s of CPU on the 2-core machines
# CI runs on, depending on the machine, so the bound leaves it room.
SECONDS = 5.0
MEMORY_MIB = 600
#: Bounded output of a valid command, whatever the world size.
MAX_OUTPUT_BYTES = 200_000


@dataclass
class Case:
    name: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    valid: bool = False  # exit 0 expected, with bounded output
    may_pass: bool = False  # exit 0 allowed (a generated input that happens to be valid)
    code: int | None = None  # this exit code, when the class of input has one
    strict_json: bool = False  # standard output is JSON with finite numbers only


def run_batch(cases: list[Case], tmp_path: Path) -> list[tuple[Case, dict[str, Any]]]:
    payload = []
    for index, case in enumerate(cases):
        folder = tmp_path / f"case{index}"
        folder.mkdir()
        for name, content in case.files.items():
            (folder / name).write_bytes(content)
        entry: dict[str, Any] = {"argv": case.argv, "cwd": str(folder), "env": case.env}
        if case.argv[0] == "validate" and case.argv[1] in case.files:
            overrides = [case.argv[i + 1] for i, part in enumerate(case.argv) if part == "-o"]
            entry["api"] = {"path": case.argv[1], "overrides": overrides}
        payload.append(entry)
    request = {"memory_mib": MEMORY_MIB, "seconds": SECONDS, "cases": payload}
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "fuzz_child.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        timeout=60 * SCALE + 5 * len(cases),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return list(zip(cases, json.loads(result.stdout), strict=True))


_LOCATED = re.compile(r"^(?:override '.*?': |[^:\n]+?:(?:\d+:\d+:)? ).+$")


def check(case: Case, outcome: dict[str, Any]) -> None:
    head = {name: content[:120] for name, content in case.files.items()}
    where = f"{case.name}: argv={case.argv[:6]} files={head} -> {outcome}"[:3000]
    assert outcome["crash"] is None, where
    assert outcome["code"] != "timeout", where
    assert outcome["seconds"] < SECONDS, where
    assert outcome["changed"] == [], where
    assert "Traceback" not in outcome["stdout"] + outcome["stderr"], where
    if outcome["api"] is not None:
        assert outcome["api"]["crash"] is None, where
        assert (outcome["api"]["raised"] is None) == (outcome["code"] == 0), where
    if case.code is not None:
        assert outcome["code"] == case.code, where
    if case.valid:
        assert outcome["code"] == 0, where
        assert outcome["stdout_bytes"] < MAX_OUTPUT_BYTES, where
        if case.strict_json:
            json.loads(outcome["stdout"], parse_constant=_not_a_number(where))
        return
    if case.may_pass and outcome["code"] == 0:
        return
    assert outcome["code"] in (1, 2), where
    if outcome["code"] == 1:
        # The problems, on standard output (validate, convert) or on standard error when
        # they stop a command that prints something else (a plan's model file).
        lines = (outcome["stdout"] or outcome["stderr"]).splitlines()
        assert lines, where
        assert len(lines) <= 51, where  # at most 50 problems and a count of the rest
        assert all(_LOCATED.match(line) for line in lines), where
    else:
        lines = outcome["stderr"].splitlines()
        assert lines[-1].startswith("meshconf: error: "), where
        assert sum(line.startswith("meshconf: error:") for line in lines) <= 1, where


def _not_a_number(where: str) -> Any:
    """``json.loads``' hook for ``NaN`` and ``Infinity``, which JSON does not have."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in the JSON: {where}")

    return refuse


def validate(text: str | bytes, *extra: str, env: dict[str, str] | None = None) -> Case:
    content = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return Case("validate", ["validate", "c.yaml", *extra], {"c.yaml": content}, env or {})


# --- 1. interpolation bombs -------------------------------------------------------------------


def interpolation_bombs(rng: random.Random) -> Iterator[Case]:
    for _ in range(12 * SCALE):
        fan, levels = rng.randint(3, 12), rng.randint(5, 9)
        style = rng.choice(["list", "string", "select", "dict"])
        lines = ["world_size: 8", "a0: xxxxxxxxxxxxxxxx"]
        for level in range(1, levels + 1):
            ref = f"a{level - 1}"
            if style == "list":
                body = "[" + ", ".join([f'"${{{ref}}}"'] * fan) + "]"
            elif style == "string":
                body = '"' + f"${{{ref}}}" * fan + '"'
            elif style == "select":
                body = "[" + ", ".join([f'"${{oc.select:{ref},0}}"'] * fan) + "]"
            else:
                body = "{" + ", ".join(f'k{i}: "${{{ref}}}"' for i in range(fan)) + "}"
            lines.append(f"a{level}: {body}")
        if rng.random() < 0.5:
            yield validate("\n".join(lines) + "\n")
        else:  # the same bomb, built by overrides
            overrides = [f"++{line.replace(': ', '=', 1)}" for line in lines[1:]]
            case = validate("world_size: 8\n", *[part for o in overrides for part in ("-o", o)])
            yield case
    chain = "world_size: 8\nc0: 8\n" + "".join(f"c{i}: ${{c{i - 1}}}\n" for i in range(1, 5000))
    yield validate(chain)
    yield validate("world_size: " + "${oc.select:" * 3000 + "x" + ",1}" * 3000 + "\nx: 8\n")


# --- 2. reading -------------------------------------------------------------------------------


def reading() -> Iterator[Case]:
    for path in ("/dev/zero", "/dev/urandom", "/dev/null", "."):
        yield Case("read", ["validate", path])
        yield Case("read", ["convert", path])
    yield Case(
        "read",
        ["validate", "big.yaml"],
        {"big.yaml": ("a: '" + "é" * (2200 * 1024) + "'\n").encode()},
    )


# --- 3. huge worlds ---------------------------------------------------------------------------


def huge_worlds(rng: random.Random) -> Iterator[Case]:
    sizes = [2**22, 2**24, 10**8, 2_147_483_647, 2_095_133_040]
    sizes += [rng.randint(2**20, 2_147_483_647) for _ in range(2 * SCALE)]
    for size in sizes:
        files = {"w.yaml": f"world_size: {size}\n".encode()}
        yield Case("show", ["show", "w.yaml"], files, valid=True)
        yield Case(
            "show",
            ["show", "w.yaml", "--format", "json", "--rank", str(size - 1)],
            files,
            valid=True,
        )
        yield Case("show", ["show", "w.yaml", "--full-groups"], files)
        yield Case("simulate", ["simulate", "w.yaml"], files)
    yield Case("plan", ["plan", "--world-size", "2095133040"])
    yield Case("plan", ["plan", "--world-size", "1441440"])


# --- 4. tags and deep structures ----------------------------------------------------------------

TAGS = [
    "!!int",
    "!!float",
    "!!bool",
    "!!null",
    "!!str",
    "!!timestamp",
    "!!binary",
    "!!set",
    "!!omap",
    "!!pairs",
    "!!map",
    "!!seq",
    "!!python/name:os.system",
    "!foo",
    "!!merge",
]
TEXTS = [
    "abc",
    "0b10",
    "1_000",
    "maybe",
    "yes",
    "garbage",
    "2020-01-01",
    "0x1G",
    "1e400",
    "-",
    "~",
    "''",
    "8",
    "[1]",
    "{a: 1}",
    ".nan",
    "0o9",
    "1:00",
]


def tags(rng: random.Random) -> Iterator[Case]:
    for case in _tagged(rng):
        case.may_pass = True  # such as tp: !!int 8
        yield case
    yield validate("world_size: ${oc.env:X}\n", env={"X": "1" * 100_000})
    yield validate("world_size: ${oc.env:X}\n", env={"X": "-" + "9" * 5000})


def _tagged(rng: random.Random) -> Iterator[Case]:
    for _ in range(25 * SCALE):
        tag, text = rng.choice(TAGS), rng.choice(TEXTS)
        where = rng.choice(["value", "key", "override", "domain"])
        if where == "value":
            yield validate(f"world_size: 8\ndegrees:\n  tp: {tag} {text}\n")
        elif where == "key":
            yield validate(f"world_size: 8\n{tag} {text}: 3\n")
        elif where == "override":
            yield validate("world_size: 8\n", "-o", f"degrees.tp={tag} {text}")
        else:
            yield validate(f"world_size: 8\ndomains:\n  d: {tag} {{tp, dp_shard, pp}}\n")


# --- 5. many problems -----------------------------------------------------------------------------


def many_problems(rng: random.Random) -> Iterator[Case]:
    chain = "derived:\n  d0: tp\n" + "".join(f"  d{i}: d{i - 1}\n" for i in range(1, 20_000))
    yield Case(
        "chain",
        ["validate", "c.yaml"],
        {"c.yaml": ("world_size: 8\n" + chain).encode()},
        valid=True,
    )
    unknown = "".join(f"  x{i}: unknown{rng.randint(0, 10**6)} * tp\n" for i in range(3000))
    yield validate("world_size: 8\nderived:\n" + unknown)
    dims = ", ".join(f"z{i}" for i in range(2000))
    derived = "".join(f"  y{i}: tp\n" for i in range(1500))
    yield validate(f"world_size: 8\nderived:\n{derived}domains:\n  d: [{dims}]\n")
    yield validate("world_size: 8\n" + "".join(f"k{i}: 1\n" for i in range(20_000)))


# --- 7. characters and names -----------------------------------------------------------------------


def characters(rng: random.Random) -> Iterator[Case]:
    base = "world_size: 8\ndegrees:\n  tp: 2\n"
    for _ in range(15 * SCALE):
        at = rng.randint(0, len(base))
        char = rng.choice(["\x00", "\ufffe", "\uffff", "\x07", "\x1b", "\ud800", "\x85", "\u2028"])
        case = validate(base[:at] + char + base[at:])
        case.may_pass = char in "\x85\u2028"  # YAML allows both (as line breaks)
        yield case
    raw = base.encode()
    for _ in range(5 * SCALE):
        at = rng.randint(0, len(raw))
        yield validate(raw[:at] + bytes([rng.randint(0x80, 0xFF)]) + raw[at:])
    yield validate("a: ${world_size}\nworld_size: 8\n? null\n: 3\n")
    yield validate("a: ${world_size}\nworld_size: 8\nb: !!set {x}\n")
    yield validate("a: ${world_size}\nworld_size: 8\nb: !!timestamp 2020-01-01\n")
    name = "bad\nname.yaml"
    yield Case("newline", ["validate", name], {name: b"world_size: 8\x00\n"})


# --- 8. writes --------------------------------------------------------------------------------------

TOML = b"[parallelism]\ntensor_parallel_degree = 2\n"


def writes() -> Iterator[Case]:
    yield Case(
        "convert",
        ["convert", "job.toml", "--world-size", "8", "--out", "job.toml"],
        {"job.toml": TOML},
    )
    yield Case(
        "convert",
        ["convert", "job.toml", "--world-size", "8", "--out", "./job.toml"],
        {"job.toml": TOML},
    )
    config = b"world_size: 8\n"
    yield Case("render", ["render", "c.svg", "--out", "c.svg"], {"c.svg": config})


# --- 9. plan orders ---------------------------------------------------------------------------

FACTORS = ["pp", "dp_replicate", "dp_shard", "cp", "tp"]


def plan_orders(rng: random.Random) -> Iterator[Case]:
    """Every permutation is a valid order: on large composite worlds, with and without
    experts, each plans within the limits (or refuses the pins in one line)."""
    for _ in range(10 * SCALE):
        order = rng.sample(FACTORS, len(FACTORS))
        world = rng.choice([2**20, 65536, 3 * 2**18, 2_147_483_647, 720720])
        argv = ["plan", "--world-size", str(world), "--order", ",".join(order)]
        argv += ["--gpus-per-node", str(rng.choice([1, 3, 8, 4096]))]
        if rng.random() < 0.5:
            argv += ["--ep", str(rng.choice([2, 3, 8, 64]))]
        if rng.random() < 0.3:
            argv += ["--cp", str(rng.choice([2, 4]))]
        if rng.random() < 0.3:
            argv += ["--emit", "1"]
        yield Case("plan-order", argv, may_pass=True)
    hostile = [
        "," * 100_000,
        "tp," * 30_000,
        "x" * 100_000,
        ",".join(FACTORS * 5000),
        ",".join(rng.choice(["pp", "dp", "ep", "é", "\u2028", "tp ", ""]) for _ in range(20_000)),
    ]
    for text in hostile:
        yield Case("plan-order", ["plan", "--world-size", "64", "--order", text])


def all_cases() -> list[Case]:
    rng = random.Random(13)
    return [
        *interpolation_bombs(rng),
        *reading(),
        *huge_worlds(rng),
        *tags(rng),
        *many_problems(rng),
        *characters(rng),
        *writes(),
        *plan_orders(rng),
    ]


@pytest.mark.timeout(600 if LONG else 120, method="thread")
def test_hostile_command_lines(tmp_path: Path) -> None:
    cases = all_cases()
    failures = []
    for case, outcome in run_batch(cases, tmp_path):
        try:
            check(case, outcome)
        except AssertionError as error:
            failures.append(str(error))
    assert not failures, "\n\n".join(failures[:10]) + f"\n\n{len(failures)} of {len(cases)} failed"


def test_special_files_through_python_m(tmp_path: Path) -> None:
    """A FIFO without a writer, a 2 GB sparse file and a link to the input, through the real
    ``python -m meshconf`` (the batch runner cannot hold a FIFO open)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    sparse = tmp_path / "sparse.yaml"
    with open(sparse, "wb") as file:
        file.truncate(2 * 1024**3)
    (tmp_path / "job.toml").write_bytes(TOML)
    (tmp_path / "link.toml").symlink_to("job.toml")

    def meshconf(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "meshconf", *args],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    result = meshconf("validate", "fifo.yaml")
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        "meshconf: error: fifo.yaml: is not a regular file (a FIFO, device or socket); "
        "meshconf reads config files\n"
    )
    result = meshconf("validate", "sparse.yaml")
    assert (result.returncode, result.stderr) == (1, "")
    assert result.stdout == (
        "sparse.yaml: 2147483648 bytes, more than the 4 MiB a config may have; "
        "this is not a mesh config\n"
    )
    result = meshconf("convert", "job.toml", "--world-size", "8", "--out", "link.toml")
    assert result.returncode == 2
    assert (
        result.stderr == "meshconf: error: --out link.toml is the same file as the input "
        "job.toml; choose another file\n"
    )
    assert (tmp_path / "job.toml").read_bytes() == TOML
