"""Checking config files: ``meshconf validate`` against ``check-jsonschema`` on the same files.

Run from the repository root with the interpreter meshconf is installed in (the dev extra
brings check-jsonschema and pre-commit)::

    python benchmarks/validate_speed.py                      # full run (about 1.5 minutes)
    python benchmarks/validate_speed.py --quick              # smoke run: 1 and 100 files, 3 s
    python benchmarks/validate_speed.py --quick --pre-commit # and the hooks: 15 to 25 s

Prints Markdown tables. The script generates realistic configs with a seeded RNG, 10% of
which break one formula rule while keeping every key, type and range valid, so the JSON
Schema accepts them.

1. ``meshconf validate FILES`` and ``check-jsonschema --schemafile
   schemas/meshconf.schema.json FILES``, as a user runs them: one process over all files,
   interpreter start included. It runs on 1, 100 and 1,000 files, with the two tools
   alternating which goes first. Each table row counts the files the tool flagged.
2. The same two checks as pre-commit hooks in a consumer git repository. meshconf's hook
   comes from a committed copy of this repository, and check-jsonschema's from a
   ``repo: local`` hook. ``pre-commit run HOOK --all-files`` is timed warm, and the first run,
   which installs the hook's environment from the package index, is timed once on its own.
   pre-commit and pip use private caches in a temporary directory.

Nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from core_speed import (  # the benchmarks folder is on sys.path[0]
    CUSTOM_DOMAIN_SETS,
    write_auto_style,
)

from meshconf import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "meshconf.schema.json"
BIN = Path(sys.executable).parent
CONFIG_DIR = "configs"
BROKEN_EVERY = 10  # one file in ten breaks a formula rule
WORLD_MIN, WORLD_MAX = 8, 65536
SEED = 20240611
CHECK_JSONSCHEMA_PIN = "check-jsonschema==0.39.0"
COPY_IGNORED = ("*.egg-info", ".venv*", ".git", "__pycache__", ".*_cache", ".hypothesis")
WORLD_FACTORS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
DEGREES = (*WORLD_FACTORS, "ep", "etp")  # the order a file writes them in


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """What one run measures: file counts, repetitions, and whether pre-commit runs."""

    quick: bool
    pre_commit: bool
    sizes: tuple[int, ...]
    repetitions: int

    @classmethod
    def from_args(cls, quick: bool, pre_commit: bool | None) -> Settings:
        return cls(
            quick=quick,
            pre_commit=(not quick) if pre_commit is None else pre_commit,
            sizes=(1, 100) if quick else (1, 100, 1000),
            repetitions=2 if quick else 7,
        )


# --------------------------------------------------------------------------- formatting


def fmt_s(seconds: float) -> str:
    if seconds >= 0.9995:  # what would print as 1000 ms
        return f"{seconds:.2f} s"
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.2f} ms"


def fmt_delta(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_s(abs(seconds))


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """A Markdown table; columns in ``right`` are right-aligned."""
    align = ["---:" if i in right else "---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- config files


@dataclass(frozen=True)
class GeneratedConfig:
    """One config file's text; ``broken_rule`` names the formula rule it breaks, if any."""

    text: str
    world_size: int
    broken_rule: str | None = None


@dataclass
class ConfigShape:
    """What a config file says, before it is rendered to YAML."""

    world_size: int
    degrees: dict[str, int]
    gpus_per_node: int | None = None
    derived: dict[str, str] = field(default_factory=dict)
    domains: dict[str, list[str]] = field(default_factory=dict)
    runtime: dict[str, str | int] = field(default_factory=dict)
    comment: str | None = None

    def render(self) -> str:
        lines = [f"# {self.comment}"] if self.comment else []
        lines.append(f"world_size: {self.world_size}")
        if self.gpus_per_node is not None:
            lines.append(f"gpus_per_node: {self.gpus_per_node}")
        lines.append("degrees:")
        lines += [f"  {name}: {self.degrees[name]}" for name in DEGREES if name in self.degrees]
        if self.derived:
            lines.append("derived:")
            lines += [f'  {name}: "{formula}"' for name, formula in self.derived.items()]
        if self.domains:
            lines.append("domains:")
            lines += [f"  {name}: [{', '.join(dims)}]" for name, dims in self.domains.items()]
        if self.runtime:
            lines.append("runtime:")
            lines += [f"  {name}: {value}" for name, value in self.runtime.items()]
        return "\n".join(lines) + "\n"


