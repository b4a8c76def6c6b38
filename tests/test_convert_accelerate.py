"""``meshconf convert --from accelerate``: what ``accelerate config`` writes, ``accelerate
launch``'s options and the PARALLELISM_CONFIG_ variables, converted as a user runs it, and
every mistake accelerate would meet at run time reported at its line. (tests/peers checks the
same files against accelerate's own reader and mesh.)"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

import meshconf
from meshconf.features.convert import BY_NAME, ConversionError

EXAMPLE = "examples/migration/accelerate/fsdp2_hsdp_tp_cp_16gpu.yaml"


def _convert(text: str, suffix: str = "", **sizes: Any) -> dict[str, Any]:
    source = BY_NAME["accelerate"]
    assert source.read is not None
    return source.convert(source.read(text, suffix), **sizes).data


def _problems(text: str, suffix: str = "", **sizes: Any) -> list[str]:
    with pytest.raises(ConversionError) as raised:
        _convert(text, suffix, **sizes)
    return [problem.render("f") for problem in raised.value.problems]


def test_the_example_converts_to_accelerate_s_layout(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "hsdp.yaml"
    result = run_cli("convert", "--from", "accelerate", EXAMPLE, "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    config = meshconf.load_config(out)
    assert (config.world_size, config.gpus_per_node) == (16, 8)
    assert config.resolved_degrees == {
        "pp": 1,
        "dp_replicate": 2,
        "dp_shard": 2,
        "cp": 2,
        "tp": 2,
        "ep": 1,
        "etp": 1,
    }
    # accelerate's dims outer to inner are dp_replicate, dp_shard, cp, tp, as meshconf's.
    assert config.layout("dense").group(5, "fsdp").ranks() == [1, 3, 5, 7]
    assert config.layout("loss").group(5, "loss").ranks() == [1, 3, 5, 7, 9, 11, 13, 15]


def test_a_launch_line_and_the_variables_it_sets() -> None:
    script = (
        "export PARALLELISM_CONFIG_TP_SIZE=2\n"
        "PARALLELISM_CONFIG_CP_SIZE=2 PARALLELISM_CONFIG_DP_SHARD_SIZE=4 \\\n"
        "    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 16 --num_machines 2 \\\n"
        "    train.py --parallelism_config_tp_size 8\n"
    )
    data = _convert(script, ".sh")
    assert data["world_size"] == 16 and data["gpus_per_node"] == 8
    assert {k: data["degrees"][k] for k in ("dp_replicate", "dp_shard", "cp", "tp")} == {
        "dp_replicate": 1,
        "dp_shard": 4,
        "cp": 2,
        "tp": 2,
    }


def test_without_sizes_fsdp_shards_and_ddp_replicates_over_every_process() -> None:
    fsdp = _convert("accelerate launch --use_fsdp --num_processes 8 train.py")
    assert fsdp["degrees"]["dp_shard"] == 8
    ddp = _convert("accelerate launch --multi_gpu --num_processes 8 train.py")
    assert ddp["degrees"]["dp_replicate"] == 8
    launcher = _convert("accelerate launch train.py")
    assert launcher["degrees"]["dp_replicate"] == -1 and "world_size" not in launcher


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [
        (
            "num_processes: 12\nparallelism_config:\n  parallelism_config_tp_size: 2\n"
            "  parallelism_config_dp_shard_size: 4\n",
            ".yaml",
            "f:1:1: num_processes: is 12, but the parallelism sizes multiply to 8 "
            "(dp_replicate_size 1 * dp_shard_size 4 * cp_size 1 * tp_size 2); accelerate refuses "
            "a ParallelismConfig whose total_size is not num_processes",
        ),
        (
            "PARALLELISM_CONFIG_DP_REPLICATE_SIZE=4 PARALLELISM_CONFIG_TP_SIZE=2 "
            "accelerate launch --num_processes 8 train.py",
            "",
            "f:1:38: PARALLELISM_CONFIG_DP_REPLICATE_SIZE: accelerate refuses tp beside "
            "replication that does not shard (https://github.com/huggingface/accelerate/issues/"
            "3876): set dp_shard_size to 4 and dp_replicate_size to 1 (FSDP), or dp_shard_size "
            "above 1 as well (HSDP)",
        ),
        (
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\nnum_processes: 4\n"
            "parallelism_config:\n  parallelism_config_tp_size: 4\n",
            ".yml",
            "f:3:3: fsdp_config.fsdp_version: FSDP2 shards over dp_shard * cp, which is 1 here, "
            "and accelerate fails with KeyError 'dp_shard_cp' "
            "(https://github.com/huggingface/accelerate/issues/3798): set dp_shard_size above 1 "
            "(lowering tp_size to leave it processes), or turn FSDP off",
        ),
        (
            "PARALLELISM_CONFIG_SP_SIZE=4 accelerate launch --num_processes 4 train.py",
            "",
            "f:1:28: PARALLELISM_CONFIG_SP_SIZE: is 4: DeepSpeed's Ulysses sequence parallelism, "
            "which meshconf has no degree for; set it to 1, or use cp_size for context "
            "parallelism",
        ),
        (
            "accelerate launch --num_processes 9 --num_machines 2 train.py",
            "",
            "f:1:52: --num_machines: 2 machines cannot share 9 processes evenly; accelerate runs "
            "num_processes / num_machines on each",
        ),
        (
            "accelerate launch --num_processes eight train.py",
            "",
            "f:1:35: --num_processes: expected an integer >= 1, got the string 'eight'",
        ),
        (
            "accelerate launch --parallelism_config_tp_size",
            "",
            "f:1:19: --parallelism_config_tp_size: needs a value",
        ),
        (
            "num_processes: [8\n",
            ".yaml",
            "f:2:1: invalid YAML: YAML syntax: while parsing a flow sequence (from line 1, column "
            "16), did not find expected ',' or ']'",
        ),
    ],
)
def test_mistakes_are_reported_at_their_line(text: str, suffix: str, expected: str) -> None:
    assert _problems(text, suffix) == [expected]


def test_world_size_disagreeing_with_num_processes() -> None:
    assert _problems("num_processes: 8\n", ".yaml", world_size=16) == [
        "f:1:1: num_processes: is 8, but --world-size is 16; give one of them"
    ]


def _rules_refuse(sizes: dict[str, int], fsdp2: bool) -> bool:
    """accelerate's own rules, as its ParallelismConfig and Accelerator apply them."""
    pure = sizes["dp_replicate"] > 1 and sizes["dp_shard"] == 1
    model_parallel = sizes["tp"] > 1 or sizes["cp"] > 1
    world = sizes["dp_replicate"] * sizes["dp_shard"] * sizes["cp"] * sizes["tp"]
    nothing_to_shard = sizes["dp_shard"] == 1 and sizes["cp"] == 1
    return (model_parallel and pure) or (fsdp2 and nothing_to_shard and world > 1)


