"""Where every verb writes: never over its own input, and its problems where users look
(standard error when standard output is data; ``validate``'s on standard output, as a
linter's). The verbs, their ``--out`` and the options that choose what they read and print
are found in the parsers, so a new verb or mode is tested without a line here."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import OWN_PROCESS_VERBS
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf.cli import VERBS, build_parser
from meshconf.cli.common import prints_data

RunCli = Callable[..., subprocess.CompletedProcess[str]]
Mode = tuple[str, tuple[str, ...]]

#: The parser of each verb.
PARSERS = build_parser().verbs
#: The options that choose what a verb reads or prints: each of their choices is a mode of
#: the verb; ``--emit`` takes a row, not a choice.
MODE_OPTIONS = ("--format", "--to", "--from")
ROW_OPTIONS = {"--emit": "1"}
#: A value for each required option, of no meaning beyond being parsed.
REQUIRED = {"--build": "builds:none", "--out": "picture.svg"}


def _options(verb: str) -> dict[str, argparse.Action]:
    return dict(PARSERS[verb]._option_string_actions)


def _reads_path(verb: str) -> bool:
    """Whether the verb takes a file to read: an argument, not an option."""
    return any(not action.option_strings for action in PARSERS[verb]._actions)


def _modes(verb: str) -> list[tuple[str, ...]]:
    """No option, each choice of each mode option the verb has, and each row option."""
    options = _options(verb)
    modes: list[tuple[str, ...]] = [()]
    for option in MODE_OPTIONS:
        choices = options[option].choices if option in options else None
        modes += [(option, str(choice)) for choice in choices or ()]
    return modes + [(option, row) for option, row in ROW_OPTIONS.items() if option in options]


def _required(verb: str, out: str | None = None) -> list[str]:
    """The verb's required options, each with a value, and ``--out OUT`` when ``out`` is
    given."""
    values = {**REQUIRED, "--out": out or REQUIRED["--out"]}
    words: list[str] = []
    for action in PARSERS[verb]._actions:
        name = action.option_strings[-1] if action.option_strings else None
        if name is not None and (action.required or (name == "--out" and out is not None)):
            words += [name, values[name]]
    return words


def _case(verb: str, mode: tuple[str, ...]) -> object:
    """The pytest parameter of ``verb`` in ``mode``; slow where ``run_cli`` starts a process."""
    marks = [pytest.mark.slow] if verb in OWN_PROCESS_VERBS else []
    return pytest.param((verb, mode), id=" ".join((verb, *mode)), marks=marks)


#: Every verb that writes the file ``--out`` names and reads a PATH, in each of its modes.
WRITERS = [
    (verb, mode)
    for verb in VERBS
    if "--out" in _options(verb) and _reads_path(verb)
    for mode in _modes(verb)
]
#: Every verb that reads a PATH, in each of its modes.
READERS = [(verb, mode) for verb in VERBS if _reads_path(verb) for mode in _modes(verb)]

RUN = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def test_the_verbs_and_their_modes_are_found() -> None:
    # schema's --out has no input to overwrite: it reads none.
    assert {verb for verb, _ in WRITERS} == {"convert", "render"}
    assert ("convert", ("--to", "megatron")) in WRITERS
    assert {verb for verb, _ in READERS} == set(VERBS) - {"schema"}
    assert ("plan", ("--emit", "1")) in READERS


# -- nothing overwrites its input ------------------------------------------------------------

#: A valid config: a command that took ``--out`` for another file would write.
CONFIG = b"world_size: 8\ndegrees:\n  tp: 2\n"

#: Ways to name the file NAME of the folder ``work``, from there: ``alias`` is a symbolic link
#: to ``work``, ``link``, ``hard`` and ``sub`` are in ``work`` (a symbolic link to NAME, a
#: hard link to it, and a folder); ROOT is the absolute path of ``work``'s parent.
SPELLINGS = (
    "{name}",
    "./{name}",
    ".//{name}",
    "{root}/work/{name}",
    "../work/{name}",
    "sub/../{name}",
    "../alias/{name}",
    "{root}/alias/./{name}",
    "link{suffix}",
    "./link{suffix}",
    "../alias/link{suffix}",
    "hard{suffix}",
    "{root}/work/hard{suffix}",
)


@contextmanager
def _tree(name: str) -> Iterator[Path]:
    """A fresh folder holding ``work/NAME`` (a valid config) and its other names; yields it."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(os.path.realpath(folder))
        work = root / "work"
        (work / "sub").mkdir(parents=True)
        (work / name).write_bytes(CONFIG)
        suffix = Path(name).suffix
        (work / f"link{suffix}").symlink_to(name)
        os.link(work / name, work / f"hard{suffix}")
        (root / "alias").symlink_to("work")
        yield root