DERIVED_ONLY = [{"dp_total": "dp_replicate * dp_shard"}, {"sp": "cp * tp"}]

# The first valid configs pin the ends of the world-size range.
ANCHORS = [
    {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 8, "ep": 1, "etp": 1},
    {"pp": 8, "dp_replicate": 2, "dp_shard": 256, "cp": 2, "tp": 8, "ep": 16, "etp": 8},
]


def world_of(degrees: dict[str, int]) -> int:
    return math.prod(degrees[name] for name in WORLD_FACTORS)


def no_condition(degrees: dict[str, int]) -> bool:
    return True


def random_degrees(rng: random.Random, accept: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """Resolved degrees (no -1) with a world size in range that ``accept`` takes."""
    while True:
        tp = rng.choice([1, 2, 4, 8, 8])
        degrees = {
            "pp": rng.choice([1, 1, 2, 4, 8, 16]),
            "dp_replicate": rng.choice([1, 1, 2, 4, 8]),
            "dp_shard": rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512]),
            "cp": rng.choice([1, 1, 1, 2, 4]),
            "tp": tp,
            "etp": rng.choice([1, 1, tp]),
        }
        lender = degrees["dp_shard"] * degrees["cp"] * tp
        eps = [ep for ep in (1, 2, 4, 8, 16, 32, 64) if lender % (ep * degrees["etp"]) == 0]
        degrees["ep"] = rng.choice(eps)
        if WORLD_MIN <= world_of(degrees) <= WORLD_MAX and accept(degrees):
            return degrees


def written_degrees(degrees: dict[str, int], style: int, rng: random.Random) -> dict[str, int]:
    """The degrees as a file writes them: defaults left out, and one of four -1 styles."""
    written = {
        name: value
        for name, value in degrees.items()
        if value != 1 or (name == "dp_shard") or rng.random() < 0.3
    }
    write_auto_style(written, degrees, style, rng)
    return written


def add_extras(shape: ConfigShape, rng: random.Random, with_domains: bool) -> None:
    """Optional blocks, drawn independently: about a fifth of the files have none of them."""
    if rng.random() < 0.5:
        shape.gpus_per_node = rng.choice([4, 8, 8, 8])
    if with_domains and rng.random() < 0.3:
        shape.derived, shape.domains = rng.choice(CUSTOM_DOMAIN_SETS)
    elif rng.random() < 0.15:
        shape.derived = dict(rng.choice(DERIVED_ONLY))
    if rng.random() < 0.25:
        shape.runtime = {
            "timeout_s": rng.choice([600, 1800, 3600]),
            "backend": rng.choice(["auto", "nccl"]),
        }
    if rng.random() < 0.4:
        shape.comment = f"{rng.choice(['llama', 'moe', 'dense', 'long-context'])} run layout"


def valid_config(index: int, rng: random.Random) -> ConfigShape:
    degrees = dict(ANCHORS[index]) if index < len(ANCHORS) else random_degrees(rng, no_condition)
    shape = ConfigShape(world_of(degrees), written_degrees(degrees, index % 4, rng))
    add_extras(shape, rng, with_domains=True)
    return shape


