"""Usage errors of every verb: one ``meshconf: error:`` line on standard error, naming the
option and, for a choice, the choices and the nearest one; names read in any case."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_in_process
from hypothesis import given, settings, strategies as st

from meshconf.cli import VERBS, build_parser
from meshconf.cli.common import EXIT_USAGE

#: The parser of each verb.
PARSERS = build_parser().verbs
#: Every option with choices of every verb, found in the parsers: (verb, option, choices).
CHOICE_OPTIONS = [
    (verb, action.option_strings[-1], tuple(action.choices))
    for verb, parser in PARSERS.items()
    for action in parser._actions
    if action.option_strings and action.choices is not None
]
IDS = [f"{verb} {option}" for verb, option, _ in CHOICE_OPTIONS]


def _listed(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _words_before(verb: str) -> list[str]:
    """The verb and its required arguments, each given a value of no meaning: enough for the
    options after them to be parsed."""
    words = [verb]
    for action in PARSERS[verb]._actions:
        if action.required:
            words += [action.option_strings[-1], "x"] if action.option_strings else ["x.yaml"]
    return words


#: What comes before the option tested, for each verb.
BEFORE = {verb: _words_before(verb) for verb in PARSERS}


def _near_misses(names: tuple[str, ...]) -> st.SearchStrategy[str]:
    """A name with a character left out, changed or added, or cut short."""
    name = st.sampled_from(names)
    character = st.characters(codec="ascii", categories=("L", "N", "P"))
    left_out = name.flatmap(lambda n: st.integers(0, len(n) - 1).map(lambda i: n[:i] + n[i + 1 :]))
    changed = st.tuples(name, st.integers(0, 100), character).map(
        lambda t: t[0][: t[1] % len(t[0])] + t[2] + t[0][t[1] % len(t[0]) + 1 :]
    )
    added = st.tuples(name, st.integers(0, 100), character).map(
        lambda t: t[0][: t[1] % (len(t[0]) + 1)] + t[2] + t[0][t[1] % (len(t[0]) + 1) :]
    )
    cut_short = name.flatmap(lambda n: st.integers(0, len(n)).map(lambda i: n[:i]))
    return st.one_of(left_out, changed, added, cut_short)


def _case_changed(text: str, flips: list[bool]) -> str:
    """``text`` with the case of its characters changed where ``flips`` says (none past it)."""
    flips = (flips + [False] * len(text))[: len(text)]
    return "".join(
        char.swapcase() if flip else char for char, flip in zip(text, flips, strict=True)
    )


def test_every_verb_has_its_choice_options_found() -> None:
    assert {verb for verb, _, _ in CHOICE_OPTIONS} == set(VERBS) - {"simulate", "render"}
    assert (
        "plan",
        "--gpu",
        ("a100-80g", "h100-sxm", "h200", "h800", "b200", "gb200", "mi300x", "mi325x"),
    ) in CHOICE_OPTIONS
    assert (
        "plan",
        "--model",
        ("llama3-8b", "llama3-70b", "llama3-405b", "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b"),
    ) in CHOICE_OPTIONS


@pytest.mark.parametrize(("verb", "option", "names"), CHOICE_OPTIONS, ids=IDS)
def test_choices_are_distinct_lower_case_names(
    verb: str, option: str, names: tuple[str, ...]
) -> None:
    """Read in any case, no two choices could be the same name."""
    assert all(name == name.lower() for name in names)
    assert len({name.lower() for name in names}) == len(names)


def _dest(verb: str, option: str) -> str:
    (dest,) = {action.dest for action in PARSERS[verb]._actions if option in action.option_strings}
    return dest


def _refused(verb: str, option: str, names: tuple[str, ...], wrong: str) -> str:
    """The line ``meshconf VERB OPTION=WRONG`` prints, checked to be all it prints."""
    # `measure` starts torch only to run: a value its options refuse stops it before, in this
    # process, as it stops every other verb.
    result = run_in_process(*BEFORE[verb], f"{option}={wrong}")
    assert (result.returncode, result.stdout) == (EXIT_USAGE, "")
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n")
    assert result.stderr.startswith(
        f"meshconf: error: {option}: expected one of {_listed(names)}, got "
    )
    return result.stderr


@pytest.mark.parametrize(("verb", "option", "names"), CHOICE_OPTIONS, ids=IDS)
def test_every_choice_option_refuses_a_wrong_name_in_one_line_with_the_nearest(
    verb: str, option: str, names: tuple[str, ...]
) -> None:
    wrong = f"{names[0]}x".upper()
    assert _refused(verb, option, names, wrong).endswith(
        f", got {wrong!r} (did you mean {names[0]!r}?)\n"
    )


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_wrong_choice_is_one_line_naming_the_option_and_the_choices(
    data: st.DataObject,
) -> None:
    """Near misses, in any case, and any text: one line, and a name cut short is offered
    whole."""
    verb, option, names = data.draw(st.sampled_from(CHOICE_OPTIONS))
    misses = _near_misses(names) | st.text(max_size=30)
    wrong = data.draw(
        st.tuples(misses, st.lists(st.booleans(), max_size=30))
        .map(lambda drawn: _case_changed(*drawn))
        .filter(lambda text: text.lower() not in names)
    )
    line = _refused(verb, option, names, wrong)
    begun = [name for name in names if len(wrong) >= 2 and name.startswith(wrong.lower())]
    if begun:
        assert f" (did you mean {begun[0]!r}" in line


@pytest.mark.parametrize(("verb", "option", "names"), CHOICE_OPTIONS, ids=IDS)
def test_every_choice_option_reads_a_name_in_capitals_as_the_name(
    verb: str, option: str, names: tuple[str, ...]
) -> None:
    parser = build_parser((verb,))
    for name in names:
        args = parser.parse_command_line([*BEFORE[verb], option, name.upper()])
        assert getattr(args, _dest(verb, option)) == name


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_choice_in_another_case_is_read_as_the_choice(data: st.DataObject) -> None:
    verb, option, names = data.draw(st.sampled_from(CHOICE_OPTIONS))
    name = data.draw(st.sampled_from(names))
    written = _case_changed(name, data.draw(st.lists(st.booleans(), max_size=len(name))))
    args = build_parser((verb,)).parse_command_line([*BEFORE[verb], option, written])
    assert getattr(args, _dest(verb, option)) == name


@pytest.mark.parametrize(("verb", "option", "names"), CHOICE_OPTIONS, ids=IDS)
def test_help_still_lists_the_choices(verb: str, option: str, names: tuple[str, ...]) -> None:
    (action,) = [a for a in PARSERS[verb]._actions if option in a.option_strings]
    shown = action.metavar or "{" + ",".join(names) + "}"
    assert f"{option} {shown}" in PARSERS[verb].format_help()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gpu", "h100"],
            "--gpu: expected one of a100-80g, h100-sxm, h200, h800, b200, gb200, mi300x or "
            "mi325x, got 'h100' (did you mean 'h100-sxm'?)",
        ),
        (
            ["--gpu", "H800x"],
            "--gpu: expected one of a100-80g, h100-sxm, h200, h800, b200, gb200, mi300x or "
            "mi325x, got 'H800x' (did you mean 'h800'?)",
        ),
        (
            ["--pp-schedule", "1f1b-interleaved"],
            "--pp-schedule: expected one of 1f1b, interleaved, llama3, loopedbfs, gpipe, zbv, "
            "dualpipev or dualpipe, got '1f1b-interleaved' (did you mean 'interleaved'?)",
        ),
        (["--zero-stage", "4"], "--zero-stage: expected one of 0, 1, 2 or 3, got '4'"),
        (
            ["--model", "llama3"],
            "--model: expected one of llama3-8b, llama3-70b, llama3-405b, deepseek-v3, "
            "mixtral-8x7b or qwen3-30b-a3b, got 'llama3' (did you mean 'llama3-8b' or "
            "'llama3-70b' or 'llama3-405b'?)",
        ),
        (
            ["--format", "yaml\n--gpu h100"],
            "--format: expected one of text or json, got 'yaml\\n--gpu h100'",
        ),
    ],
)
def test_plan_s_wrong_choices(run_cli, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", "--world-size", "8", "--model", "llama3-8b", *args)
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_USAGE,
        "",
        f"meshconf: error: {message}\n",
    )


def test_names_in_another_case_plan_as_the_names(run_cli) -> None:  # type: ignore[no-untyped-def]
    common = ("plan", "--world-size", "8", "--limit", "1")
    lower = run_cli(*common, "--model", "llama3-8b", "--gpu", "gb200", "--pp-schedule", "1f1b")
    other = run_cli(*common, "--model", "Llama3-8B", "--gpu", "GB200", "--pp-schedule", "1F1B")
    assert (other.returncode, other.stderr) == (0, lower.stderr)
    assert other.stdout == lower.stdout
    assert "; full checkpointing, 1f1b; " in other.stdout and "\ngpu gb200: " in other.stdout


def test_convert_reads_its_source_in_any_case(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "job.toml").write_text("[parallelism]\ndata_parallel_shard_degree = 8\n")
    lower = run_cli(
        "convert", "job.toml", "--from", "torchtitan", "--world-size", "8", cwd=tmp_path
    )
    other = run_cli(
        "convert", "job.toml", "--from", "TorchTitan", "--world-size", "8", cwd=tmp_path
    )
    assert (other.returncode, other.stdout) == (0, lower.stdout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["plna"],
            "VERB: expected one of validate, show, simulate, measure, schema, render, plan or "
            "convert, got 'plna' (did you mean 'plan'?)",
        ),
        (
            ["Show", "x.yaml"],
            "VERB: expected one of validate, show, simulate, measure, schema, render, plan or "
            "convert, got 'Show' (did you mean 'show'?)",
        ),
        ([], "the following arguments are required: VERB"),
        (["show"], "the following arguments are required: PATH"),
        (["show", "x.yaml", "--rnak", "1"], "unknown option '--rnak' (did you mean '--rank'?)"),
        (["show", "x.yaml", "--Gpu=h100"], "unknown option '--Gpu' (did you mean '--gpu'?)"),
        (["show", "x.yaml", "--bogus"], "unknown option '--bogus'; see `meshconf show --help`"),
        (["show", "x.yaml", "y.yaml"], "unexpected argument 'y.yaml'; see `meshconf show --help`"),
        (["plan", "--world-size"], "--world-size: expected one argument"),
        (["plan", "--ep-overlap=1"], "--ep-overlap: ignored explicit argument '1'"),
        (
            ["schema", "--flavor", "hydr"],
            "--flavor: expected one of plain or hydra, got 'hydr' (did you mean 'hydra'?)",
        ),
    ],
)
def test_other_usage_errors_are_one_line(run_cli, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(*args)
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_USAGE,
        "",
        f"meshconf: error: {message}\n",
    )


def test_help_is_argparse_s(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("plan", "--help")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("usage: meshconf plan [-h]")
    assert "\n  --gpu {a100-80g,h100-sxm,h200,h800,b200,gb200,mi300x,mi325x}\n" in result.stdout


@pytest.mark.slow  # starts a Python process
def test_measure_s_wrong_choice_is_one_line(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("measure", "x.yaml", "--build", "m:f", "--gpu", "GB300")
    assert (result.returncode, result.stdout, result.stderr) == (
        EXIT_USAGE,
        "",
        "meshconf: error: --gpu: expected one of a100-80g, h100-sxm, h200, h800, b200, gb200, "
        "mi300x or mi325x, got 'GB300' (did you mean 'gb200'?)\n",
    )
