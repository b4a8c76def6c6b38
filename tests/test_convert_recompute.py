"""The config's ``training.activation_checkpointing`` (and ``fp8_param_gather`` and
``zero_stage``), read by
``meshconf convert`` from Megatron-LM's recomputation arguments and from a torchtitan job
TOML's ``[activation_checkpoint]`` and ``[quantize.linear.float8]`` tables: where the
estimate's modes say the same, the key is written (torchtitan's layer-wise selective
checkpointing as ``full`` with ``checkpoint_every``); where they cannot (Megatron's layers
recomputed in groups, or only some of them), a note says so and the key is left to the
estimate's default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import meshconf
from meshconf.features.convert import BY_NAME, MEGATRON, TORCHTITAN
from meshconf.features.convert.draft import ConversionError
from meshconf.features.convert.megatron_input import read_command_line, read_nemo_yaml

ARGS = "--tensor-model-parallel-size 2 --use-distributed-optimizer "


def _converted(run_cli, tmp_path: Path, arguments: str):  # type: ignore[no-untyped-def]
    out = tmp_path / "converted.yaml"
    result = run_cli(
        "convert", "--from", "megatron", "--args", ARGS + arguments, "--world-size", "16",
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return meshconf.load_config(out), out.read_text()


@pytest.mark.parametrize(
    ("arguments", "mode", "first", "group"),
    [
        (
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
            "full",
            None,
            None,
        ),
        # groups of 2 blocks, each recomputed whole from its input
        (
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2",
            "full",
            None,
            2,
        ),
        # the first 4 blocks of each model chunk
        (
            "--recompute-granularity full --recompute-method block --recompute-num-layers 4",
            "full",
            4,
            None,
        ),
        ("--recompute-granularity selective", "none", None, None),
        # Megatron-LM's switch for selective recomputation
        ("--recompute-activations", "none", None, None),
        # DeepSeek-V3's recomputation, as Megatron-Core's modules name it, in any order
        (
            "--recompute-granularity selective --recompute-modules layernorm mla_up_proj moe_act",
            "norms-latent-swiglu",
            None,
            None,
        ),
        (
            "--recompute-modules moe_act layernorm mla_up_proj --recompute-activations",
            "norms-latent-swiglu",
            None,
            None,
        ),
        # other modules: as Megatron-LM's selective recomputation of the core attention
        (
            "--recompute-granularity selective --recompute-modules layernorm mla_up_proj",
            "none",
            None,
            None,
        ),
        (
            "--recompute-granularity selective --recompute-modules core_attn layernorm "
            "mla_up_proj moe_act",
            "none",
            None,
            None,
        ),
        ("--recompute-granularity selective --recompute-modules=moe_act", "none", None, None),
        ("--recompute-granularity selective --recompute-modules", "none", None, None),
        # Megatron-LM reads the modules only under selective granularity
        (
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
            "--recompute-modules layernorm mla_up_proj moe_act",
            "full",
            None,
            None,
        ),
    ],
)
def test_recomputation_the_estimate_can_say_is_converted(
    run_cli, tmp_path: Path, arguments: str, mode: str, first: int | None, group: int | None
) -> None:  # type: ignore[no-untyped-def]
    config, _ = _converted(run_cli, tmp_path, arguments)
    assert config.training is not None
    assert config.training.activation_checkpointing == mode
    assert config.training.checkpoint_first == first
    assert config.training.checkpoint_group == group


def test_deepseek_v3_s_modules_convert_without_the_core_attention_note(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    arguments = (
        "--recompute-granularity selective --recompute-modules layernorm mla_up_proj moe_act "
        "--sequence-parallel"
    )
    config, text = _converted(run_cli, tmp_path, arguments)
    assert config.training is not None
    assert config.training.activation_checkpointing == "norms-latent-swiglu"
    # the modules end at the next option, which is read as itself
    assert config.training.sequence_parallel == "megatron"
    assert "core attention" not in text


@pytest.mark.parametrize(
    ("modules", "mode"),
    [
        ("[layernorm, mla_up_proj, moe_act]", "norms-latent-swiglu"),
        ("[mla_up_proj, moe_act]", "none"),
        ("moe_act", "none"),
    ],
)
def test_nemo_s_recompute_modules_are_read_as_a_list(modules: str, mode: str) -> None:
    nemo = (
        "trainer: {devices: 8, num_nodes: 1}\n"
        "model:\n"
        "  recompute_granularity: selective\n"
        f"  recompute_modules: {modules}\n"
    )
    converted = BY_NAME[MEGATRON].convert(read_nemo_yaml(nemo), world_size=8)
    assert converted.data["training"]["activation_checkpointing"] == mode


def test_the_recomputation_switch_overrides_the_granularity_with_a_note(
    run_cli, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    arguments = (
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
        "--recompute-activations"
    )
    config, text = _converted(run_cli, tmp_path, arguments)
    assert config.training is not None
    assert config.training.activation_checkpointing == "none"
    assert (
        "# - --recompute-activations sets Megatron-LM's recomputation to selective, over\n"
        "#   --recompute-granularity full.\n"
    ) in text


def test_full_recomputation_without_a_method_is_left_with_a_note(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    arguments = "--recompute-granularity full --recompute-num-layers 2"
    config, text = _converted(run_cli, tmp_path, arguments)
    assert config.training is not None
    assert config.training.activation_checkpointing is None
    note = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert (
        f"{arguments} is not converted: Megatron-LM's full recomputation takes "
        "--recompute-method uniform or block with --recompute-num-layers N (at least 1)"
    ) in note


def test_an_unknown_granularity_is_refused_at_its_argument(run_cli) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "convert", "--from", "megatron", "--args", "--recompute-granularity partial",
        "--world-size", "16",
    )  # fmt: skip
    assert (result.returncode, result.stderr) == (
        1,
        "--args:1:25: --recompute-granularity: expected full or selective, got the string "
        "'partial'\n",
    )


@pytest.mark.parametrize(
    ("key", "option", "said"),
    [
        ("activation_checkpointing: selective", ("--activation-checkpointing", "selective"),
         "; selective checkpointing,"),
        ("fp8_param_gather: true", ("--fp8-param-gather",), "; fp8 param gather"),
    ],
)  # fmt: skip
def test_the_block_and_the_option_give_the_same_estimate(
    run_cli, tmp_path: Path, key: str, option: tuple[str, ...], said: str
) -> None:  # type: ignore[no-untyped-def]
    block = tmp_path / "block.yaml"
    block.write_text(f"world_size: 8\ndegrees: {{dp_shard: 8}}\ntraining:\n  {key}\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("world_size: 8\ndegrees: {dp_shard: 8}\n")
    from_block = run_cli("show", str(block), "--model", "llama3-8b", "--format", "json")
    from_option = run_cli("show", str(plain), "--model", "llama3-8b", "--format", "json", *option)
    assert from_block.returncode == 0, from_block.stderr
    assert json.loads(from_block.stdout)["estimate"] == json.loads(from_option.stdout)["estimate"]
    assert said in run_cli("show", str(block), "--model", "llama3-8b").stdout


def test_an_option_overrides_the_block(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    block = tmp_path / "block.yaml"
    block.write_text(
        "world_size: 8\ndegrees: {dp_shard: 8}\ntraining:\n  activation_checkpointing: selective\n"
    )
    overridden = run_cli(
        "show", str(block), "--model", "llama3-8b", "--activation-checkpointing", "full"
    )
    assert "; full checkpointing," in overridden.stdout


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        # tp 2 without --sequence-parallel: the norms' activations whole on every tp rank
        (
            "--fp8-param-gather",
            {"zero_stage": 1, "fp8_param_gather": True, "sequence_parallel": "none"},
        ),
        ("", {"zero_stage": 1, "sequence_parallel": "none"}),
    ],
)
def test_megatron_s_fp8_param_gather_is_converted(
    run_cli, tmp_path: Path, written: str, expected: dict[str, object]
) -> None:  # type: ignore[no-untyped-def]
    config, _ = _converted(run_cli, tmp_path, written)
    assert config.training is not None
    assert config.training.estimate_settings() == expected


def test_megatron_s_fp8_param_gather_without_its_distributed_optimizer_is_refused(
    run_cli,
) -> None:  # type: ignore[no-untyped-def]
    result = run_cli(
        "convert", "--from", "megatron", "--args", "--tensor-model-parallel-size 2 "
        "--fp8-param-gather", "--world-size", "16",
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        "--args:1:32: --fp8-param-gather: fp8_param_gather needs zero_stage 1, 2 or 3: ZeRO 0 "
        "keeps the parameters whole on every rank and gathers none\n"
    )


@pytest.mark.parametrize(
    ("value", "zero_stage", "problem"),
    [
        ("false", 0, None),
        ("true", 1, None),
        (
            "'yes'",
            None,
            "model.use_distributed_optimizer: expected true or false, got the string 'yes'",
        ),
    ],
)
def test_nemo_s_distributed_optimizer_is_read_by_its_value(
    run_cli, tmp_path: Path, value: str, zero_stage: int | None, problem: str | None
) -> None:  # type: ignore[no-untyped-def]
    nemo = tmp_path / "nemo.yaml"
    nemo.write_text(
        "trainer: {devices: 8, num_nodes: 1}\n"
        f"model:\n  tensor_model_parallel_size: 2\n  use_distributed_optimizer: {value}\n"
    )
    out = tmp_path / "converted.yaml"
    result = run_cli("convert", "--from", "megatron", str(nemo), "--out", str(out))
    if problem is not None:
        assert (result.returncode, result.stderr) == (1, f"{nemo}:4:3: {problem}\n")
        return
    assert result.returncode == 0, result.stderr
    training = meshconf.load_config(out).training
    assert training is not None and training.zero_stage == zero_stage


def _torchtitan(document: dict[str, object]) -> dict[str, object] | None:
    """The training block converted from a torchtitan job TOML as read."""
    table = {"data_parallel_shard_degree": 8}
    conversion = BY_NAME[TORCHTITAN].convert(
        table, world_size=8, document={"parallelism": table, **document}
    )
    training: dict[str, object] | None = conversion.data.get("training")
    return training


@pytest.mark.parametrize(
    ("checkpoint", "mode"),
    [
        ({"mode": "full"}, "full"),
        ({"mode": "none"}, "none"),
        ({"mode": "selective", "selective_ac_option": "op"}, "selective"),
        # torchtitan's layer-wise selective checkpointing: every N-th block recomputed
        ({"mode": "selective", "selective_ac_option": "3"}, ("full", 3)),
        ({"mode": "selective", "selective_ac_option": "1"}, "full"),
        # int("0") is 0, and torchtitan then wraps every block
        ({"mode": "selective", "selective_ac_option": "0"}, "full"),
        ({"mode": "memory_budget"}, None),
        (None, ("full", 2)),
    ],
)
def test_torchtitan_s_checkpointing_is_converted(
    checkpoint: dict[str, str] | None, mode: str | tuple[str, int] | None
) -> None:
    document = {} if checkpoint is None else {"activation_checkpoint": checkpoint}
    training = _torchtitan(document) or {}
    found = training.get("activation_checkpointing")
    if "checkpoint_every" in training:
        found = (found, training["checkpoint_every"])
    assert found == mode


def test_torchtitan_s_default_checkpointing_is_named_in_a_comment() -> None:
    table = {"data_parallel_shard_degree": 8}
    conversion = BY_NAME[TORCHTITAN].convert(table, world_size=8, document={"parallelism": table})
    assert conversion.comments["training.checkpoint_every"] == (
        'torchtitan\'s default selective_ac_option = "2"'
    )


@pytest.mark.parametrize(
    ("checkpoint", "problem"),
    [
        (
            {"mode": "some"},
            "[activation_checkpoint].mode: expected 'none', 'selective', 'full' or "
            "'memory_budget', got the string 'some'",
        ),
        (
            {"mode": "selective", "selective_ac_option": "every"},
            "[activation_checkpoint].selective_ac_option: expected 'op' or a number of blocks "
            "such as '2', got the string 'every'",
        ),
    ],
)
def test_bad_torchtitan_checkpointing_is_reported_in_its_table(
    checkpoint: dict[str, str], problem: str
) -> None:
    with pytest.raises(ConversionError) as raised:
        _torchtitan({"activation_checkpoint": checkpoint})
    (found,) = raised.value.problems
    assert found.render("job.toml") == f"job.toml: {problem}"


FLOAT8 = {"quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": True}}}}


@pytest.mark.parametrize(
    ("document", "dp_shard", "gathered"),
    [
        ({**FLOAT8, "model": {"converters": ["quantize.linear.float8"]}}, 8, True),
        # FSDP's fp8 all-gather needs data-parallel sharding; torchtitan turns it off
        ({**FLOAT8, "model": {"converters": ["quantize.linear.float8"]}}, 1, None),
        # without the converter, the linear layers are not float8 ones
        (FLOAT8, 8, None),
    ],
)
def test_torchtitan_s_fp8_all_gather_is_converted(
    document: dict[str, object], dp_shard: int, gathered: bool | None
) -> None:
    table = {"data_parallel_shard_degree": dp_shard, "tensor_parallel_degree": 8 // dp_shard}
    conversion = BY_NAME[TORCHTITAN].convert(
        table, world_size=8, document={"parallelism": table, **document}
    )
    assert (conversion.data.get("training") or {}).get("fp8_param_gather") == gathered


def test_a_bad_fp8_all_gather_switch_is_reported_in_its_table() -> None:
    with pytest.raises(ConversionError) as raised:
        _torchtitan({"quantize": {"linear": {"float8": {"enable_fsdp_float8_all_gather": 1}}}})
    (problem,) = raised.value.problems
    assert problem.render("job.toml") == (
        "job.toml: [quantize.linear.float8].enable_fsdp_float8_all_gather: expected true or "
        "false, got the integer 1"
    )


def test_a_torchtitan_job_toml_converts_its_training_tables(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job = tmp_path / "job.toml"
    job.write_text(
        '[model]\nconverters = ["quantize.linear.float8"]\n\n'
        "[parallelism]\ndata_parallel_shard_degree = 8\n\n"
        '[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "op"\n\n'
        "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n"
    )
    out = tmp_path / "converted.yaml"
    result = run_cli("convert", str(job), "--world-size", "8", "--out", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    training = meshconf.load_config(out).training
    assert training is not None
    assert training.estimate_settings() == {"checkpointing": "selective", "fp8_param_gather": True}
    comments = " ".join(line[2:] for line in out.read_text().splitlines() if line[:2] == "# ")
    assert (
        "Converted by meshconf convert from the [parallelism], [activation_checkpoint] and "
        f"[quantize.linear.float8] tables of {job} (torchtitan)."
    ) in comments


def toml_values(*words: str) -> st.SearchStrategy[object]:
    """Any value a TOML document holds, and ``words`` among its strings."""
    return st.recursive(
        st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=6)
        | st.sampled_from(words),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=4), children, max_size=3)
        ),
        max_leaves=6,
    )


#: The words the checkpointing tables use.
TOML_VALUES = toml_values("none", "full", "selective", "memory_budget", "op", "2", "0", "-1")


@given(
    checkpoint=st.dictionaries(
        st.sampled_from(["mode", "selective_ac_option", "early_stop"]), TOML_VALUES, max_size=3
    )
    | TOML_VALUES,
    float8=st.dictionaries(st.just("enable_fsdp_float8_all_gather"), TOML_VALUES, max_size=1)
    | TOML_VALUES,
    converters=TOML_VALUES,
)
@settings(max_examples=300, deadline=None)
def test_any_torchtitan_training_tables_convert_or_are_refused_at_their_key(
    checkpoint: object, float8: object, converters: object
) -> None:
    document = {
        "activation_checkpoint": checkpoint,
        "quantize": {"linear": {"float8": float8}},
        "model": {"converters": converters},
    }
    try:
        training = _torchtitan(document) or {}
    except ConversionError as error:
        assert {(problem.table, problem.key) for problem in error.problems} <= {
            ("activation_checkpoint", "mode"),
            ("activation_checkpoint", "selective_ac_option"),
            ("quantize.linear.float8", "enable_fsdp_float8_all_gather"),
        }
        return
    assert training.get("activation_checkpointing") in (None, "none", "selective", "full")
    every = training.get("checkpoint_every")
    assert every is None or (type(every) is int and 2 <= every <= 100_000)
    assert training.get("fp8_param_gather") in (None, True)


WORDS = st.sampled_from(["full", "selective", "uniform", "block", "1", "2", "0", "x", "-1", "1e3"])


MODULES = st.lists(st.sampled_from(["layernorm", "mla_up_proj", "moe_act", "core_attn", "moe"]))


@given(
    granularity=WORDS,
    method=st.none() | WORDS,
    layers=st.none() | WORDS,
    switch=st.booleans(),
    modules=st.none() | MODULES,
)
@settings(max_examples=200, deadline=None)
def test_any_megatron_recomputation_converts_or_is_refused_at_its_argument(
    granularity: str,
    method: str | None,
    layers: str | None,
    switch: bool,
    modules: list[str] | None,
) -> None:
    line = f"{ARGS}--recompute-granularity {granularity}"
    line += "" if method is None else f" --recompute-method {method}"
    line += "" if modules is None else " --recompute-modules " + " ".join(modules)
    line += "" if layers is None else f" --recompute-num-layers {layers}"
    line += " --recompute-activations" if switch else ""
    if switch:  # Megatron-LM's switch sets the granularity, over the one given
        granularity = "selective"
    try:
        conversion = BY_NAME[MEGATRON].convert(read_command_line(line), world_size=16)
    except ConversionError as error:
        assert {problem.key for problem in error.problems} <= {
            "--recompute-granularity",
            "--recompute-num-layers",
        }
        return
    training = conversion.data.get("training") or {}
    expected = {"selective": "none"}.get(granularity)
    if granularity == "selective" and set(modules or ()) == {"layernorm", "mla_up_proj", "moe_act"}:
        expected = "norms-latent-swiglu"
    first = None
    if (granularity, method, layers) == ("full", "uniform", "1"):
        expected = "full"
    if (granularity, method) == ("full", "block") and layers in ("1", "2"):
        expected, first = "full", int(layers)
    assert training.get("activation_checkpointing") == expected
    assert training.get("checkpoint_first") == first


OVERLAP_PREFIX = (
    "--args:1:1: --overlap-moe-expert-parallel-comm: Megatron-LM overlaps the experts' all-to-all "
)
WITHOUT_FULL = (
    "only without full recomputation (Megatron-Core's TransformerConfig asserts 'disable full "
    "recomputation when enabling overlap_moe_expert_parallel_comm'): leave out "
    "--recompute-granularity full or --overlap-moe-expert-parallel-comm"
)


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ("--expert-model-parallel-size 8", None),
        ("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
         "--expert-model-parallel-size 8", None),
        ("", "--args:1:1: --overlap-moe-expert-parallel-comm: Megatron-LM overlaps the experts' "
         "all-to-all only with expert parallelism (an expert-model-parallel size above 1)"),
        ("--pipeline-model-parallel-size 2 --expert-model-parallel-size 8",
         "--args:1:1: --overlap-moe-expert-parallel-comm: Megatron-LM overlaps the experts' "
         "all-to-all over pp 2 only under the interleaved schedule: give the model chunks per "
         "rank"),
        ("--expert-model-parallel-size 8 --recompute-granularity full --recompute-method "
         "uniform --recompute-num-layers 1", f"{OVERLAP_PREFIX}{WITHOUT_FULL}"),
        # full recomputation that is not converted is still refused, as Megatron-Core does
        ("--expert-model-parallel-size 8 --recompute-granularity full",
         f"{OVERLAP_PREFIX}{WITHOUT_FULL}"),
    ],
)  # fmt: skip
def test_megatron_s_expert_overlap_is_converted_where_megatron_core_runs_it(
    arguments: str, problem: str | None
) -> None:
    line = f"--overlap-moe-expert-parallel-comm {arguments}".strip()
    if problem is None:
        conversion = BY_NAME[MEGATRON].convert(read_command_line(line), world_size=16)
        assert conversion.data["training"]["ep_overlap"] is True
        return
    with pytest.raises(ConversionError) as raised:
        BY_NAME[MEGATRON].convert(read_command_line(line), world_size=16)
    assert [error.render("--args") for error in raised.value.problems] == [problem]


@pytest.mark.parametrize(
    ("line", "sequence_parallel"),
    [
        # Megatron-LM keeps the norms' and dropouts' activations whole on every tp rank
        (ARGS, "none"),
        (ARGS + "--sequence-parallel", "megatron"),
        # without tensor parallelism there is nothing to split
        ("--use-distributed-optimizer", None),
    ],
)
def test_tensor_parallelism_without_sequence_parallelism_is_estimated_so(
    line: str, sequence_parallel: str | None
) -> None:
    conversion = BY_NAME[MEGATRON].convert(read_command_line(line), world_size=16)
    assert conversion.data["training"].get("sequence_parallel") == sequence_parallel


def test_nemo_s_sequence_parallel_is_read_by_its_value() -> None:
    nemo = "model:\n  tensor_model_parallel_size: 2\n  sequence_parallel: {value}\n"
    converted = BY_NAME[MEGATRON].convert(read_nemo_yaml(nemo.format(value="true")), world_size=8)
    assert converted.data["training"]["sequence_parallel"] == "megatron"
    converted = BY_NAME[MEGATRON].convert(read_nemo_yaml(nemo.format(value="false")), world_size=8)
    assert converted.data["training"]["sequence_parallel"] == "none"
    with pytest.raises(ConversionError) as raised:
        BY_NAME[MEGATRON].convert(read_nemo_yaml(nemo.format(value="1")), world_size=8)
    assert [problem.render("nemo.yaml") for problem in raised.value.problems] == [
        "nemo.yaml:3:3: model.sequence_parallel: expected true or false, got the integer 1"
    ]


@pytest.mark.parametrize(
    ("arguments", "found"),
    [
        ("--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "bf16"),
        ("--exp-avg-dtype fp32 --exp-avg-sq-dtype fp32", "fp32"),
        # Megatron-LM's default for the other is fp32
        ("--exp-avg-dtype fp32", "fp32"),
        (
            "--exp-avg-dtype bf16",
            "--args:1:17: --exp-avg-dtype: the estimate keeps both moments in one dtype: give "
            "--exp-avg-sq-dtype bf16 as well",
        ),
        (
            "--exp-avg-dtype bf16 --exp-avg-sq-dtype fp16",
            "--args:1:41: --exp-avg-sq-dtype: the estimate keeps both of AdamW's moments in fp32 "
            "or both in bf16; got the string 'bf16' and the string 'fp16'",
        ),
    ],
)
def test_megatron_s_moment_dtypes_are_the_optimizer_dtype(arguments: str, found: str) -> None:
    words = read_command_line(arguments)
    if found in ("fp32", "bf16"):
        conversion = BY_NAME[MEGATRON].convert(words, world_size=8)
        assert conversion.data["training"]["optimizer_dtype"] == found
        return
    with pytest.raises(ConversionError) as raised:
        BY_NAME[MEGATRON].convert(words, world_size=8)
    assert [error.render("--args") for error in raised.value.problems] == [found]
