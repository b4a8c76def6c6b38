"""Every command and snippet in the Markdown docs runs, and prints what the docs show.

The convention is written out in CONTRIBUTING.md, "How the docs are tested", which this test
runs too. In short:

- A fenced ``console`` block holds commands, each on a line starting with ``$ ``, followed
  by its exact output (stdout and stderr merged). ``$ echo $?`` asserts the exit code of the
  command before it; without one, a command must exit 0. A command whose line opens a
  heredoc (``<<'EOF'``) or ends with ``\\`` goes on over the following lines.
- A console command with no output, last in its block and followed directly by a ``json``
  block, must print that JSON on stdout.
- A ``python`` block runs as a script and must exit 0. If the next fenced block is a ``text``
  block whose first line is ``# output``, the script's stdout must be the rest of that block.
- A ``bash``, ``sh``, ``shell`` or ``python`` block that is not run has the HTML comment
  ``<!-- docs-test: skip (<reason>) -->`` on the line before its fence, which Markdown does
  not render. ``$ `` lines appear only in console blocks.

Each doc runs in its own scratch copy of the repository's README, docs, examples, schemas,
benchmarks and top-level dotfiles, with this interpreter's bin directory first on PATH. Its
blocks run in order, in the same directory, so a doc may create a file in one command and use
it in a later one. Different docs run side by side on a few threads. Their ``meshconf``
commands and Python snippets run in children forked from one server that imported meshconf
and torch once (tests/forkserver.py); other commands (``python``, ``torchrun``) start fresh,
and so does a snippet that reads ``sys.modules``, which speaks of what a fresh interpreter
imports.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from forkserver import SHIM, TORCH_MODULES, run as run_in_server, serving

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
COPIED_DIRS = ("docs", "examples", "schemas", "benchmarks")
TIMEOUT_S = 120
# Docs run side by side on this many threads (each waits on its subprocesses).
WORKERS = max(1, min(4, os.cpu_count() or 1))
SKIP = re.compile(r"^<!-- docs-test: skip \((?P<reason>.*)\) -->$")
OLD_MARKER = "# not run by the docs test"
OUTPUT_MARKER = "# output"
SHELL_INFOS = {"bash", "sh", "shell"}

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
HEREDOC = re.compile(
    r"(?<!<)<<(?P<dash>-?)\s*(?P<quote>['\"]?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)(?P=quote)"
)


@dataclass
class Block:
    """One fenced block: its info word, the line of its opening fence, and its lines."""

    info: str
    line: int
    lines: list[str]
    follows_directly: bool  # only blank lines between the previous block and this one
    skip_reason: str | None = None  # from a skip comment on the line before the fence


@dataclass
class Command:
    line: int
    text: str
    output: list[str] = field(default_factory=list)
    json_line: int | None = None
    json_value: object = None
    exit_code: int = 0
    exit_code_given: bool = False


@dataclass
class Script:
    line: int
    code: str
    output_line: int | None = None
    output: str | None = None


Step = Command | Script


def parse_blocks(lines: list[str], problems: list[str], name: str) -> list[Block]:
    """The fenced blocks of a Markdown file, with their content dedented to the fence."""
    blocks: list[Block] = []
    index = 0
    blank_since_last = False
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            if lines[index].strip():
                blank_since_last = False
            index += 1
            continue
        indent = len(match["indent"])
        fence = match["fence"]
        skip = SKIP.match(lines[index - 1].strip()) if index else None
        info = match["info"].strip().split(" ")[0].lower() if match["info"].strip() else ""
        start = index + 1
        content: list[str] = []
        index += 1
        while index < len(lines):
            close = FENCE.match(lines[index])
            if (
                close
                and close["fence"][0] == fence[0]
                and len(close["fence"]) >= len(fence)
                and not close["info"].strip()
            ):
                break
            raw = lines[index]
            content.append(raw[indent:] if raw[:indent].strip() == "" else raw.lstrip())
            index += 1
        else:
            problems.append(f"{name}:{start}: fenced block is never closed")
        blocks.append(
            Block(
                info,
                start,
                content,
                follows_directly=bool(blocks) and blank_since_last,
                skip_reason=skip["reason"].strip() if skip else None,
            )
        )
        blank_since_last = True
        index += 1
    return blocks


def parse_console(block: Block, steps: list[Step], problems: list[str], name: str) -> None:
    lines = block.lines
    index = 0
    while index < len(lines) and not lines[index].strip():
        index += 1
    if index < len(lines) and not lines[index].startswith("$ "):
        problems.append(f"{name}:{block.line + 1 + index}: a console block starts with a '$ ' line")
        return
    while index < len(lines):
        line_no = block.line + 1 + index
        text = lines[index][2:]
        index += 1
        # Continuation lines: a trailing backslash, then the body of any heredoc.
        while text.endswith("\\") and index < len(lines):
            text += "\n" + lines[index]
            index += 1
        for heredoc in HEREDOC.finditer(text):
            word = heredoc["word"]
            while True:
                if index >= len(lines):
                    problems.append(f"{name}:{line_no}: heredoc {word!r} is never terminated")
                    return
                body = lines[index]
                text += "\n" + body
                index += 1
                if (body.lstrip("\t") if heredoc["dash"] else body) == word:
                    break
        output: list[str] = []
        while index < len(lines) and not lines[index].startswith("$ "):
            output.append(lines[index])
            index += 1
        if text.strip() == "echo $?":
            previous = steps[-1] if steps else None
            codes = [line.strip() for line in output if line.strip()]
            if not isinstance(previous, Command) or previous.exit_code_given:
                problems.append(f"{name}:{line_no}: '$ echo $?' must follow a command")
            elif len(codes) != 1 or not codes[0].isdigit():
                problems.append(f"{name}:{line_no}: '$ echo $?' needs one line: the exit code")
            else:
                previous.exit_code = int(codes[0])
                previous.exit_code_given = True
            continue
        steps.append(Command(line_no, text, output))


def parse_doc(text: str, name: str) -> tuple[list[Step], list[str]]:
    """The steps a doc runs, in order, and the problems with how it is written."""
    lines = text.splitlines()
    problems: list[str] = []
    blocks = parse_blocks(lines, problems, name)
    in_console = set()
    for block in blocks:
        if block.info == "console":
            in_console.update(range(block.line + 1, block.line + 1 + len(block.lines)))
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("$ ") and number not in in_console:
            problems.append(f"{name}:{number}: a '$ ' command line outside a console block")

    steps: list[Step] = []
    for position, block in enumerate(blocks):
        following = blocks[position + 1] if position + 1 < len(blocks) else None
        not_run = block.skip_reason is not None
        if block.skip_reason == "":
            problems.append(f"{name}:{block.line}: a skip comment needs a reason")
        if any(line.lstrip().startswith(OLD_MARKER) for line in block.lines):
            problems.append(
                f"{name}:{block.line}: '{OLD_MARKER}' shows to readers; put "
                "'<!-- docs-test: skip (<reason>) -->' before the block instead"
            )
        if block.info == "console":
            count = len(steps)
            parse_console(block, steps, problems, name)
            last = steps[-1] if len(steps) > count else None
            if (
                isinstance(last, Command)
                and not [line for line in last.output if line.strip()]
                and following is not None
                and following.info == "json"
                and following.follows_directly
            ):
                last.json_line = following.line
                try:
                    last.json_value = json.loads("\n".join(following.lines))
                except json.JSONDecodeError as error:
                    problems.append(f"{name}:{following.line}: invalid JSON: {error}")
        elif block.info in SHELL_INFOS and not not_run:
            problems.append(
                f"{name}:{block.line}: a {block.info} block is not run; put "
                "'<!-- docs-test: skip (<reason>) -->' on the line before it, or make it a "
                "console block"
            )
        elif block.info == "python" and not not_run:
            script = Script(block.line, "\n".join(block.lines) + "\n")
            if (
                following is not None
                and following.info == "text"
                and following.lines
                and following.lines[0].strip() == OUTPUT_MARKER
            ):
                script.output_line = following.line
                script.output = "\n".join(following.lines[1:])
            steps.append(script)
        elif block.info == "text" and block.lines and block.lines[0].strip() == OUTPUT_MARKER:
            previous = blocks[position - 1] if position else None
            if previous is None or previous.info != "python" or previous.skip_reason is not None:
                problems.append(
                    f"{name}:{block.line}: a '{OUTPUT_MARKER}' block must follow a run python block"
                )
    return steps, problems


#: What a page says when its commands read the repository's own files: readers run them
#: from there, as the test does in its copy of the repository.
FROM_THE_ROOT = "The commands on this page run from the root of a clone of the repository"
REPOSITORY_PATH = re.compile(r"(?<![\w/.-])(examples|schemas|docs|benchmarks)/")


def where_it_runs(text: str, steps: list[Step], name: str) -> list[str]:
    """A page whose commands or snippets read ``examples/``, ``schemas/``, ``docs/`` or
    ``benchmarks/`` must say that they run from the root of a clone."""
    reads = any(
        REPOSITORY_PATH.search(step.text if isinstance(step, Command) else step.code)
        for step in steps
    )
    if reads and FROM_THE_ROOT not in " ".join(text.split()):
        return [
            f"{name}: its commands read the repository's files (examples/ and others); say "
            f"where they run: '{FROM_THE_ROOT}, ...'"
        ]
    return []


def normalize(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def diff(expected: list[str], actual: list[str]) -> str:
    return "\n".join(
        difflib.unified_diff(expected, actual, "expected (docs)", "actual", lineterm="", n=2)
    )


def make_scratch(tmp_path: Path) -> Path:
    scratch = tmp_path / "repo"
    scratch.mkdir()
    shutil.copy2(ROOT / "README.md", scratch / "README.md")
    for name in COPIED_DIRS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, scratch / name)
    for dotfile in ROOT.glob(".*"):
        if dotfile.is_file():
            shutil.copy2(dotfile, scratch / dotfile.name)
    return scratch


def environment(forkserver: Path | None = None) -> dict[str, str]:
    """The environment of the docs' commands; with ``forkserver`` (the folder of its socket
    and shim), ``meshconf`` is the shim that runs commands there (tests/forkserver.py)."""
    env = dict(os.environ)
    env.pop("PYTHONWARNINGS", None)
    path = [str(Path(sys.executable).parent), env.get("PATH", "")]
    if forkserver is not None:
        path.insert(0, str(forkserver / "bin"))
        env["MESHCONF_FORKSERVER"] = str(forkserver / "socket")
    env["PATH"] = os.pathsep.join(path)
    # Interleave stdout and stderr as a terminal would show them.
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def forkserver(folder: Path) -> Iterator[Path]:
    """Serve the docs' ``meshconf`` commands and Python snippets from one process that has
    imported the command line and torch (tests/forkserver.py); yields the folder to hand to
    :func:`environment`."""
    shim = folder / "bin" / "meshconf"
    shim.parent.mkdir()
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    with serving(folder, TORCH_MODULES, TIMEOUT_S):
        yield folder


def run_command(command: Command, name: str, cwd: Path, env: dict[str, str]) -> str | None:
    where = f"{name}:{command.line}: $ {command.text}"
    wants_json = command.json_line is not None
    try:
        result = subprocess.run(
            ["bash", "-c", "set -o pipefail\n" + command.text],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if wants_json else subprocess.STDOUT,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"{where}\ntimed out after {TIMEOUT_S} s"
    problems = []
    if result.returncode != command.exit_code:
        problems.append(f"exit code {result.returncode}, the docs say {command.exit_code}")
    if wants_json:
        try:
            actual = json.loads(result.stdout)
        except json.JSONDecodeError as error:
            problems.append(f"stdout is not JSON ({error}):\n{result.stdout}")
        else:
            if actual != command.json_value:
                expected_text = json.dumps(command.json_value, indent=2).splitlines()
                actual_text = json.dumps(actual, indent=2).splitlines()
                problems.append(
                    f"JSON differs from the block at line {command.json_line}:\n"
                    + diff(expected_text, actual_text)
                )
    else:
        expected, actual = normalize("\n".join(command.output)), normalize(result.stdout)
        if expected != actual:
            problems.append("output differs:\n" + diff(expected, actual))
    if not problems:
        return None
    details = "\n".join(problems)
    if wants_json and result.stderr:
        details += f"\nstderr:\n{result.stderr}"
    elif result.returncode != command.exit_code and expected == actual:
        details += "\noutput:\n" + result.stdout
    return f"{where}\n{details}"


def run_script(
    script: Script, name: str, cwd: Path, env: dict[str, str], snippets: Path
) -> str | None:
    where = f"{name}:{script.line}: python block"
    path = snippets / f"{name.replace('/', '_')}_line{script.line}.py"
    path.write_text(script.code, encoding="utf-8")
    server = env.get("MESHCONF_FORKSERVER")
    try:
        # a snippet that reads sys.modules speaks of a fresh interpreter's imports
        if server is not None and "sys.modules" not in script.code:
            result = run_in_server(
                Path(server), [str(path)], cwd=cwd, env=env, script=str(path), timeout=TIMEOUT_S
            )
        else:
            result = subprocess.run(
                [sys.executable, str(path)],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
    except subprocess.TimeoutExpired:
        return f"{where}\ntimed out after {TIMEOUT_S} s"
    problems = []
    if result.returncode != 0:
        problems.append(f"exit code {result.returncode}\nstderr:\n{result.stderr}")
    if script.output is not None:
        expected, actual = normalize(script.output), normalize(result.stdout)
        if expected != actual:
            problems.append(
                f"stdout differs from the output block at line {script.output_line}:\n"
                + diff(expected, actual)
            )
    return f"{where}\n" + "\n".join(problems) if problems else None


def check_doc(doc: Path, tmp_path: Path, env: dict[str, str]) -> list[str]:
    """Run every step of one doc in a fresh scratch copy; return the problems found."""
    name = doc.relative_to(ROOT).as_posix()
    text = doc.read_text(encoding="utf-8")
    steps, failures = parse_doc(text, name)
    failures += where_it_runs(text, steps, name)
    scratch = make_scratch(tmp_path)
    snippets = tmp_path / "snippets"
    snippets.mkdir()
    for step in steps:
        if isinstance(step, Command):
            failure = run_command(step, name, scratch, env)
        else:
            failure = run_script(step, name, scratch, env, snippets)
        if failure:
            failures.append(failure)
    return failures


def estimated_cost(doc: Path) -> int:
    """A rough cost in seconds, so that the slowest docs start first."""
    steps, _ = parse_doc(doc.read_text(encoding="utf-8"), doc.name)
    cost = 0
    for step in steps:
        text = step.text if isinstance(step, Command) else step.code
        cost += 20 if "torchrun" in text else 2 if "torch" in text or "simulate" in text else 1
    return cost


@pytest.fixture(scope="session")
def doc_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Path, Future[list[str]]]]:
    """Start every selected doc at once, on a few threads: each doc's steps stay in order,
    and different docs run side by side, their ``meshconf`` commands served by one fork
    server."""
    selected = [
        item.callspec.params["doc"]
        for item in request.session.items
        if item.module is sys.modules[__name__] and hasattr(item, "callspec")
    ]
    selected = [doc for doc in selected if isinstance(doc, Path)]
    with forkserver(tmp_path_factory.mktemp("forkserver")) as folder:
        env = environment(folder)
        pool = ThreadPoolExecutor(max_workers=WORKERS)
        try:
            yield {
                doc: pool.submit(check_doc, doc, tmp_path_factory.mktemp(doc.stem), env)
                for doc in sorted(selected, key=estimated_cost, reverse=True)
            }
        finally:
            pool.shutdown(cancel_futures=True)


# A doc's run starts when one of the WORKERS threads is free, so the first test may wait for
# most of the docs; each command and snippet still has its own TIMEOUT_S.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("doc", DOCS, ids=[doc.relative_to(ROOT).as_posix() for doc in DOCS])
def test_doc(doc: Path, doc_runs: dict[Path, Future[list[str]]]) -> None:
    failures = doc_runs[doc].result()
    if failures:
        name = doc.relative_to(ROOT).as_posix()
        pytest.fail(
            f"{len(failures)} problem(s) in {name}:\n\n" + "\n\n".join(failures), pytrace=False
        )


def test_the_convention_catches_mistakes() -> None:
    """The parser finds unmarked shell blocks, stray '$ ' lines, and reads exit codes."""
    text = "\n".join(
        [
            "```bash",
            "meshconf validate x.yaml",
            "```",
            "",
            "```",
            "$ meshconf show x.yaml",
            "```",
            "",
            "<!-- docs-test: skip (needs a cluster) -->",
            "```sh",
            "srun python train.py",
            "```",
            "",
            "<!-- docs-test: skip (needs a SLURM cluster) -->",
            "```bash",
            "#!/bin/bash",
            "srun python train.py",
            "```",
            "",
            "<!-- docs-test: skip () -->",
            "```python",
            "import torch",
            "```",
            "",
            "```bash",
            "# not run by the docs test: old style",
            "srun python train.py",
            "```",
            "",
            "```console",
            "$ cat > f.yaml <<'EOF'",
            "world_size: 8",
            "EOF",
            "$ meshconf validate f.yaml --format json",
            "```",
            "",
            "```json",
            '{"valid": true}',
            "```",
            "",
            "```console",
            "$ false",
            "$ echo $?",
            "1",
            "$ cat <<<'x'",
            "x",
            "```",
            "",
            "```python",
            "print(1)",
            "```",
            "",
            "```text",
            "# output",
            "1",
            "```",
        ]
    )
    steps, problems = parse_doc(text, "probe.md")
    assert len(problems) == 5, problems
    assert any(problem.startswith("probe.md:1: a bash block is not run") for problem in problems)
    assert "probe.md:6: a '$ ' command line outside a console block" in problems
    assert "probe.md:21: a skip comment needs a reason" in problems
    assert any(
        problem.startswith("probe.md:25: '# not run by the docs test' shows to readers")
        for problem in problems
    )
    heredoc, json_command, false, herestring, script = steps
    assert isinstance(heredoc, Command) and heredoc.text.endswith("\nEOF")
    assert isinstance(json_command, Command) and json_command.json_value == {"valid": True}
    assert isinstance(false, Command) and false.exit_code == 1
    assert isinstance(herestring, Command) and herestring.output == ["x"]
    assert isinstance(script, Script) and script.output == "1"


def test_a_wrong_output_or_exit_code_is_reported(tmp_path: Path) -> None:
    env = environment()
    command = Command(7, "printf 'a\\nb\\n'; exit 3", output=["a", "c"])
    failure = run_command(command, "probe.md", tmp_path, env)
    assert failure is not None
    assert failure.startswith("probe.md:7: $ printf")
    assert "exit code 3, the docs say 0" in failure
    assert "-c\n+b" in failure
    command = Command(8, "printf 'a\\nb\\n'; exit 3", output=["a", "b", ""], exit_code=3)
    assert run_command(command, "probe.md", tmp_path, env) is None


def test_a_page_that_reads_the_repository_says_where_it_runs() -> None:
    text = "# Page\n\n```console\n$ meshconf validate examples/x.yaml\n```\n"
    steps, _ = parse_doc(text, "probe.md")
    assert where_it_runs(text, steps, "probe.md") == [
        "probe.md: its commands read the repository's files (examples/ and others); say where "
        f"they run: '{FROM_THE_ROOT}, ...'"
    ]
    said = text.replace("# Page\n", f"# Page\n\n{FROM_THE_ROOT}, which holds examples/.\n")
    assert where_it_runs(said, parse_doc(said, "probe.md")[0], "probe.md") == []
