"""``meshconf convert --from megatron``: the examples round-trip, and bad input is reported at
its line and column, as a user runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO
from test_megatron import MESHCONF_DIMS, assert_same_groups, megatron_groups

import meshconf
from meshconf.features.convert import convert_megatron
from meshconf.features.convert.megatron_input import read_command_line

SCRIPT = "examples/migration/megatron/llama3_70b_512gpu.sh"
NEMO = "examples/migration/megatron/nemo_moe_32gpu.yaml"


def test_the_script_example_round_trips(run_cli) -> None:  # type: ignore[no-untyped-def]
    """The launch script converts to the committed config, whose groups are Megatron's."""
    result = run_cli("convert", "--from", "megatron", SCRIPT)
    assert result.returncode == 0, result.stdout + result.stderr
    committed = (REPO / "examples/migration/from_megatron.yaml").read_text(encoding="utf-8")
    # Only the schema modeline differs: it is relative to where the file is written.
    assert result.stdout.splitlines()[1:] == committed.splitlines()[1:]
    config = meshconf.load_config(REPO / "examples/migration/from_megatron.yaml")
    groups = megatron_groups(
        tp=8, pp=4, cp=1, ep=1, etp=8, instances=2, world=512, order="tp-cp-ep-dp-pp"
    )
    assert groups is not None
    assert assert_same_groups(config.layouts, groups) == 512 * len(groups)
    assert config.layout("dense").group(0, "fsdp").ranks() == list(range(0, 64, 8))