# How each formula rule is broken. Every broken file keeps its keys, types and ranges valid,
# so the JSON Schema accepts it.
def _break_world_product(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.degrees.update({name: degrees[name] for name in WORLD_FACTORS})
    shape.world_size = shape.world_size // 2 if shape.world_size >= 16 else shape.world_size * 2


def _break_auto_fill(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.degrees.update({name: degrees[name] for name in ("pp", "dp_replicate", "cp", "tp")})
    shape.degrees.pop("dp_shard", None)  # dp_shard defaults to -1 and cannot fill exactly
    shape.world_size += 1


def _break_expert_borrowing(shape: ConfigShape, degrees: dict[str, int]) -> None:
    lender = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    twos = (lender & -lender).bit_length() - 1  # the power of two in the lender
    shape.degrees["ep"] = 2 ** (twos + 1)
    shape.degrees.pop("etp", None)


def _break_etp(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.degrees["etp"] = degrees["tp"] // 2
    shape.degrees.pop("ep", None)


def _break_derived_division(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {"tp_half_groups": "tp / 16"}


def _break_derived_name(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {"moe_dp": "dp_shard * cp * tpp"}


def _break_domain_product(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {}
    shape.domains = {"dense": ["pp", "fsdp", "tp"], "loss": ["pp", "loss", "tp"]}


def _break_same_groups(shape: ConfigShape, degrees: dict[str, int]) -> None:
    shape.derived = {}
    shape.domains = {
        "dense": ["pp", "dp_replicate", "fsdp", "tp"],
        "tp_outer": ["pp", "dp_replicate", "tp", "fsdp"],
    }


@dataclass(frozen=True)
class BrokenRule:
    name: str
    key_prefix: str  # every diagnostic meshconf reports sits under this key
    needs: Callable[[dict[str, int]], bool]  # which degrees can be broken this way
    apply: Callable[[ConfigShape, dict[str, int]], None]


BROKEN_RULES = [
    BrokenRule("world product", "degrees.", no_condition, _break_world_product),
    BrokenRule(
        "-1 fills exactly",
        "degrees.dp_shard",
        lambda d: world_of(d) // d["dp_shard"] >= 2,
        _break_auto_fill,
    ),
    BrokenRule("experts borrow", "degrees.ep", no_condition, _break_expert_borrowing),
    BrokenRule("etp is 1 or tp", "degrees.etp", lambda d: d["tp"] >= 4, _break_etp),
    BrokenRule("derived integer", "derived.", no_condition, _break_derived_division),
    BrokenRule("derived names", "derived.", no_condition, _break_derived_name),
    BrokenRule(
        "domain product", "domains.", lambda d: d["dp_replicate"] >= 2, _break_domain_product
    ),
    BrokenRule(
        "same rank groups",
        "domains.",
        lambda d: d["tp"] >= 2 and d["dp_shard"] * d["cp"] >= 2,
        _break_same_groups,
    ),
]


def broken_config(index: int, rng: random.Random) -> tuple[ConfigShape, BrokenRule]:
    rule = BROKEN_RULES[(index // BROKEN_EVERY) % len(BROKEN_RULES)]
    degrees = random_degrees(rng, rule.needs)
    shape = ConfigShape(world_of(degrees), written_degrees(degrees, index % 4, rng))
    add_extras(shape, rng, with_domains=False)
    rule.apply(shape, degrees)
    return shape, rule


def check_generated(path: Path, rule: BrokenRule | None) -> None:
    """A valid file loads; a broken one fails only under its rule's key (else: a generator bug)."""
    try:
        load_config(path)
    except ConfigError as error:
        keys = [d.key for d in error.diagnostics]
        if rule is None or not all(key.startswith(rule.key_prefix) for key in keys):
            sys.exit(f"generator bug: {path} ({rule.name if rule else 'valid'}) fails:\n{error}")
        return
    if rule is not None:
        sys.exit(f"generator bug: {path} should break {rule.name!r} but is valid")


def generate_configs(count: int, scratch: Path) -> list[GeneratedConfig]:
    """``count`` distinct configs; file ``i`` breaks a formula rule when i % 10 == 9."""
    rng = random.Random(SEED)
    seen: set[str] = set()
    configs: list[GeneratedConfig] = []
    while len(configs) < count:
        index = len(configs)
        rule: BrokenRule | None = None
        if index % BROKEN_EVERY == BROKEN_EVERY - 1:
            shape, rule = broken_config(index, rng)
        else:
            shape = valid_config(index, rng)
        body = replace(shape, comment=None).render()  # distinct beyond the comment line
        if body in seen:
            continue
        seen.add(body)
        path = scratch / f"check_{index:04d}.yaml"
        path.write_text(shape.render())
        check_generated(path, rule)
        broken_rule = rule.name if rule else None
        configs.append(GeneratedConfig(shape.render(), shape.world_size, broken_rule))
    return configs


def config_name(index: int) -> str:
    return f"{CONFIG_DIR}/mesh_{index:04d}.yaml"


def describe_configs(configs: Sequence[GeneratedConfig]) -> str:
    worlds = sorted(c.world_size for c in configs if c.broken_rule is None)
    texts = [c.text for c in configs]
    bare = sum(
        not any(key in t for key in ("gpus_per_node:", "derived:", "domains:", "runtime:"))
        for t in texts
    )
    rules = Counter(c.broken_rule for c in configs if c.broken_rule)
    broken = ", ".join(f"{rule} {n}" for rule, n in rules.items())
    return (
        f"{len(configs)} distinct configs (seed {SEED}). The {len(worlds)} valid ones have "
        f"world_size {worlds[0]} .. {worlds[-1]} (median {worlds[len(worlds) // 2]}); "
        f"{sum('derived:' in t for t in texts)} have `derived:`, "
        f"{sum('domains:' in t for t in texts)} custom `domains:`, "
        f"{sum('runtime:' in t for t in texts)} `runtime:`, and {bare} only `world_size` and "
        f"`degrees`. {sum(rules.values())} break one formula rule and are valid under the "
        f"JSON Schema ({broken})."
    )


# --------------------------------------------------------------------------- git repositories


def git(*args: str, cwd: Path) -> str:
    identity = ["-c", "user.name=meshconf bench", "-c", "user.email=bench@meshconf.invalid"]
    done = subprocess.run(
        ["git", *identity, *args], cwd=cwd, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def commit_all(repo: Path) -> str:
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "bench", cwd=repo)
    return git("rev-parse", "HEAD", cwd=repo)


def write_consumer(directory: Path, configs: Sequence[GeneratedConfig]) -> None:
    (directory / CONFIG_DIR).mkdir(parents=True)
    for index, config in enumerate(configs):
        (directory / config_name(index)).write_text(config.text)


def pre_commit_config(hook_repo: Path, revision: str) -> str:
    entry = f"check-jsonschema --schemafile {SCHEMA}"
    return (
        "repos:\n"
        f"  - repo: {hook_repo}\n"
        f"    rev: {revision}\n"
        "    hooks:\n"
        "      - id: meshconf-validate\n"
        f"        files: ^{CONFIG_DIR}/\n"
        "  - repo: local\n"
        "    hooks:\n"
        "      - id: check-jsonschema\n"
        "        name: check-jsonschema\n"
        f"        entry: {entry}\n"
        "        language: python\n"
        f'        additional_dependencies: ["{CHECK_JSONSCHEMA_PIN}"]\n'
        f"        files: ^{CONFIG_DIR}/\n"
    )


# --------------------------------------------------------------------------- running


MESHCONF_ERROR = re.compile(rf"^({CONFIG_DIR}/[^:\s]+\.yaml):\d+:\d+: ", re.MULTILINE)
CHECK_JSONSCHEMA_ERROR = re.compile(rf"^\s+({CONFIG_DIR}/[^:\s]+\.yaml)::", re.MULTILINE)


def flagged_files(output: str) -> set[str]:
    """Files named in an error line of either tool (directly or inside pre-commit's output)."""
    return set(MESHCONF_ERROR.findall(output)) | set(CHECK_JSONSCHEMA_ERROR.findall(output))


@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]
    cwd: Path
    env: dict[str, str]


@dataclass(frozen=True)
class RunResult:
    wall: float  # seconds
    cpu: float  # user + system seconds of the process and every child it waited for
    exit_code: int
    output: str


@dataclass
class Series:
    """Timed runs of one command, and what its last run reported."""

    command: Command
    walls: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    flagged: set[str] = field(default_factory=set)
    exit_code: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.walls)

    @property
    def best(self) -> float:
        return min(self.walls)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpus)


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: Command) -> RunResult:
    """Run ``command`` once; exit with its output if it failed other than by flagging files."""
    cpu_before = children_cpu_seconds()
    start = time.perf_counter()
    done = subprocess.run(
        command.argv, cwd=command.cwd, env=command.env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    output = done.stdout + done.stderr
    if done.returncode not in (0, 1) or (done.returncode == 1 and not flagged_files(output)):
        sys.exit(f"{command.label} exited {done.returncode}:\n{output[-4000:]}")
    return RunResult(wall, children_cpu_seconds() - cpu_before, done.returncode, output)


def record(series: Series, result: RunResult, timed: bool = True) -> None:
    if timed:
        series.walls.append(result.wall)
        series.cpus.append(result.cpu)
    series.flagged = flagged_files(result.output)
    series.exit_code = result.exit_code


def alternate(commands: Sequence[Command], repetitions: int) -> list[Series]:
    """One untimed warm-up run of each command, then ``repetitions`` timed rounds; the order
    of the commands is reversed every other round."""
    all_series = [Series(command) for command in commands]
    for series in all_series:
        record(series, run_once(series.command), timed=False)
    for round_index in range(repetitions):
        order = all_series if round_index % 2 == 0 else all_series[::-1]
        for series in order:
            record(series, run_once(series.command))
    return all_series


# --------------------------------------------------------------------------- reporting


def flagged_cells(series: Series, broken: set[str]) -> list[str]:
    return [
        f"{len(series.flagged & broken)} of {len(broken)}",
        str(len(series.flagged - broken)),
    ]


def broken_names(configs: Sequence[GeneratedConfig]) -> set[str]:
    return {config_name(i) for i, config in enumerate(configs) if config.broken_rule}


def timing_cells(series: Series, size: int) -> list[str]:
    return [
        fmt_s(series.best),
        fmt_s(series.median),
        fmt_ms(series.median / size),
        fmt_s(series.median_cpu),
    ]


TIMING_HEADERS = ["best", "median", "median / file", "CPU (median)"]
FLAGGED_HEADERS = ["formula-broken files flagged", "valid files flagged"]


def print_direct_table(
    results: dict[int, list[Series]], configs: Sequence[GeneratedConfig]
) -> None:
    rows = []
    for size, all_series in results.items():
        broken = broken_names(configs[:size])
        for series in all_series:
            rows.append(
                [
                    f"{size:,}",
                    series.command.label,
                    *timing_cells(series, size),
                    *flagged_cells(series, broken),
                ]
            )
    headers = ["files", "command (one process)", *TIMING_HEADERS, *FLAGGED_HEADERS]
    print(table(headers, rows, right=(0, 2, 3, 4, 5, 6, 7)))
    print()


def split_cost(small: tuple[int, float], large: tuple[int, float]) -> tuple[float, float]:
    """(fixed cost, cost per file) of the line through two (files, seconds) points."""
    per_file = (large[1] - small[1]) / (large[0] - small[0])
    return small[1] - small[0] * per_file, per_file


def print_marginal_table(results: dict[int, list[Series]]) -> None:
    """Fixed cost and cost per extra file, from the medians at the smallest and largest size."""
    small, large = min(results), max(results)
    rows = []
    for low, high in zip(results[small], results[large], strict=True):
        fixed, per_file = split_cost((small, low.median), (large, high.median))
        fixed_cpu, per_file_cpu = split_cost((small, low.median_cpu), (large, high.median_cpu))
        rows.append(
            [
                low.command.label,
                fmt_s(fixed),
                fmt_ms(per_file),
                fmt_s(fixed_cpu),
                fmt_ms(per_file_cpu),
            ]
        )
    print(
        "Split into a fixed cost (interpreter start, imports, set-up) and a cost per file: the "
        f"line through the medians at {small:,} and {large:,} files.\n"
    )
    headers = ["command", "fixed (wall)", "per file (wall)", "fixed (CPU)", "per file (CPU)"]
    print(table(headers, rows, right=(1, 2, 3, 4)))
    print()


def print_pre_commit_tables(
    cold: list[tuple[str, RunResult]],
    results: dict[int, list[Series]],
    direct: dict[int, list[Series]],
    configs: Sequence[GeneratedConfig],
) -> None:
    rows = [[label, fmt_s(run.wall), fmt_s(run.cpu)] for label, run in cold]
    headers = ["first run of the hook (creates its environment)", "wall", "CPU"]
    print(table(headers, rows, right=(1, 2)))
    print()
    rows = []
    for size, all_series in results.items():
        broken = broken_names(configs[:size])
        for series, plain in zip(all_series, direct[size], strict=True):
            rows.append(
                [
                    f"{size:,}",
                    series.command.label,
                    *timing_cells(series, size),
                    fmt_delta(series.median - plain.median),
                    str(series.exit_code),
                    *flagged_cells(series, broken),
                ]
            )
    headers = [
        "files",
        "`pre-commit run HOOK --all-files`, warm",
        *TIMING_HEADERS,
        "over the direct run (median)",
        "exit code",
        *FLAGGED_HEADERS,
    ]
    print(table(headers, rows, right=(0, 2, 3, 4, 5, 6, 7, 8, 9)))
    print()


# --------------------------------------------------------------------------- parts


def tool_commands(consumer: Path, size: int) -> list[Command]:
    files = [config_name(i) for i in range(size)]
    # Bytecode as an installed package has it: the warm-up run writes the .pyc files of an
    # editable install, which would otherwise be compiled again on every run.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    meshconf = str(BIN / "meshconf")
    check_jsonschema = str(BIN / "check-jsonschema")
    return [
        Command("`meshconf validate`", (meshconf, "validate", *files), consumer, env),
        Command(
            "`check-jsonschema --schemafile schemas/meshconf.schema.json`",
            (check_jsonschema, "--schemafile", str(SCHEMA), *files),
            consumer,
            env,
        ),
    ]


def direct_part(
    settings: Settings, consumers: dict[int, Path], configs: Sequence[GeneratedConfig]
) -> dict[int, list[Series]]:
    print("### 1. One process over all files\n")
    print(
        f"`meshconf validate FILES` and `check-jsonschema --schemafile "
        f"schemas/meshconf.schema.json FILES` (the schema's absolute path), run by their "
        f"console scripts in `{BIN}` from the directory holding `{CONFIG_DIR}/`. "
        "Wall time and CPU time (user + system) of the whole process: "
        f"{settings.repetitions} rounds after one warm-up run each, alternating which tool goes "
        "first; the warm-up run writes any missing bytecode, as installing a package does. "
        "A file counts as flagged when the tool prints an error line naming it.\n"
    )
    results = {
        size: alternate(tool_commands(consumers[size], size), settings.repetitions)
        for size in settings.sizes
    }
    print_direct_table(results, configs)
    if len(results) > 1:
        print_marginal_table(results)
    return results


def hook_commands(consumer: Path, env: dict[str, str]) -> list[Command]:
    pre_commit = str(BIN / "pre-commit")
    return [
        Command(
            "`meshconf-validate`",
            (pre_commit, "run", "meshconf-validate", "--all-files"),
            consumer,
            env,
        ),
        Command(
            "`check-jsonschema` (local)",
            (pre_commit, "run", "check-jsonschema", "--all-files"),
            consumer,
            env,
        ),
    ]


def hook_environment_versions(home: Path) -> str:
    """The versions pip installed into the hook environments under PRE_COMMIT_HOME."""
    wanted = ("meshconf", "pydantic", "pydantic_core", "PyYAML", "check-jsonschema", "jsonschema")
    found: dict[str, str] = {}
    for site in sorted(home.glob("*/py_env-*/lib/python*/site-packages")):
        for dist in metadata.distributions(path=[str(site)]):
            name = dist.metadata["Name"]
            if name in wanted:
                found[name] = dist.version
    return ", ".join(f"{name} {found[name]}" for name in wanted if name in found)


def pre_commit_part(
    settings: Settings,
    scratch: Path,
    consumers: dict[int, Path],
    direct: dict[int, list[Series]],
    configs: Sequence[GeneratedConfig],
) -> None:
    hook_repo = scratch / "meshconf-hook-repo"
    shutil.copytree(ROOT, hook_repo, ignore=shutil.ignore_patterns(*COPY_IGNORED))
    revision = commit_all(hook_repo)
    home = scratch / "pre-commit-home"
    env = {
        **os.environ,
        "PRE_COMMIT_HOME": str(home),
        "PIP_CACHE_DIR": str(scratch / "pip-cache"),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for consumer in consumers.values():
        (consumer / ".pre-commit-config.yaml").write_text(pre_commit_config(hook_repo, revision))
        commit_all(consumer)

    smallest = consumers[min(consumers)]
    cold = []
    for command in hook_commands(smallest, env):
        cold.append((command.label, run_once(command)))
    results = {
        size: alternate(hook_commands(consumers[size], env), settings.repetitions)
        for size in settings.sizes
    }

    print("### 2. As pre-commit hooks\n")
    print(
        "A consumer git repository with the files under `configs/` and this "
        "`.pre-commit-config.yaml` (the meshconf hook from a committed copy of this "
        "repository):\n"
    )
    print("```yaml")
    print(pre_commit_config(Path("/path/to/meshconf-copy"), "<commit>").rstrip())
    print("```\n")
    print(
        "`meshconf-validate` has `require_serial: true`, so one process checks every file. The "
        "local `check-jsonschema` hook is written like check-jsonschema's own hook, without "
        f"`require_serial`, so pre-commit splits its files over {os.cpu_count()} parallel "
        "processes (one per CPU). PRE_COMMIT_HOME and PIP_CACHE_DIR are fresh directories, so "
        f"the first run of each hook on {min(consumers):,} files creates its environment and "
        "pip installs it from the configured package indexes. The warm rows are "
        f"`pre-commit run HOOK --all-files`, {settings.repetitions} rounds after one warm-up "
        "run, alternating the order. The meshconf hook exits 1 because it flags the "
        "formula-broken files.\n"
    )
    print_pre_commit_tables(cold, results, direct, configs)
    print(f"Hook environments: {hook_environment_versions(home)}.\n")


# --------------------------------------------------------------------------- main


def version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def print_header(settings: Settings) -> None:
    command = shlex.join(["python", *sys.argv])
    print("## Validating files: meshconf validate vs check-jsonschema\n")
    print(f"Command: `{command}`\n")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    print(
        f"- Machine: {platform.platform()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs ({usable} usable)"
    )
    versions = ", ".join(
        f"{name} {version(name)}"
        for name in ("meshconf", "pydantic", "PyYAML", "check-jsonschema", "jsonschema")
    )
    print(
        f"- Python {platform.python_version()} ({platform.python_implementation()}); {versions}; "
        f"pre-commit {version('pre-commit')}"
    )
    if hasattr(os, "getloadavg"):
        print(f"- Load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    mode = "quick (smoke run, few repetitions: numbers are rough)" if settings.quick else "full"
    parts = "direct runs and pre-commit hooks" if settings.pre_commit else "direct runs only"
    print(f"- Mode: {mode}; {parts}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 and 100 files, 2 rounds, no pre-commit"
    )
    parser.add_argument(
        "--pre-commit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time the pre-commit hooks (default: yes, except with --quick)",
    )
    args = parser.parse_args(argv)
    settings = Settings.from_args(args.quick, args.pre_commit)
    print_header(settings)

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="meshconf-validate-bench-") as name:
        scratch = Path(name)
        (scratch / "generated").mkdir()
        configs = generate_configs(max(settings.sizes), scratch / "generated")
        print(describe_configs(configs))
        for size in settings.sizes[:-1]:
            broken = len(broken_names(configs[:size]))
            print(f"The {size:,}-file runs use the first {size:,} of them ({broken} broken).")
        print()
        consumers = {size: scratch / f"consumer-{size}" for size in settings.sizes}
        for size, consumer in consumers.items():
            write_consumer(consumer, configs[:size])
        direct = direct_part(settings, consumers, configs)
        if settings.pre_commit:
            pre_commit_part(settings, scratch, consumers, direct, configs)
    load = (
        f"; load average (1 min) at end: {os.getloadavg()[0]:.2f}"
        if hasattr(os, "getloadavg")
        else ""
    )
    print(f"Total benchmark time: {time.perf_counter() - start:.1f} s{load}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