def _snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root``, hidden ones included: a link's target, a file's bytes."""
    entries: dict[str, object] = {}
    for folder, folders, files in os.walk(root):
        for entry in folders + files:
            path = Path(folder, entry)
            relative = str(path.relative_to(root))
            if path.is_symlink():
                entries[relative] = ("link", os.readlink(path))
            elif path.is_dir():
                entries[relative] = "folder"
            else:
                entries[relative] = path.read_bytes()
    return entries


@pytest.mark.parametrize("case", [_case(*case) for case in WRITERS])
@RUN
@given(
    name=st.sampled_from(("c.yaml", "c.svg")),
    source=st.sampled_from(SPELLINGS),
    out=st.sampled_from(SPELLINGS),
)
def test_an_out_that_is_the_input_is_refused_and_nothing_is_written(
    run_cli: RunCli, case: Mode, name: str, source: str, out: str
) -> None:
    # c.svg: render would draw into it, had the refusal not come first.
    verb, mode = case
    with _tree(name) as root:
        names = {"name": name, "root": root, "suffix": Path(name).suffix}
        path, target = source.format(**names), out.format(**names)
        before = _snapshot(root)
        result = run_cli(verb, path, *mode, *_required(verb, target), cwd=root / "work")
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr == (
            f"meshconf: error: --out {target} is the same file as the input {path}; "
            "choose another file\n"
        )
        assert _snapshot(root) == before


def test_an_out_beside_the_input_is_written(run_cli: RunCli, tmp_path: Path) -> None:
    # The refusal is of the same file only: a name that merely resembles it is written.
    (tmp_path / "c.yaml").write_bytes(CONFIG)
    (tmp_path / "c.yaml.args").write_bytes(b"old")
    result = run_cli(
        "convert", "--to", "megatron", "c.yaml", "--out", "./c.yaml.args", cwd=tmp_path
    )
    assert (result.returncode, result.stdout, result.stderr) == (
        0,
        "./c.yaml.args: written\n",
        "",
    )
    assert (tmp_path / "c.yaml").read_bytes() == CONFIG
    assert (tmp_path / "c.yaml.args").read_text().startswith("# Megatron-LM's arguments")


# -- problems go where users look ------------------------------------------------------------


@st.composite
def _invalid_configs(draw: st.DrawFn) -> bytes:
    """A config YAML reads but meshconf refuses at a key: a degree that does not divide the
    world, or a degree misspelled."""
    world_size = draw(st.integers(2, 64))
    if draw(st.booleans()):
        tp = draw(st.integers(2, 128).filter(lambda tp: world_size % tp != 0))
        return f"world_size: {world_size}\ndegrees:\n  tp: {tp}\n".encode()
    typo = draw(st.sampled_from(("tpp", "dp", "pp_size", "tensor_parallel")))
    return f"world_size: {world_size}\ndegrees:\n  {typo}: 2\n".encode()


@st.composite
def _broken_files(draw: st.DrawFn) -> bytes:
    """A file no reader takes: YAML and TOML that do not parse, or bytes that are not UTF-8,
    after a few good lines."""
    head = b"world_size: 8\n" * draw(st.integers(0, 5))
    return head + draw(st.sampled_from((b"degrees: [\n", b"degrees:\n  tp: \xff\n", b"x: 'open\n")))


def _prints_data(case: Mode) -> bool:
    """Whether standard output is data, as docs/cli.md's table says: ``convert``'s, ``plan
    --emit``'s and every ``--format json`` but ``validate``'s, whose output is its problems."""
    verb, mode = case
    json_output = mode == ("--format", "json") and verb != "validate"
    return verb == "convert" or json_output or mode[:1] == ("--emit",)


def _reads_meshconf(case: Mode) -> bool:
    """Whether the verb reads a meshconf config: all but ``convert`` from another tool."""
    verb, mode = case
    return verb != "convert" or "--to" in mode


@pytest.mark.parametrize("case", [_case(*case) for case in READERS])
@RUN
@given(data=st.data())
def test_problems_go_to_standard_error_when_standard_output_is_data(
    run_cli: RunCli, tmp_path: Path, case: Mode, data: st.DataObject
) -> None:
    verb, mode = case
    contents = (
        st.one_of(_invalid_configs(), _broken_files()) if _reads_meshconf(case) else _broken_files()
    )
    (tmp_path / "bad.yaml").write_bytes(data.draw(contents, label="bad.yaml"))
    result = run_cli(verb, "bad.yaml", *mode, *_required(verb), cwd=tmp_path)
    if not _reads_meshconf(case):
        # Another tool's settings: refused at the file, on standard error.
        assert result.returncode in (1, 2) and result.stdout == "", result
        lines = result.stderr.splitlines()
        assert lines, result
        assert all(line.startswith(("bad.yaml:", "meshconf: error: bad.yaml")) for line in lines)
        return
    # validate's text output is what each verb says of the config, where it says it.
    said = run_cli("validate", "bad.yaml", cwd=tmp_path)
    assert said.returncode in (1, 2)
    if said.returncode == 2:
        # a file that cannot be read is a usage error, on standard error, for every verb
        assert (result.returncode, result.stdout, result.stderr) == (2, "", said.stderr)
    elif _prints_data(case):
        assert (result.returncode, result.stdout, result.stderr) == (1, "", said.stdout)
    elif verb == "validate" and mode == ("--format", "json"):
        report = json.loads(result.stdout)
        assert (result.returncode, result.stderr, report["valid"]) == (1, "", False)
        errors = report["files"][0]["errors"]
        assert [error["text"] for error in errors] == said.stdout.splitlines()
    else:
        assert (result.returncode, result.stdout, result.stderr) == (1, said.stdout, "")


def test_each_verb_says_whether_it_prints_data_as_the_docs_do() -> None:
    for verb, mode in READERS:
        args = PARSERS[verb].parse_args(["c.yaml", *mode, *_required(verb)])
        assert prints_data(args) == _prints_data((verb, mode)), (verb, mode)
    assert prints_data(PARSERS["schema"].parse_args([]))