def test_the_nemo_example_converts_to_megatrons_groups(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "moe.yaml"
    result = run_cli("convert", "--from", "megatron", NEMO, "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    config = meshconf.load_config(out)
    assert config.resolved_degrees == {
        "pp": 2,
        "dp_replicate": 1,
        "dp_shard": 4,
        "cp": 2,
        "tp": 2,
        "ep": 8,
        "etp": 1,
    }
    groups = megatron_groups(
        tp=2, pp=2, cp=2, ep=8, etp=1, instances=1, world=32, order="tp-cp-ep-dp-pp"
    )
    assert groups is not None and set(groups) <= set(MESHCONF_DIMS)
    assert assert_same_groups(config.layouts, groups) == 32 * len(groups)


def test_meta_order_from_the_command_line(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--use-tp-pp-dp-mapping is Meta's Llama 3 order; it converts to the example's config."""
    args = "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --use-tp-pp-dp-mapping"
    result = run_cli(
        "convert",
        "--from",
        "megatron",
        "--args",
        args,
        "--world-size",
        "16384",
        "--gpus-per-node",
        "8",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "order: [dp_replicate, dp_shard, pp, cp, tp]" in result.stdout.splitlines()
    (tmp_path / "meta.yaml").write_text(result.stdout, encoding="utf-8")
    converted = meshconf.load_config(tmp_path / "meta.yaml")
    example = meshconf.load_config(REPO / "examples/llama3_405b_16384gpu_meta_order.yaml")
    # Megatron's expert tp defaults to tp, the example's etp to 1: the sparse domains differ.
    for domain in ("dataloading", "dense", "loss"):
        assert converted.layout(domain) == example.layout(domain)


BAD_INPUT = [
    (
        "job.sh",
        "TP=eight\ntorchrun --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size $TP\n",
        "job.sh:2:74: --tensor-model-parallel-size: expected an integer >= 1, got the string "
        "'eight'",
    ),
    (
        "job.sh",
        "torchrun --nproc_per_node 8 pretrain_gpt.py \\\n  --context-parallel-size $CP\n",
        "job.sh:2:27: --context-parallel-size: expected an integer >= 1, got the string '$CP': "
        "a shell variable the script does not set; write the number",
    ),
    (
        "job.sh",
        "torchrun pretrain_gpt.py --pipeline-model-parallel-size\n",
        "job.sh:1:26: --pipeline-model-parallel-size: needs a value",
    ),
    (
        "job.sh",
        "echo start\nsleep 1\n",
        "job.sh: no Megatron-LM launch line or arguments found: expected a script or command "
        "line that runs torchrun or a Megatron-LM training script (pretrain_gpt.py, ...), or "
        "Megatron-LM's arguments (--tensor-model-parallel-size, ...)",
    ),
    (
        "job.sh",
        "torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py --tensor-model-parallel-size 8"
        " --pipeline-model-parallel-size 3\n",
        "job.sh:1:85: --tensor-model-parallel-size: world size 64 is not divisible by tp(8) * "
        "pp(3) * cp(1) = 24",
    ),
    (
        "job.yaml",
        "trainer:\n  devices: 8\n  strategy:\n    tensor_model_parallel_size: 2\nmodel:\n"
        "  tensor_model_parallel_size: 4\n",
        "job.yaml:6:3: model.tensor_model_parallel_size: 4 here but 2 at "
        "trainer.strategy.tensor_model_parallel_size: which one is meant?",
    ),
    (
        "job.yaml",
        "model: [1,\n",
        "job.yaml:2:1: invalid YAML: YAML syntax: while parsing a flow node, did not find "
        "expected node content",
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), BAD_INPUT)
def test_bad_input_is_reported_where_it_is(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, name: str, text: str, expected: str
) -> None:
    (tmp_path / name).write_text(text, encoding="utf-8")
    result = run_cli("convert", "--from", "megatron", name, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", expected + "\n")


BAD_ARGS = [
    (
        "--tensor-model-parallel-size 4 --expert-tensor-parallel-size 2 "
        "--expert-model-parallel-size 2",
        "--args:1:62: --expert-tensor-parallel-size: expert tp 2 is neither 1 nor tp (4); "
        "meshconf's etp is one of those",
    ),
    (
        "--tensor-model-parallel-size 2 --order tp-dp-xp",
        "--args:1:40: --order: 'tp-dp-xp' is not an order Megatron accepts: it names each of "
        "tp, cp, ep, dp, pp at most once, inner to outer, and every one above 1 (xp)",
    ),
    (
        "--use-distributed-optimizer --tensor-model-parallel-size 2 --order tp-dp-cp-pp "
        "--context-parallel-size 2 "
        "--num-distributed-optimizer-instances 2",
        "--args:1:68: --order: meshconf cannot express Megatron's intra-instance dp-cp groups "
        "with order tp-dp-cp-pp: no layout of the dense domain's fsdp holds the same ranks",
    ),
]


@pytest.mark.parametrize(("args", "expected"), BAD_ARGS)
def test_bad_arguments_are_reported_where_they_are(run_cli, args: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("convert", "--from", "megatron", "--args", args, "--world-size", "64")
    assert (result.returncode, result.stdout, result.stderr) == (1, "", expected + "\n")


def test_usage_errors(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("convert", "--from", "megatron", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == "meshconf: error: --from megatron needs PATH or --args"
    result = run_cli("convert", "--args", "--tensor-model-parallel-size 2", "x.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr.splitlines()[-1]
        == "meshconf: error: --args is for --from megatron or --from accelerate"
    )


def test_a_script_is_read_as_the_shell_would_expand_it() -> None:
    """export, defaults, arithmetic, arrays, --flag=value, quotes, comments, continuations."""
    script = (
        "#!/bin/bash\n"
        "export TP=4   # tensor parallel\n"
        "NODES=${NUM_NODES:-2}\n"
        "PP=$(( 8 / 4 ))\n"
        "EXPERTS=(--expert-model-parallel-size 8 '--expert-tensor-parallel-size' 1)\n"
        "torchrun --nproc-per-node=8 --nnodes $NODES \\\n"
        '    pretrain_gpt.py --tensor-model-parallel-size "$TP" \\\n'
        "    --pipeline-model-parallel-size=$PP ${EXPERTS[@]} --num-layers 32 --hidden-size 4096\n"
    )
    settings = read_command_line(script)
    found = {
        name: (setting.key, setting.value, setting.position) for name, setting in settings.items()
    }
    assert found == {
        "nproc_per_node": ("--nproc-per-node", "8", (6, 27)),
        "nnodes": ("--nnodes", "2", (6, 38)),
        "tensor_model_parallel_size": ("--tensor-model-parallel-size", "4", (7, 50)),
        "pipeline_model_parallel_size": ("--pipeline-model-parallel-size", "2", (8, 36)),
        "expert_model_parallel_size": ("--expert-model-parallel-size", "8", (5, 39)),
        "expert_tensor_parallel_size": ("--expert-tensor-parallel-size", "1", (5, 73)),
        "num_layers": ("--num-layers", "32", (8, 67)),
    }
    conversion = convert_megatron(settings)
    assert conversion.data["world_size"] == 16
    assert conversion.data["degrees"]["ep"] == 8


def test_nemo_s_null_training_settings_are_left_to_the_defaults(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """NeMo writes null for a setting it leaves to Megatron: no training key, no problem."""
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text(
        "trainer: {devices: 8, num_nodes: 2}\n"
        "model:\n"
        "  tensor_model_parallel_size: 2\n"
        "  pipeline_model_parallel_size: 2\n"
        "  virtual_pipeline_model_parallel_size: null\n"
        "  decoder_first_pipeline_num_layers: null\n"
        "  moe_router_group_topk: 2\n"
    )
    out = tmp_path / "converted.yaml"
    result = run_cli("convert", "--from", "megatron", str(nemo), "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    training = meshconf.load_config(out).training
    assert training is not None
    # tp 2 without sequence_parallel: the norms' activations whole on every tp rank
    assert training.estimate_settings() == {
        "zero_stage": 0,
        "moe_max_nodes": 2,
        "sequence_parallel": "none",
    }


NO_ARGUMENTS = (
    "f: no Megatron-LM launch line or arguments found: expected a script or command line that "
    "runs torchrun or a Megatron-LM training script (pretrain_gpt.py, ...), or Megatron-LM's "
    "arguments (--tensor-model-parallel-size, ...)"
)
NO_NEMO_SETTINGS = (
    "f: no NeMo parallelism settings found: expected NeMo's YAML with Megatron-LM's "
    "parallelism settings (model.tensor_model_parallel_size, trainer.devices, ...)"
)


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [
        ("num_processes: 8\ndistributed_type: MULTI_GPU\n", ".yaml", NO_NEMO_SETTINGS),
        ("world_size: 8\ndegrees: {tp: 2}\n", ".yml", NO_NEMO_SETTINGS),
        ("{}\n", ".yaml", NO_NEMO_SETTINGS),
        ("accelerate launch --num_processes 8 train.py\n", ".sh", NO_ARGUMENTS),
        ("python train.py --lr 3e-4\n", ".sh", NO_ARGUMENTS),
        ("echo start\n", ".sh", NO_ARGUMENTS),
        ("", ".sh", NO_ARGUMENTS),
        ("", "", NO_ARGUMENTS),
    ],
)
def test_a_file_with_nothing_of_megatron_in_it_is_refused(
    text: str, suffix: str, expected: str
) -> None:
    source = meshconf.features.convert.BY_NAME["megatron"]
    assert source.read is not None
    with pytest.raises(meshconf.features.convert.ConversionError) as raised:
        source.read(text, suffix)
    assert [problem.render("f") for problem in raised.value.problems] == [expected]


@pytest.mark.parametrize(
    "text",
    [
        "torchrun --nproc-per-node 8 pretrain_gpt.py\n",
        "python pretrain_mamba.py\n",
        "trainer:\n  devices: 8\n",
    ],
)
def test_a_megatron_launch_without_sizes_keeps_megatron_s_defaults(text: str) -> None:
    source = meshconf.features.convert.BY_NAME["megatron"]
    assert source.read is not None
    settings = source.read(text, ".yaml" if text.startswith("trainer") else ".sh")
    degrees = source.convert(settings).data["degrees"]
    assert (degrees["tp"], degrees["pp"], degrees["cp"]) == (1, 1, 1)
