"""The ``training`` block of a config converted from Megatron-LM's settings: the ZeRO stage
of its distributed optimizer, fp8 parameter gathers, the pipeline split's weights, the
settings of :data:`~.megatron_input.TRAINING_SETTINGS`, the interleaved schedule's model
chunks per rank and micro-batch groups, and activation recomputation, where the estimate's
modes say the same as Megatron's.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshconf.core.errors import describe_value
from meshconf.core.schedules import megatron_schedule
from meshconf.features.convert.arguments import Setting, integer_setting, option
from meshconf.features.convert.draft import Draft, boolean_problem
from meshconf.features.convert.megatron_input import (
    EP_OVERLAP_SWITCH,
    GROUP_SETTINGS,
    LAYERS_PER_VIRTUAL_STAGE,
    MOMENT_DTYPE_SETTINGS,
    NORMS_LATENT_SWIGLU_MODULES,
    NUM_LAYERS,
    RECOMPUTE_MODULES,
    RECOMPUTE_SWITCH,
    SEQUENCE_PARALLEL_SWITCH,
    SPLIT_WEIGHT_SETTINGS,
    TRAINING_SETTINGS,
    VIRTUAL_STAGE_SETTINGS,
)


def training_block(draft: Draft, settings: Mapping[str, Setting], sizes: Mapping[str, int]) -> None:
    """The config's ``training`` block from Megatron's settings, with the mesh ``sizes`` by
    Megatron's names."""
    optimizer = settings.get("use_distributed_optimizer")
    draft.training["zero_stage"] = 0 if _switched_on(draft, optimizer) is None else 1
    if optimizer is not None:
        draft.origins[("training", "zero_stage")] = optimizer.key
    instances = settings.get("num_distributed_optimizer_instances")
    if draft.training["zero_stage"] == 0 and sizes["num_distributed_optimizer_instances"] > 1:
        assert instances is not None, "more than one instance is given"
        draft.fail(instances.key, partial_distopt_problem("give --use-distributed-optimizer"))
    fp8 = settings.get("fp8_param_gather")
    if fp8 is not None:
        # validated with the config, and a problem reported at Megatron's key
        draft.train("fp8_param_gather", fp8.value, fp8.key)
    for name, key in SPLIT_WEIGHT_SETTINGS.items():
        switch = _switched_on(draft, settings.get(name))
        if switch is not None:
            draft.train(key, 1, switch.key)
    for setting, value in _integers(draft, settings, tuple(TRAINING_SETTINGS)):
        key = TRAINING_SETTINGS[setting.name]
        draft.train(key, value, setting.key)
    _interleaving(draft, settings, sizes["pipeline_model_parallel_size"])
    granularity = _granularity(draft, settings)
    if granularity is not None and granularity.value is not None:
        _recomputation(draft, settings, granularity)
    _sequence_parallelism(draft, settings.get(SEQUENCE_PARALLEL_SWITCH), sizes)
    _moments(draft, settings)
    full = granularity is not None and granularity.value == "full"
    _expert_overlap(draft, settings, sizes, full=full)


def partial_distopt_problem(fix: str) -> str:
    """Why distributed-optimizer instances (dp_replicate above 1) need the distributed
    optimizer; ``fix`` turns it on, as the caller's input spells it."""
    return (
        "more than one distributed-optimizer instance needs the distributed optimizer: "
        "Megatron-Core asserts 'Partial DistOpt cannot be used without DistOpt' "
        "(DistributedDataParallel, megatron/core/distributed/distributed_data_parallel.py); "
        f"{fix}, or run one instance (dp_replicate 1, its ranks to dp_shard)"
    )


def _sequence_parallelism(draft: Draft, switch: Setting | None, sizes: Mapping[str, int]) -> None:
    """``training.sequence_parallel`` where tensor parallelism runs: ``megatron`` with
    ``--sequence-parallel`` (the norms' outputs kept split and gathered again in the backward
    pass), ``none`` without it (Megatron-LM then keeps the norms' and dropouts' activations
    whole on every tensor-parallel rank)."""
    if sizes["tensor_model_parallel_size"] == 1:
        return
    on = _switched_on(draft, switch)
    draft.training["sequence_parallel"] = "none" if on is None else "megatron"
    if switch is not None:
        draft.origins[("training", "sequence_parallel")] = switch.key