@pytest.mark.parametrize("fsdp2", [False, True])
def test_generated_launch_lines_convert_or_are_refused_as_accelerate_rules_say(
    fsdp2: bool,
) -> None:
    """Every layout of sizes 1 to 3, as launch options: converted to the same degrees, or
    refused, each problem at its column, when accelerate would refuse it."""
    names = ("dp_replicate", "dp_shard", "cp", "tp")
    for values in itertools.product((1, 2, 3), repeat=4):
        sizes = dict(zip(names, values, strict=True))
        world = values[0] * values[1] * values[2] * values[3]
        options = " ".join(f"--parallelism_config_{n}_size {v}" for n, v in sizes.items())
        fsdp = "--use_fsdp --fsdp_version 2 --use_parallelism_config " if fsdp2 else ""
        line = f"accelerate launch {fsdp}--num_processes {world} {options} train.py"
        if not fsdp2:  # without --use_parallelism_config the launcher applies no size
            (problem,) = _problems(line)
            assert problem.startswith("f:1:") and "hands the script no" in problem, problem
            continue
        if _rules_refuse(sizes, fsdp2):
            problems = _problems(line)
            assert problems and all(p.startswith("f:1:") for p in problems), (line, problems)
            continue
        data = _convert(line)
        assert {n: data["degrees"][n] for n in names} == sizes, line
        assert data["world_size"] == world


LAUNCH_CODE = "accelerate/utils/launch.py, prepare_multi_gpu_env"


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [
        (
            "accelerate launch --num_processes 4 --parallelism_config_tp_size 4 train.py",
            "",
            "f:1:66: --parallelism_config_tp_size: accelerate launch hands the script no "
            f"PARALLELISM_CONFIG_TP_SIZE without --use_parallelism_config ({LAUNCH_CODE}), so "
            "this setting is never applied; add --use_parallelism_config (with --use_fsdp "
            "--fsdp_version 2), or set PARALLELISM_CONFIG_TP_SIZE in the launch's environment",
        ),
        (
            "accelerate launch --num_processes 4 --use_parallelism_config train.py",
            "",
            "f:1:37: --use_parallelism_config: accelerate launch refuses it without --use_fsdp "
            'and --fsdp_version 2 on the same line ("You cannot use `--use_parallelism_config` '
            'without `--use_fsdp` and `--fsdp_version=2`", accelerate/commands/launch.py, '
            "_validate_launch_command): add --use_fsdp --fsdp_version 2, or leave "
            "--use_parallelism_config out",
        ),
        (
            "accelerate launch --use_fsdp --fsdp_version 2 --use_parallelism_config=false t.py",
            "",
            "f:1:47: --use_parallelism_config: is a switch and takes no value, as accelerate "
            "launch's parser refuses '--use_parallelism_config=false': give "
            "--use_parallelism_config to turn it on, leave it out to keep it off",
        ),
        (
            "export PARALLELISM_CONFIG_DP_SHARD_SIZE=4\naccelerate launch --use_fsdp "
            "--fsdp_version 2 --use_parallelism_config --num_processes 4 train.py\n",
            "",
            "f:1:41: PARALLELISM_CONFIG_DP_SHARD_SIZE: is replaced by "
            "--parallelism_config_dp_shard_size's value (its default when not given): with "
            "--use_parallelism_config accelerate launch sets every PARALLELISM_CONFIG_ size "
            f"from its options ({LAUNCH_CODE}); give it as --parallelism_config_dp_shard_size 4",
        ),
    ],
)
def test_sizes_the_launcher_does_not_apply_are_refused(
    text: str, suffix: str, expected: str
) -> None:
    assert _problems(text, suffix) == [expected]


