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
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from configs import SEED, GeneratedConfig, generate_configs  # benchmarks/ is on sys.path[0]
from harness import fmt_time, preamble, table

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "schemas" / "meshconf.schema.json"
BIN = Path(sys.executable).parent
CONFIG_DIR = "configs"
CHECK_JSONSCHEMA_PIN = "check-jsonschema==0.39.0"
COPY_IGNORED = ("*.egg-info", ".venv*", ".git", "__pycache__", ".*_cache", ".hypothesis")


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


def fmt_delta(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_time(abs(seconds))


# --------------------------------------------------------------------------- config files


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
        fmt_time(series.best),
        fmt_time(series.median),
        fmt_time(series.median / size),
        fmt_time(series.median_cpu),
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
                fmt_time(fixed),
                fmt_time(per_file),
                fmt_time(fixed_cpu),
                fmt_time(per_file_cpu),
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
    rows = [[label, fmt_time(run.wall), fmt_time(run.cpu)] for label, run in cold]
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
    parts = "direct runs and pre-commit hooks" if settings.pre_commit else "direct runs only"
    packages = ("meshconf", "pydantic", "PyYAML", "check-jsonschema", "jsonschema", "pre-commit")
    title = "Validating files: meshconf validate vs check-jsonschema"
    print(preamble(title, settings.quick, packages, f"; {parts}"))

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