def _moments(draft: Draft, settings: Mapping[str, Setting]) -> None:
    """``training.optimizer_dtype`` from ``--exp-avg-dtype`` and ``--exp-avg-sq-dtype``:
    both fp32 or both bf16, the dtypes the estimate counts."""
    given = [settings[name] for name in MOMENT_DTYPE_SETTINGS if name in settings]
    if not given:
        return
    values = {setting.value for setting in given}
    if len(given) < len(MOMENT_DTYPE_SETTINGS) and values != {"fp32"}:
        missing = next(name for name in MOMENT_DTYPE_SETTINGS if name not in settings)
        draft.fail(
            given[0].key,
            f"the estimate keeps both moments in one dtype: give {option(missing)} "
            f"{given[0].value} as well",
        )
        return
    if len(values) > 1 or not values <= {"fp32", "bf16"}:
        draft.fail(
            given[-1].key,
            "the estimate keeps both of AdamW's moments in fp32 or both in bf16; got "
            + " and ".join(describe_value(setting.value) for setting in given),
        )
        return
    (value,) = values
    draft.train("optimizer_dtype", value, given[0].key)


def _expert_overlap(
    draft: Draft, settings: Mapping[str, Setting], sizes: Mapping[str, int], *, full: bool
) -> None:
    """``training.ep_overlap`` from ``--overlap-moe-expert-parallel-comm``, refused where
    Megatron-Core's config refuses it (``TransformerConfig.__post_init__``,
    megatron/core/transformer/transformer_config.py): without expert parallelism, over a
    pipeline without model chunks, with ``--recompute-granularity full`` (``full``, converted
    or not: "disable full recomputation when enabling overlap_moe_expert_parallel_comm"), or
    with a recomputation method or a number of layers to recompute given."""
    overlap = _switched_on(draft, settings.get(EP_OVERLAP_SWITCH))
    if overlap is None:
        return
    pp, ep = sizes["pipeline_model_parallel_size"], sizes["expert_model_parallel_size"]
    # given, even if wrongly (reported as such), as Megatron-Core's check reads them
    chunked = _given(settings, (*VIRTUAL_STAGE_SETTINGS, LAYERS_PER_VIRTUAL_STAGE))
    recomputing = _given(settings, ("recompute_method", "recompute_num_layers"))
    why = None
    if ep == 1:
        why = "only with expert parallelism (an expert-model-parallel size above 1)"
    elif pp > 1 and not chunked:
        why = f"over pp {pp} only under the interleaved schedule: give the model chunks per rank"
    elif full or draft.training.get("activation_checkpointing") == "full":
        why = (
            "only without full recomputation (Megatron-Core's TransformerConfig asserts "
            "'disable full recomputation when enabling overlap_moe_expert_parallel_comm'): "
            "leave out --recompute-granularity full or --overlap-moe-expert-parallel-comm"
        )
    elif recomputing:
        given = " and ".join(setting.key for setting in recomputing)
        why = f"only with no recomputation method and layer count: leave out {given}"
    if why is not None:
        draft.fail(overlap.key, f"Megatron-LM overlaps the experts' all-to-all {why}")
        return
    draft.train("ep_overlap", True, overlap.key)