def test_only_the_launch_command_s_own_environment_counts() -> None:
    script = (
        "PARALLELISM_CONFIG_TP_SIZE=8\n"  # the shell's, never exported
        "PARALLELISM_CONFIG_CP_SIZE=2 true\n"  # another command's
        "export PARALLELISM_CONFIG_DP_SHARD_SIZE=2\n"
        "env PARALLELISM_CONFIG_TP_SIZE=2 accelerate launch --num_processes 4 train.py\n"
    )
    degrees = _convert(script, ".sh")["degrees"]
    assert (degrees["dp_shard"], degrees["cp"], degrees["tp"]) == (2, 1, 2)


NOTHING = (
    "f: no accelerate config or launch line found: expected the YAML `accelerate config` "
    "writes (num_processes, distributed_type, parallelism_config, ...) or a script or command "
    "line that runs `accelerate launch`"
)


@pytest.mark.parametrize(
    ("text", "suffix"),
    [
        ("world_size: 8\ndegrees: {tp: 2}\n", ".bak"),
        ("world_size: 8\ndegrees: {tp: 2}\n", ".yaml"),
        (
            "#!/bin/bash\ntorchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 2\n",
            ".sh",
        ),
        ("[parallelism]\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 2\n", ".toml"),
        ("", ""),
    ],
)
def test_a_file_with_nothing_of_accelerate_in_it_is_refused(text: str, suffix: str) -> None:
    assert _problems(text, suffix) == [NOTHING]


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [
        (
            "parallelism_config:\n  parallelism_config_tp_size: 65536\n"
            "  parallelism_config_dp_shard_size: 65536\n  parallelism_config_cp_size: 65536\n",
            ".yaml",
            "f:4:3: parallelism_config.parallelism_config_cp_size: the parallelism sizes multiply "
            "to 281474976710656 (dp_replicate_size 1 * dp_shard_size 65536 * cp_size 65536 * "
            "tp_size 65536), more ranks than torch can number (2147483647)",
        ),
        ("- 1\n- 2\n", ".yaml", "f:1:1: expected accelerate's config, a mapping, got a list"),
    ],
)
def test_refusals_of_the_whole_file_are_located(text: str, suffix: str, expected: str) -> None:
    assert _problems(text, suffix) == [expected]


def test_gpus_per_node_disagreeing_with_num_machines() -> None:
    text = "num_processes: 16\nnum_machines: 2\n"
    assert _problems(text, ".yaml", gpus_per_node=4) == [
        "f:2:1: num_machines: runs 8 processes on each machine (num_processes 16 / num_machines "
        "2), but --gpus-per-node is 4; give one of them"
    ]
    assert _convert(text, ".yaml", gpus_per_node=8)["gpus_per_node"] == 8


@pytest.mark.parametrize("key", ["num_processes", "num_machines"])
@pytest.mark.parametrize("quoted", ["'2'", '"2"', "!!str 2"])
def test_an_integer_written_as_a_string_is_refused_at_its_key(key: str, quoted: str) -> None:
    other = "num_machines: 1" if key == "num_processes" else "num_processes: 8"
    assert _problems(f"{other}\n{key}: {quoted}\n", ".yaml") == [
        f"f:2:1: {key}: expected an integer, got the string '2': accelerate converts none of "
        "its config's values (ClusterConfig in accelerate/commands/config/config_args.py), so "
        "its launcher would compare a string with numbers; write it without quotes"
    ]


@pytest.mark.parametrize(
    ("line", "column"),
    [
        ("accelerate launch --config_file cfg/fsdp.yaml train.py", 33),
        ("accelerate launch --num_processes 8 --config_file=cfg/fsdp.yaml train.py", 51),
    ],
)
def test_a_launch_line_s_config_file_is_refused_with_the_file_to_convert(
    line: str, column: int
) -> None:
    assert _problems(line) == [
        f"f:1:{column}: --config_file: accelerate launch fills in what this line leaves out "
        "from cfg/fsdp.yaml (accelerate/commands/launch.py, _validate_launch_command), which "
        "meshconf does not merge: convert that file itself (`meshconf convert --from "
        "accelerate cfg/fsdp.yaml`), with this line's settings written in it"
    ]
