"""Launch scripts read as bash runs them, checked against bash itself.

Generated scripts wrap a real ``accelerate launch`` line in here-documents, ``env`` and
``NAME=value`` prefixes, comments, assignments and redirections. bash runs each with
``accelerate`` replaced by a stub that records its arguments and its ``PARALLELISM_CONFIG_*``
variables; meshconf's reading of the same text must give the same arguments and variables.
Scripts bash will not run are refused at the line ``bash -n`` names.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf.features.convert.accelerate_input import read_accelerate
from meshconf.features.convert.draft import ConversionError
from meshconf.features.convert.shell import commands
from meshconf.features.convert.shell_words import Word

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")

STUB = """#!/bin/sh
{
for argument in "$@"; do printf 'ARG %s\\n' "$argument"; done
env | grep '^PARALLELISM_CONFIG_' | sort | sed 's/^/ENV /'
} >> "$STUB_OUT"
"""
DECOY = "accelerate launch --num_processes 8 --parallelism_config_tp_size 8 decoy.py"
DECOY_EXPORT = "export PARALLELISM_CONFIG_TP_SIZE=8"


def bash_runs(script: str, where: Path) -> tuple[list[str], dict[str, str]] | None:
    """The arguments and PARALLELISM_CONFIG_* variables bash starts ``accelerate`` with, or
    None when it never starts it."""
    bin_dir = where / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "accelerate"
    stub.write_text(STUB)
    stub.chmod(0o755)
    record = where / "record"
    record.unlink(missing_ok=True)
    (where / "job.sh").write_text(script)
    subprocess.run(
        [str(BASH), "job.sh"],
        cwd=where,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(record)},
        capture_output=True,
        timeout=30,
        check=False,
    )
    if not record.exists():
        return None
    lines = record.read_text().splitlines()
    arguments = [line[4:] for line in lines if line.startswith("ARG ")]
    variables = dict(line[4:].split("=", 1) for line in lines if line.startswith("ENV "))
    return arguments, variables


def meshconf_reads(script: str) -> tuple[list[str], dict[str, str]] | None:
    """The same, as meshconf reads the script: the launch command's words after its
    ``accelerate``, and the variables of the environment it is started with."""
    environments: list[list[Word]] = []
    lines = list(commands(script, environments=environments))
    index = next(
        (i for i, line in enumerate(lines) if line[:2] and line[0].text == "accelerate"), None
    )
    if index is None:
        return None
    variables = dict(
        word.text.split("=", 1)
        for word in environments[index]
        if word.text.startswith("PARALLELISM_CONFIG_")
    )
    return [word.text for word in lines[index][1:]], variables


def heredoc(draw: st.DrawFn) -> str:
    """A command with one or two here-documents whose bodies look like launch lines."""
    bodies = []
    operators = []
    for index in range(draw(st.integers(1, 2))):
        delimiter = draw(st.sampled_from(["EOF", "END_OF_SCRIPT", "X"])) + str(index)
        quoting = draw(st.sampled_from(["", "'", '"']))
        strip = draw(st.booleans())
        operators.append(f"<<{'-' if strip else ''}{quoting}{delimiter}{quoting}")
        indent = "\t" if strip else ""
        lines = draw(st.lists(st.sampled_from([DECOY, DECOY_EXPORT, "echo $TP", "'"]), max_size=3))
        bodies.append("".join(f"{indent}{line}\n" for line in lines) + f"{indent}{delimiter}\n")
    command = draw(st.sampled_from(["cat > o.sh", "cat", "tee o.sh >/dev/null"]))
    return f"{command} {' '.join(operators)}\n{''.join(bodies)}"


@st.composite
def scripts(draw: st.DrawFn) -> str:
    """A script around a launch line, and the launch line's expected reading is bash's."""
    pieces = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(
            st.sampled_from(
                ["heredoc", "comment", "assign", "export", "echo", "shell", "other", "mark"]
            )
        )
        if kind == "heredoc":
            pieces.append(heredoc(draw))
        elif kind == "comment":
            pieces.append(f"# {DECOY} <<EOF 'unclosed\n")
        elif kind == "assign":
            pieces.append(f"TP={draw(st.sampled_from(['2', '4', '$((2*2))']))}\n")
        elif kind == "export":
            name = draw(st.sampled_from(["TP_SIZE", "CP_SIZE", "DP_SHARD_SIZE"]))
            pieces.append(f"export PARALLELISM_CONFIG_{name}={draw(st.integers(1, 8))}\n")
        elif kind == "shell":  # the shell's own variable, never exported
            pieces.append(f"PARALLELISM_CONFIG_SP_SIZE={draw(st.integers(1, 8))}\n")
        elif kind == "other":  # another command's environment
            pieces.append(f"PARALLELISM_CONFIG_CP_SIZE={draw(st.integers(1, 8))} true\n")
        elif kind == "mark":  # exported after it was assigned, or assigned once exported
            pieces.append(
                draw(
                    st.sampled_from(
                        [
                            "export PARALLELISM_CONFIG_SP_SIZE\n",
                            "declare -x PARALLELISM_CONFIG_DP_REPLICATE_SIZE=3\n",
                            "PARALLELISM_CONFIG_TP_SIZE=7\n",
                        ]
                    )
                )
            )
        else:
            pieces.append("echo 'a; b' \"$TP\" > /dev/null 2>&1\n")
    prefixes = draw(
        st.lists(
            st.sampled_from(
                [
                    "PARALLELISM_CONFIG_TP_SIZE=4",
                    "PARALLELISM_CONFIG_DP_SHARD_SIZE=2",
                    "TP=16",
                    "PARALLELISM_CONFIG_CP_SIZE=$TP",
                ]
            ),
            max_size=3,
        )
    )
    prefix = " ".join(prefixes)
    if prefixes and draw(st.booleans()):
        prefix = f"env {prefix}"
    options = draw(
        st.lists(
            st.sampled_from(
                [
                    "--num_processes 16",
                    "--parallelism_config_tp_size ${TP:-1}",
                    "--parallelism_config_cp_size=2",
                    "--use_fsdp",
                    "--fsdp_version 2",
                ]
            ),
            max_size=3,
        )
    )
    ending = draw(st.sampled_from(["", " > log 2>&1", " 2>&1 | tee log", " &> log", " </dev/null"]))
    launch = f"{prefix} accelerate launch {' '.join(options)} train.py --lr 1e-4{ending}\n"
    after = draw(st.sampled_from(["", "echo done\n", f"cat <<'EOF'\n{DECOY}\nEOF\n"]))
    # TP is set first: a variable the script never sets stays as written, for the
    # converter to name (tests/test_convert_megatron.py), where bash makes it empty.
    return "TP=3\n" + "".join(pieces) + launch.lstrip() + after


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=scripts())
def test_generated_scripts_read_as_bash_runs_them(script: str, tmp_path: Path) -> None:
    assert meshconf_reads(script) == bash_runs(script, tmp_path), script


@pytest.mark.parametrize(
    ("script", "tp", "dp_shard", "processes"),
    [
        (
            "cat > o.sh <<'EOF'\n"
            "accelerate launch --num_processes 8 --parallelism_config_tp_size 8 train.py\n"
            "EOF\n"
            "accelerate launch --num_processes 4 train.py\n",
            None,
            None,
            "4",
        ),
        (
            "env PARALLELISM_CONFIG_TP_SIZE=4 PARALLELISM_CONFIG_DP_SHARD_SIZE=4 "
            "accelerate launch --num_processes 16 train.py\n",
            "4",
            "4",
            "16",
        ),
    ],
)
def test_the_launch_line_is_the_one_bash_runs(
    script: str, tp: str | None, dp_shard: str | None, processes: str
) -> None:
    found = read_accelerate(script, ".sh")
    assert found["num_processes"].value == processes
    assert (found["tp_size"].value if "tp_size" in found else None) == tp
    assert (found["dp_shard_size"].value if "dp_shard_size" in found else None) == dp_shard


def refusal(script: str) -> str:
    with pytest.raises(ConversionError) as caught:
        list(commands(script, environments=[]))
    (problem,) = caught.value.problems
    return problem.render("job.sh")


def bash_n(script: str, where: Path) -> tuple[int, str]:
    (where / "job.sh").write_text(script)
    result = subprocess.run(
        [str(BASH), "-n", "job.sh"], cwd=where, capture_output=True, text=True, check=False
    )
    return result.returncode, result.stderr


BROKEN = {
    "quote": ("echo 'never closed\n", "unexpected EOF while looking for matching `''"),
    "double quote": ('echo "never closed\n', "unexpected EOF while looking for matching `\"'"),
    "backtick": ("X=`nproc\n", "unexpected EOF while looking for matching ``'"),
    "redirection": (
        "accelerate launch train.py >\n",
        "syntax error near unexpected token `newline'",
    ),
}


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(good=scripts(), kind=st.sampled_from(sorted(BROKEN)), plain_lines=st.integers(0, 3))
def test_what_bash_will_not_run_is_refused_at_its_line(
    good: str, kind: str, plain_lines: int, tmp_path: Path
) -> None:
    broken, said = BROKEN[kind]
    script = good + broken + "plain words\n" * plain_lines
    line = good.count("\n") + 1
    code, stderr = bash_n(script, tmp_path)
    assert code == 2
    assert f"job.sh: line {line}: {said}" in stderr
    message = refusal(script)
    assert re.match(rf"job\.sh:{line}:[0-9]+: ", message), message
    assert said in message


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(good=scripts(), strip=st.booleans(), body=st.integers(0, 3))
def test_a_heredoc_no_line_ends_is_refused_at_its_line(
    good: str, strip: bool, body: int, tmp_path: Path
) -> None:
    script = good + f"cat <<{'-' if strip else ''}'EOF'\n" + f"{DECOY}\n" * body + "EOF \n"
    line = good.count("\n") + 1
    _, stderr = bash_n(script, tmp_path)
    said = f"here-document at line {line} delimited by end-of-file (wanted `EOF')"
    assert said in stderr
    assert refusal(script) == (
        f"job.sh:{line}:5: {said}: bash would read the rest of the script as its text; end it "
        "with a line that is exactly EOF"
    )


def test_an_unclosed_command_substitution_is_refused_where_it_opens(tmp_path: Path) -> None:
    script = "echo a\nX=$(nproc\nfoo\n"
    code, stderr = bash_n(script, tmp_path)
    assert code == 2
    assert "unexpected EOF while looking for matching `)'" in stderr
    assert refusal(script) == (
        "job.sh:2:3: unexpected EOF while looking for matching `)': the $( here is never "
        "closed, so bash would not run the script; close it"
    )


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (
            "env -i PARALLELISM_CONFIG_TP_SIZE=2 accelerate launch train.py\n",
            "job.sh:1:5: env -i starts the command with an empty environment, which meshconf "
            "does not follow when it reads the environment a script sets; set the variables "
            "the command needs with NAME=value before it instead",
        ),
        (
            "export PARALLELISM_CONFIG_TP_SIZE=2\n"
            "env -u PARALLELISM_CONFIG_TP_SIZE accelerate launch train.py\n",
            "job.sh:2:5: env -u takes a variable out of the environment, which meshconf does "
            "not follow when it reads the environment a script sets; set the variables the "
            "command needs with NAME=value before it instead",
        ),
        (
            "env -S 'accelerate launch' train.py\n",
            "job.sh:1:5: env's option -S is one meshconf does not read: it may change the "
            "command's words or its environment; write the command and its NAME=value "
            "assignments without env",
        ),
    ],
)
def test_env_options_meshconf_does_not_follow_are_refused_at_their_word(
    script: str, message: str
) -> None:
    assert refusal(script) == message


def test_accelerate_s_reader_refuses_env_that_clears_the_exported_sizes() -> None:
    script = (
        "export PARALLELISM_CONFIG_TP_SIZE=2\nenv -i accelerate launch --num_processes 2 train.py\n"
    )
    with pytest.raises(ConversionError) as caught:
        read_accelerate(script, ".sh")
    (problem,) = caught.value.problems
    assert problem.render("job.sh").startswith(
        "job.sh:2:5: env -i starts the command with an empty environment"
    )


def test_env_options_do_not_matter_to_a_reader_of_words() -> None:
    script = "env -i -u HOME -C /tmp A=1 torchrun --nproc-per-node 8 pretrain_gpt.py\n"
    (line,) = commands(script)
    assert [word.text for word in line] == ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py"]


def test_an_assignment_before_a_command_is_that_commands_alone() -> None:
    script = "TP=2\nTP=8 X=$TP echo $TP\necho $TP $X\nA=1 B=$A\necho $B\n"
    environments: list[list[Word]] = []
    lines = [[word.text for word in line] for line in commands(script, environments)]
    assert lines == [["echo", "2"], ["echo", "2", "$X"], ["echo", "1"]]
    assert [[word.text for word in words] for words in environments] == [["TP=8", "X=8"], [], []]


@pytest.mark.parametrize(("times", "column"), [(18, 26), (19, 3), (40, 3)])
def test_a_value_doubling_itself_is_refused_where_it_passes_the_bound(
    times: int, column: int
) -> None:
    """Line 20 is the launch line after 18 doublings, or the 19th doubling."""
    script = "A=xy\n" + "A=$A$A\n" * times + "torchrun pretrain_gpt.py $A\n"
    with pytest.raises(ConversionError) as raised:
        list(commands(script))
    assert [problem.render("f") for problem in raised.value.problems] == [
        f"f:20:{column}: the expansions up to here make more than 1,048,576 characters; "
        "meshconf reads scripts whose variables expand to less"
    ]


def test_a_value_doubling_itself_under_the_bound_is_read_whole() -> None:
    script = "A=xy\n" + "A=$A$A\n" * 17 + "torchrun pretrain_gpt.py $A\n"
    (line,) = commands(script)
    assert len(line[-1].text) == 2**18
