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
        "PARALLELISM_CONFIG_CP_SIZE=2 accelerate launch --use_fsdp --fsdp_version 2 \\\n"
        "    --num_processes 16 --num_machines 2 --parallelism_config_dp_shard_size=4 \\\n"
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
            "accelerate launch --num_processes 8 --parallelism_config_dp_replicate_size 4 "
            "--parallelism_config_tp_size 2 train.py",
            "",
            "f:1:76: --parallelism_config_dp_replicate_size: accelerate refuses tp beside "
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
        fsdp = "--use_fsdp --fsdp_version 2 " if fsdp2 else ""
        line = f"accelerate launch {fsdp}--num_processes {world} {options} train.py"
        if _rules_refuse(sizes, fsdp2):
            problems = _problems(line)
            assert problems and all(p.startswith("f:1:") for p in problems), (line, problems)
            continue
        data = _convert(line)
        assert {n: data["degrees"][n] for n in names} == sizes, line
        assert data["world_size"] == world