def _interleaving(draft: Draft, settings: Mapping[str, Setting], pp: int) -> None:
    """``training.virtual_stages``, and the interleaved schedule, from whichever settings give
    the model chunks per rank (:data:`VIRTUAL_STAGE_SETTINGS`, or the layers of a chunk),
    and ``training.microbatch_group`` from :data:`GROUP_SETTINGS`, which only the
    interleaved schedule reads."""
    given = _integers(draft, settings, VIRTUAL_STAGE_SETTINGS)
    per_chunk = settings.get(LAYERS_PER_VIRTUAL_STAGE)
    if per_chunk is not None and per_chunk.value is not None:
        chunks = _chunks_from_layers(draft, settings, per_chunk, pp)
        if chunks is not None:
            given.append((per_chunk, chunks))
    chunks_setting = _agreed(draft, given, "model chunks per pipeline rank")
    group_setting = _agreed(
        draft, _integers(draft, settings, GROUP_SETTINGS), "micro-batches per model chunk"
    )
    if chunks_setting is not None:
        setting, chunks = chunks_setting
        draft.train("virtual_stages", chunks, setting.key)
        draft.training["pp_schedule"] = megatron_schedule(interleaved=True).name
    if group_setting is None:
        return
    setting, group = group_setting
    if chunks_setting is not None and group < pp:
        draft.fail(
            setting.key,
            f"{group} micro-batches per model chunk are fewer than pp ({pp}): Megatron-Core's "
            "interleaved schedule raises ValueError 'The number of contiguous micro-batches in "
            "a virtual pipeline stage should range in [PP, M]' "
            "(forward_backward_pipelining_with_interleaving, "
            f"megatron/core/pipeline_parallel/schedules.py); give at least {pp}",
        )
        return
    if chunks_setting is None:
        draft.notes.append(
            f"{setting.key} is left out: only the interleaved schedule groups micro-batches, "
            "and the arguments give no model chunks per pipeline rank."
        )
        return
    draft.train("microbatch_group", group, setting.key)


def _switched_on(draft: Draft, switch: Setting | None) -> Setting | None:
    """The switch, when it is given and true; None when it is not given or false, or its
    value is not true or false (reported at its key)."""
    if switch is None:
        return None
    problem = boolean_problem(switch.value)
    if problem is not None:
        draft.fail(switch.key, problem)
    return switch if switch.value is True else None


def _given(settings: Mapping[str, Setting], names: tuple[str, ...]) -> list[Setting]:
    """Each of ``names`` given a value: NeMo writes null for a setting it leaves to
    Megatron's default."""
    return [
        settings[name] for name in names if name in settings and settings[name].value is not None
    ]


def _integers(
    draft: Draft, settings: Mapping[str, Setting], names: tuple[str, ...]
) -> list[tuple[Setting, int]]:
    """Each of ``names`` given, with its integer; problems reported."""
    found = []
    for setting in _given(settings, names):
        value = integer_setting(draft, setting)
        if value is not None:
            found.append((setting, value))
    return found


def _agreed(
    draft: Draft, given: list[tuple[Setting, int]], what: str
) -> tuple[Setting, int] | None:
    """The first of the settings that give the same number, or None when none is given or
    they disagree (reported at the first that differs)."""
    if not given:
        return None
    (first, value), *others = given
    for setting, other in others:
        if other != value:
            draft.fail(
                setting.key,
                f"gives {other} {what}, but {first.key} gives {value}: which one is meant?",
            )
            return None
    return first, value


