"""``meshconf convert --to megatron`` and ``meshconf.compat.megatron``: a config as Megatron's
arguments, which convert back to the same config, and Megatron-Core's own
``initialize_model_parallel`` building the config's groups (torch's fake process group
simulates each world in a forked child; one layout runs on 8 real gloo processes)."""

from __future__ import annotations

import itertools
import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from distributed import in_child, run_ranks

from meshconf import ConfigError, load_config
from meshconf.compat.megatron import initialize_model_parallel, parallel_state_arguments
from meshconf.core.degrees import WORLD_FACTORS
from meshconf.features.convert import convert_megatron
from meshconf.features.convert.megatron_export import megatron_arguments
from meshconf.features.convert.megatron_input import read_command_line
from meshconf.runtime import DistributedContext


@pytest.fixture(scope="module")
def megatron_loaded() -> Any:
    """Megatron-Core's parallel_state, imported once by the worker that runs these tests (not
    by every worker that collects them), before the children that run it are forked; without
    Transformer Engine and Apex (CUDA libraries) Megatron-Core warns that it falls back to
    torch's code."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state

    return parallel_state


ORDERS = [
    None,
    ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
    ["dp_replicate", "dp_shard", "pp", "cp", "tp"],
    ["pp", "cp", "dp_replicate", "dp_shard", "tp"],
]


def _generated(count: int, seed: int) -> list[dict[str, Any]]:
    """Configs of pp, dp_replicate, dp_shard, cp, tp in 1, 2, 4, ep dividing dp_shard * cp *
    tp, etp 1 or tp, and an order, that meshconf accepts."""
    chooser = random.Random(seed)
    configs: list[dict[str, Any]] = []
    while len(configs) < count:
        degrees = {name: chooser.choice((1, 2, 4)) for name in WORLD_FACTORS}
        borrowed = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
        degrees["etp"] = chooser.choice((1, degrees["tp"]))
        eps = [ep for ep in (1, 2, 4, 8) if borrowed % (ep * degrees["etp"]) == 0]
        degrees["ep"] = chooser.choice(eps)
        data: dict[str, Any] = {"degrees": degrees}
        order = chooser.choice(ORDERS)
        if order is not None:
            data["order"] = order
        try:
            load_config(data)
        except ConfigError:
            continue
        configs.append(data)
    return configs


def _same(config: Any, back: Any) -> None:
    ours, theirs = config.resolved_degrees, back.resolved_degrees
    if ours["ep"] == 1:  # no experts: Megatron's expert tp is its default, tp
        ours, theirs = {**ours, "etp": 1}, {**theirs, "etp": 1}
    assert theirs == ours
    world = config.layout_over("world", WORLD_FACTORS)
    assert back.layout_over("world", WORLD_FACTORS) == world
    for domain, layout in back.layouts.items():
        if domain != "sparse" or ours["ep"] > 1:
            assert config.layout_over(domain, layout.dim_names) == layout, domain


@pytest.mark.parametrize("data", _generated(60, seed=39), ids=str)
def test_the_arguments_convert_back_to_the_same_config(data: dict[str, Any]) -> None:
    config = load_config(data)
    try:
        arguments = megatron_arguments(config)
    except ConfigError as error:
        # Only orders the command line cannot spell, or Megatron's own refusals.
        assert {d.path[0] for d in error.diagnostics} <= {"order", "degrees"}, str(error)
        return
    text = arguments.command_line()
    back = load_config(
        convert_megatron(read_command_line(text), world_size=config.resolved_world_size).data
    )
    _same(config, back)


def test_the_command_prints_arguments_that_read_back(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("convert", "--to", "megatron", "examples/llama3_70b_64gpu_hsdp_tp.yaml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == (
        "# Megatron-LM's arguments for examples/llama3_70b_64gpu_hsdp_tp.yaml, on 64 ranks; "
        "meshconf convert --from megatron reads them back.\n"
        "--tensor-model-parallel-size 8 \\\n"
        "--pipeline-model-parallel-size 1 \\\n"
        "--context-parallel-size 1 \\\n"
        "--expert-model-parallel-size 1 \\\n"
        "--expert-tensor-parallel-size 1 \\\n"
        "--num-distributed-optimizer-instances 2 \\\n"
        "--use-distributed-optimizer\n"
    )
    back = run_cli("convert", "--from", "megatron", "--args", result.stdout, "--world-size", "64")
    assert back.returncode == 0, back.stdout
    out = tmp_path / "back.yaml"
    out.write_text(back.stdout, encoding="utf-8")
    _same(load_config("examples/llama3_70b_64gpu_hsdp_tp.yaml"), load_config(out))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {
                "degrees": {"dp_replicate": 2, "dp_shard": 2, "tp": 2},
                "order": ["dp_replicate", "tp", "dp_shard", "pp", "cp"],
            },
            "order: Megatron numbers its distributed-optimizer instances (dp_replicate) just "
            "outside the ranks each one shards over (dp_shard); put dp_replicate right before "
            "dp_shard in order",
        ),
        (
            {
                "degrees": {"dp_shard": 2, "tp": 2, "cp": 2},
                "order": ["pp", "dp_replicate", "cp", "dp_shard", "tp"],
            },
            "order: Megatron numbers the ranks otherwise than order does, so its groups would "
            "hold other ranks; leave it out, or give an order Megatron has (tp-cp-ep-dp-pp "
            "inner to outer, or tp-cp-ep-pp-dp)",
        ),
        (
            {"degrees": {"dp_shard": 8}, "training": {"zero_stage": 3}},
            "training.zero_stage: 3 has no Megatron-LM argument meshconf writes; leave it out of "
            "the config for Megatron, or set it in Megatron's own arguments",
        ),
    ],
)
def test_what_megatron_cannot_express_is_refused_at_its_key(
    data: dict[str, Any], expected: str
) -> None:
    data = {"world_size": 8, **data}
    with pytest.raises(ConfigError) as raised:
        megatron_arguments(load_config(data))
    assert str(raised.value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "world_size: 16\norder: [tp, cp, dp_shard, dp_replicate, pp]\ndegrees:\n  tp: 2\n"
            "  pp: 2\n",
            "c.yaml:2:1: order: Megatron numbers the ranks otherwise than order does, so its "
            "groups would hold other ranks; leave it out, or give an order Megatron has "
            "(tp-cp-ep-dp-pp inner to outer, or tp-cp-ep-pp-dp)",
        ),
        (
            "world_size: 16\ndegrees:\n  tp: 2\n  pp: 2\ntraining:\n  first_stage_layers: 0\n",
            "c.yaml:6:3: training.first_stage_layers: expected an integer >= 1, got 0",
        ),
        (
            "world_size: 16\ndegrees:\n  tp: 2\ntraining:\n  ep_overlap: true\n",
            "c.yaml:5:3: training.ep_overlap: Megatron-LM overlaps the experts' all-to-all only "
            "with expert parallelism (an expert-model-parallel size above 1)",
        ),
    ],
)
def test_the_refusals_of_to_megatron_are_located_at_their_key(  # type: ignore[no-untyped-def]
    run_cli, tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "c.yaml").write_text(text)
    result = run_cli("convert", "--to", "megatron", "c.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert (result.stdout + result.stderr).splitlines() == [expected]


def test_megatron_core_takes_an_order_the_command_line_cannot_spell() -> None:
    config = load_config(
        {
            "world_size": 8,
            "degrees": {"dp_shard": 2, "tp": 2, "cp": 2},
            "order": ["pp", "dp_replicate", "cp", "dp_shard", "tp"],
        }
    )
    assert parallel_state_arguments(config) == {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 1,
        "virtual_pipeline_model_parallel_size": None,
        "context_parallel_size": 2,
        "expert_model_parallel_size": 1,
        "expert_tensor_parallel_size": 1,
        "num_distributed_optimizer_instances": 1,
        "order": "tp-dp-cp-ep-pp",
    }


# Megatron-Core's own parallel_state -------------------------------------------------------


def _megatron_groups_are_meshconf_s(data: dict[str, Any], ranks: list[int]) -> None:
    from megatron.core import parallel_state as ps

    config = load_config(data)
    world = config.resolved_world_size
    assert world is not None
    pairs = [
        (ps.get_tensor_model_parallel_group, ("dense", "tp")),
        (ps.get_pipeline_model_parallel_group, ("loss", "pp")),
        (ps.get_context_parallel_group, ("dataloading", "cp")),
        (ps.get_data_parallel_group, ("dataloading", "batch")),
        (ps.get_expert_model_parallel_group, ("sparse", "ep")),
        (ps.get_expert_tensor_parallel_group, ("sparse", "etp")),
    ]
    for rank in ranks:
        context = DistributedContext.simulate(config, rank=rank, world_size=world)
        try:
            initialize_model_parallel(config, create_gloo_process_groups=False)
            for getter, (domain, dim) in pairs:
                theirs = dist.get_process_group_ranks(getter())
                mine = context.config.layout(domain).group(rank, dim).ranks()
                assert theirs == mine, (data, rank, getter.__name__)
        finally:
            ps.destroy_model_parallel()
            context.close()


@pytest.mark.timeout(300)
def test_megatron_core_builds_the_config_s_groups(megatron_loaded: Any) -> None:
    """Fake process group: generated layouts on up to 64 ranks, three ranks each; Megatron's
    tp, pp, cp, data-parallel, expert and expert-tp groups against meshconf's."""
    checked = 0
    for data in _generated(40, seed=7):
        config = load_config(data)
        try:
            parallel_state_arguments(config)
        except ConfigError:
            continue
        world = config.resolved_world_size
        assert world is not None
        in_child(_megatron_groups_are_meshconf_s, data, sorted({0, world // 2, world - 1}))
        checked += 1
    assert checked >= 30


def _on_gloo(rank: int, environ: dict[str, str]) -> None:
    from megatron.core import parallel_state as ps

    data = {"world_size": 8, "degrees": {"pp": 2, "dp_shard": 2, "tp": 2, "ep": 2}}
    with DistributedContext(load_config(data), environ=environ) as context:
        initialize_model_parallel(context.config, create_gloo_process_groups=False)
        try:
            for getter, dim in (
                (ps.get_tensor_model_parallel_group, "tp"),
                (ps.get_expert_model_parallel_group, "ep"),
                (ps.get_data_parallel_group, "batch"),
            ):
                assert dist.get_process_group_ranks(getter()) == dist.get_process_group_ranks(
                    context.get_mesh(dim).get_group()
                ), dim
        finally:
            ps.destroy_model_parallel()


def test_megatron_core_builds_the_groups_on_8_gloo_processes(megatron_loaded: Any) -> None:
    run_ranks(_on_gloo, 8)


def test_every_example_converts_but_the_one_megatron_cannot_number() -> None:
    """inside_node there splits cp across nodes, which no Megatron order does."""
    refused = []
    for path in sorted(Path("examples").glob("*.yaml")):
        config = load_config(path)
        if config.resolved_world_size is None:
            continue
        try:
            megatron_arguments(config)
        except ConfigError as error:
            refused.append((path.name, str(error).split(":")[0]))
    assert refused == [("hierarchical_long_context.yaml", "inside_node")]


def test_the_estimate_s_megatron_settings_are_written_and_read_back() -> None:
    """Sequence parallelism as Megatron runs it, bf16 moments and recomputation in groups
    are Megatron-LM arguments, and its own reader gives the same training block back."""
    training = {
        "zero_stage": 1,
        "sequence_parallel": "megatron",
        "optimizer_dtype": "bf16",
        "activation_checkpointing": "full",
        "checkpoint_group": 2,
    }
    config = load_config({"world_size": 16, "degrees": {"tp": 2, "pp": 2}, "training": training})
    arguments = megatron_arguments(config)
    written = arguments.arguments
    assert {
        ("--use-distributed-optimizer", None),
        ("--sequence-parallel", None),
        ("--use-precision-aware-optimizer", None),
        ("--exp-avg-dtype", "bf16"),
        ("--exp-avg-sq-dtype", "bf16"),
    } <= set(written)
    start = written.index(("--recompute-granularity", "full"))
    assert written[start + 1 : start + 3] == (
        ("--recompute-method", "uniform"),
        ("--recompute-num-layers", "2"),
    )
    back = convert_megatron(read_command_line(arguments.command_line()), world_size=16)
    assert back.data["training"] == training


def test_deepseek_v3_s_recomputation_is_written_as_megatron_core_s_modules_and_read_back() -> None:
    """``norms-latent-swiglu`` is Megatron-LM's selective recomputation of the norms, latent
    attention's up-projections and the experts' SwiGLU, one argument a module."""
    training = {"zero_stage": 1, "activation_checkpointing": "norms-latent-swiglu"}
    config = load_config({"world_size": 16, "degrees": {"pp": 2}, "training": training})
    arguments = megatron_arguments(config)
    start = arguments.arguments.index(("--recompute-granularity", "selective"))
    assert arguments.arguments[start + 1] == (
        "--recompute-modules",
        "layernorm mla_up_proj moe_act",
    )
    assert arguments.command_line().endswith(
        "--recompute-granularity selective \\\n--recompute-modules layernorm mla_up_proj moe_act\n"
    )
    back = convert_megatron(read_command_line(arguments.command_line()), world_size=16)
    assert back.data["training"] == training


#: Keys of a config that --to megatron refuses, each with a value it refuses.
_REFUSED_KEYS = [
    ("training", "first_stage_layers: 0", {"pp": 2}),
    ("training", "ep_overlap: true", {}),
    ("training", "zero_stage: 3", {}),
    ("", "order: [tp, cp, dp_shard, dp_replicate, pp]", {"pp": 2}),
]


def test_generated_refusals_of_to_megatron_are_located(run_cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each refused key, after a random number of comment lines and other keys: reported at
    its own line and column."""
    rng = random.Random(47)
    for index in range(12):
        block, line, degrees = rng.choice(_REFUSED_KEYS)
        padding = "# a comment\n" * rng.randrange(4)
        sizes = "".join(f"  {name}: {size}\n" for name, size in {"tp": 2, **degrees}.items())
        head = f"{padding}world_size: 16\ndegrees:\n{sizes}"
        text = head + (f"training:\n  {line}\n" if block else f"{line}\n")
        expected_line = head.count("\n") + (2 if block else 1)
        column = 3 if block else 1
        folder = tmp_path / str(index)
        folder.mkdir()
        (folder / "c.yaml").write_text(text)
        result = run_cli("convert", "--to", "megatron", "c.yaml", cwd=folder)
        key = line.split(":")[0]
        shown = f"{block}.{key}" if block else key
        assert result.returncode == 1, text
        assert (result.stdout + result.stderr).startswith(
            f"c.yaml:{expected_line}:{column}: {shown}: "
        ), (text, result.stdout + result.stderr)


#: Megatron-LM's arguments that --to megatron writes, as Megatron-Core's TransformerConfig
#: (a ModelParallelConfig) names them.
_CORE_FIELDS = {
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--context-parallel-size": "context_parallel_size",
    "--expert-model-parallel-size": "expert_model_parallel_size",
    "--expert-tensor-parallel-size": "expert_tensor_parallel_size",
    "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
    "--microbatch-group-size-per-virtual-pipeline-stage": "microbatch_group_size_per_vp_stage",
    "--recompute-granularity": "recompute_granularity",
    "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers",
    "--overlap-moe-expert-parallel-comm": "overlap_moe_expert_parallel_comm",
}


def _training_layouts() -> Iterator[dict[str, Any]]:
    """Layouts on 16 ranks with the training keys Megatron-Core checks when it starts."""
    for pp, replicate, ep, zero, chunks, group, overlap, full in itertools.product(
        (1, 2), (1, 2), (1, 2), (None, 0, 1), (None, 2), (None, 1, 2, 4), (False, True),
        (False, True),
    ):  # fmt: skip
        training: dict[str, Any] = {}
        if zero is not None:
            training["zero_stage"] = zero
        if chunks is not None:
            training |= {"pp_schedule": "interleaved", "virtual_stages": chunks}
        if group is not None:
            training["microbatch_group"] = group
        if overlap:
            training["ep_overlap"] = True
        if full:
            training |= {"activation_checkpointing": "full", "checkpoint_group": 2}
        degrees = {"pp": pp, "dp_replicate": replicate, "tp": 2, "ep": ep}
        yield {"world_size": 16, "degrees": degrees, "training": training}


@pytest.mark.timeout(300)
def test_what_to_megatron_writes_megatron_core_runs(megatron_loaded: Any) -> None:
    """Every layout --to megatron writes passes Megatron-Core's own checks on CPU: its
    TransformerConfig's post-init, DistributedDataParallel's assert that distributed-optimizer
    instances need the distributed optimizer, and the interleaved schedule's bound on the
    micro-batches per model chunk; the layouts it refuses include every one that would not."""
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    written = refused = 0
    for data in _training_layouts():
        try:
            arguments = dict(megatron_arguments(load_config(data)).arguments)
        except ConfigError:
            refused += 1
            continue
        written += 1
        fields: dict[str, Any] = {
            _CORE_FIELDS[flag]: True if value is None else value
            for flag, value in arguments.items()
            if flag in _CORE_FIELDS
        }
        fields = {
            name: int(value) if isinstance(value, str) and value.isdigit() else value
            for name, value in fields.items()
        }
        config = TransformerConfig(
            num_layers=16,
            hidden_size=64,
            num_attention_heads=4,
            num_moe_experts=4 if fields["expert_model_parallel_size"] > 1 else None,
            moe_token_dispatcher_type="alltoall",
            bf16=True,
            params_dtype=torch.bfloat16,
            pipeline_dtype=torch.bfloat16,
            sequence_parallel=True,
            **fields,
        )
        # DistributedDataParallel: 'Partial DistOpt cannot be used without DistOpt'
        instances = int(arguments.get("--num-distributed-optimizer-instances", "1"))
        assert instances == 1 or "--use-distributed-optimizer" in arguments, data
        # forward_backward_pipelining_with_interleaving: the group is at least pp
        if config.virtual_pipeline_model_parallel_size is not None:
            assert (
                config.microbatch_group_size_per_vp_stage >= config.pipeline_model_parallel_size
            ), data
    assert written >= 50 and refused >= 50, (written, refused)