def _chunks_from_layers(
    draft: Draft, settings: Mapping[str, Setting], per_chunk: Setting, pp: int
) -> int | None:
    """The model chunks per rank as Megatron-LM's arguments derive them from
    ``--num-layers-per-virtual-pipeline-stage``: a pipeline stage's share of the layers (the
    embedding and the loss counted as layers where the split accounts for them) over the
    layers of a chunk, each dividing exactly; None with the problem reported."""
    layers_per_chunk = integer_setting(draft, per_chunk)
    if layers_per_chunk is None:
        return None
    ends = _given(
        settings, ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
    )
    if ends:
        draft.fail(
            per_chunk.key,
            f"beside {ends[0].key}, Megatron-LM takes the model chunks per pipeline rank from "
            "--num-virtual-stages-per-pipeline-rank, not from the layers of a chunk",
        )
        return None
    model_layers = settings.get(NUM_LAYERS)
    if model_layers is None or model_layers.value is None:
        draft.fail(
            per_chunk.key,
            "needs the model's number of layers (--num-layers): Megatron-LM derives the model "
            "chunks per pipeline rank from it",
        )
        return None
    layers = integer_setting(draft, model_layers)
    if layers is None:
        return None
    layers += sum(
        1 for name in SPLIT_WEIGHT_SETTINGS if name in settings and settings[name].value is True
    )
    if layers % pp:
        draft.fail(per_chunk.key, f"{layers} layers do not split evenly over {pp} pipeline stages")
        return None
    if (layers // pp) % layers_per_chunk:
        draft.fail(
            per_chunk.key,
            f"a pipeline stage's {layers // pp} layers are not a multiple of the "
            f"{layers_per_chunk} layers of a model chunk",
        )
        return None
    return layers // pp // layers_per_chunk


def _granularity(draft: Draft, settings: Mapping[str, Setting]) -> Setting | None:
    """The recomputation granularity Megatron-LM runs: ``--recompute-activations`` sets it to
    ``selective``, over any ``--recompute-granularity``."""
    granularity = settings.get("recompute_granularity")
    switch = _switched_on(draft, settings.get(RECOMPUTE_SWITCH))
    if switch is None:
        return granularity
    if granularity is not None and granularity.value not in (None, "selective"):
        draft.notes.append(
            f"{switch.key} sets Megatron-LM's recomputation to selective, over "
            f"{granularity.key} {granularity.value}."
        )
    return Setting("recompute_granularity", switch.key, "selective", switch.position)


def _recomputation(draft: Draft, settings: Mapping[str, Setting], granularity: Setting) -> None:
    """``training.activation_checkpointing`` from Megatron's recomputation, where the
    estimate's modes say the same: each block recomputed whole, the first blocks of each
    chunk (``block``, with ``checkpoint_first``), Megatron's selective recomputation of the
    norms, latent attention's up-projections and the experts' SwiGLU
    (:data:`NORMS_LATENT_SWIGLU_MODULES`), which is ``norms-latent-swiglu``, or its selective
    recomputation of other modules, which keeps what no recomputation keeps under flash
    attention."""
    modules = settings.get(RECOMPUTE_MODULES)
    if (
        granularity.value == "selective"
        and modules is not None
        and isinstance(modules.value, (list, tuple))
        and set(modules.value) == set(NORMS_LATENT_SWIGLU_MODULES)
    ):
        draft.train("activation_checkpointing", "norms-latent-swiglu", modules.key)
        return
    if granularity.value == "selective":
        draft.train("activation_checkpointing", "none", granularity.key)
        draft.notes.append(
            "Megatron-LM's selective recomputation recomputes the core attention, which the flash "
            "attention kernel does not keep anyway: training.activation_checkpointing: none "
            "(meshconf's selective is torchtitan's per-op policy)."
        )
        return
    if granularity.value != "full":
        draft.fail(
            granularity.key, f"expected full or selective, got {describe_value(granularity.value)}"
        )
        return
    method = settings.get("recompute_method")
    layers = settings.get("recompute_num_layers")
    count = None if layers is None or layers.value is None else integer_setting(draft, layers)
    if method is not None and method.value in ("uniform", "block") and layers is not None and count:
        draft.train("activation_checkpointing", "full", granularity.key)
        # uniform: groups of N blocks, each recomputed whole from its input (1 by default);
        # block: the first N blocks of each model chunk, validated with the config
        if method.value == "block" or count > 1:
            key = "checkpoint_first" if method.value == "block" else "checkpoint_group"
            draft.train(key, count, layers.key)
        return
    how = "" if method is None else f" --recompute-method {method.value}"
    how += "" if layers is None else f" --recompute-num-layers {layers.value}"
    draft.notes.append(
        f"--recompute-granularity full{how} is not converted: Megatron-LM's full "
        "recomputation takes --recompute-method uniform or block with --recompute-num-layers "
        "N (at least 1); give --activation-checkpointing to plan and show."
    )
