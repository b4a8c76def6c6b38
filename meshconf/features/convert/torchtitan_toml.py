"""torchtitan's ``[parallelism]`` table (torchtitan 0.2.1's ``Parallelism``) as meshconf
degrees, its degrees being meshconf's one for one, and as the ``training`` block its FSDP
resharding policy, its pipeline schedule and split, its activation checkpointing
(``[activation_checkpoint]``) and its fp8 all-gather (``[quantize.linear.float8]``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshconf.core.errors import describe_value
from meshconf.core.messages import spoken_list
from meshconf.core.schedules import SCHEDULES, PipelineSchedule
from meshconf.core.settings import TRAINING_BOUNDS
from meshconf.features.convert.draft import Draft, boolean_problem, integers, unknown_keys
from meshconf.trainers.torchtitan_fields import TORCHTITAN_DEGREES

#: Every field of torchtitan 0.2.1's ``Parallelism`` dataclass, in its order.
TORCHTITAN_FIELDS = (
    "data_parallel_replicate_degree",
    "data_parallel_shard_degree",
    "fsdp_reshard_after_forward",
    "tensor_parallel_degree",
    "disable_loss_parallel",
    "enable_async_tensor_parallel",
    "pipeline_parallel_degree",
    "module_fqns_per_model_part",
    "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers",
    "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_schedule",
    "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatch_size",
    "pipeline_parallel_expert_parallel_overlap",
    "context_parallel_degree",
    "context_parallel_rotate_method",
    "expert_parallel_degree",
    "expert_tensor_parallel_degree",
    "expert_parallel_comm_backend",
)


def from_torchtitan(draft: Draft, table: Mapping[str, Any]) -> None:
    unknown_keys(draft, table, TORCHTITAN_FIELDS, "a field of torchtitan 0.2.1's Parallelism")
    draft.degrees = integers(draft, table, TORCHTITAN_DEGREES)
    draft.check()
    draft.origins = {("degrees", name): key for key, name in TORCHTITAN_DEGREES.items()}
    ep, etp = draft.degrees.get("ep", 1), draft.degrees.get("etp", 1)
    if ep == 1 and etp != 1:
        draft.degrees["etp"] = 1
        draft.comments["degrees.etp"] = f"was {etp}: torchtitan ignores it while ep is 1"
        draft.notes.append(
            f"expert_tensor_parallel_degree = {etp} is written as etp: 1. torchtitan ignores it "
            "while expert_parallel_degree is 1, but meshconf checks etp even without experts: "
            "it must be 1 or tp."
        )
    resharding = "fsdp_reshard_after_forward"
    if resharding in table:
        # validated with the config, and a problem reported at torchtitan's key
        draft.train("reshard_after_forward", table[resharding], resharding)
    schedule = _pipeline(draft, table)
    overlap = table.get("pipeline_parallel_expert_parallel_overlap", True)
    degrees = draft.degrees
    if (
        schedule is not None
        and schedule.order == "overlapped"
        and overlap is True
        and degrees.get("pp", 1) > 1
        and degrees.get("ep", 1) > 1
    ):
        # torchtitan overlaps expert and pipeline traffic only under the schedule that
        # overlaps a forward and a backward pass (DualPipeV), and by default
        draft.training["ep_overlap"] = True
        draft.notes.append(
            f'pipeline_parallel_schedule = "{schedule.torch}" with expert parallelism overlaps '
            "the experts' dispatch and combine with compute: training.ep_overlap: true."
        )
    if draft.document is not None:
        _checkpointing(draft, draft.document)
        _fp8_all_gather(draft, draft.document)
    draft.check()
    converted = {*TORCHTITAN_DEGREES, "fsdp_reshard_after_forward", *_PIPELINE_CONVERTED}
    not_converted = [key for key in TORCHTITAN_FIELDS if key in table and key not in converted]
    if not_converted:
        draft.notes.append(
            f"Not converted, as they are not mesh settings (keep them in the torchtitan job "
            f"config): {', '.join(not_converted)}."
        )


#: The pipeline schedules ``torch.distributed.pipelining`` knows (torchtitan passes the name to
#: its ``get_schedule_class``, which ignores case).
_TORCH_SCHEDULES = (
    "1F1B",
    "Interleaved1F1B",
    "GPipe",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "PipelineScheduleSingle",
    "PipelineScheduleMulti",
    "ZBVZeroBubble",
    "DualPipeV",
)
#: The schedules the estimate models, by torch's name.
_MODELLED: Mapping[str, PipelineSchedule] = {
    row.torch: row for row in SCHEDULES if row.torch is not None
}
#: torchtitan's weights of the embedding and the output in the pipeline split (1 each by
#: default), and the key of the ``training`` block each one is.
_SPLIT_WEIGHTS = {
    "pipeline_parallel_first_stage_less_layers": "embedding_as_layers",
    "pipeline_parallel_last_stage_less_layers": "output_as_layers",
}
_PIPELINE_CONVERTED = (
    "pipeline_parallel_schedule",
    "pipeline_parallel_layers_per_stage",
    *_SPLIT_WEIGHTS,
)


def _pipeline(draft: Draft, table: Mapping[str, Any]) -> PipelineSchedule | None:
    """With pp above 1, ``training.pp_schedule`` (and its model chunks per rank) where the
    estimate models torchtitan's schedule, and the embedding's and output's weights in the
    split, which torchtitan always applies; the schedule the estimate models, or None when
    torch's is not one (or no schedule)."""
    written = table.get("pipeline_parallel_schedule", "1F1B")
    names = {name.lower(): name for name in _TORCH_SCHEDULES}
    torch_name = names.get(written.lower()) if isinstance(written, str) else None
    if torch_name is None:
        draft.fail(
            "pipeline_parallel_schedule",
            f"expected one of torch's pipeline schedules ({', '.join(_TORCH_SCHEDULES)}), got "
            f"{describe_value(written)}",
        )
        return None
    schedule = _MODELLED.get(torch_name)
    if draft.degrees.get("pp", 1) == 1:
        return schedule
    if "module_fqns_per_model_part" in table:
        draft.notes.append(
            "module_fqns_per_model_part names the modules of each model chunk, and torchtitan "
            "splits the pipeline by it: the training block leaves the split and the schedule "
            "out; give --pp-schedule, --virtual-stages and --first-stage-layers and "
            "--last-stage-layers to plan and show."
        )
        return schedule
    for key, name in _SPLIT_WEIGHTS.items():
        # validated with the config, and a problem reported at torchtitan's key
        draft.training[name] = table.get(key, 1)
        if key in table:
            draft.origins[("training", name)] = key
        else:
            draft.comments[f"training.{name}"] = f"torchtitan's default {key}"
    if schedule is None:
        draft.notes.append(
            f'pipeline_parallel_schedule = "{torch_name}" is not converted: the estimate models '
            f"{spoken_list(list(_MODELLED))}; give --pp-schedule and --virtual-stages to plan "
            "and show."
        )
        return None
    draft.training["pp_schedule"] = schedule.name
    if "pipeline_parallel_schedule" in table:
        draft.origins[("training", "pp_schedule")] = "pipeline_parallel_schedule"
    per_stage = "pipeline_parallel_layers_per_stage"
    if per_stage in table:
        # validated with the config, and a problem reported at torchtitan's key
        draft.train("layers_per_stage", table[per_stage], per_stage)
    elif schedule.looped:
        draft.training["virtual_stages"] = 2
        draft.comments["training.virtual_stages"] = f"torchtitan's default for {torch_name}"
    return schedule


#: torchtitan 0.2.1's ``ActivationCheckpoint`` defaults: selective, every second block.
_DEFAULT_CHECKPOINTING = {"mode": "selective", "selective_ac_option": "2"}
_CHECKPOINT_TABLE = "activation_checkpoint"
_FLOAT8_TABLE = "quantize.linear.float8"
_FLOAT8_CONVERTERS = ("quantize.linear.float8", "float8")


def _checkpointing(draft: Draft, document: Mapping[str, Any]) -> None:
    """``training.activation_checkpointing`` from ``[activation_checkpoint]``: the modes say
    the same (selective with ``selective_ac_option = "op"`` is the per-op policy), and
    torchtitan's layer-wise selective checkpointing (its default: ``"2"``) recomputes every
    N-th block whole, ``full`` with ``checkpoint_every`` N (``"0"`` and ``"1"``, every block)."""
    table = document.get(_CHECKPOINT_TABLE)
    if isinstance(table, Mapping):
        draft.other_tables.append(_CHECKPOINT_TABLE)
    else:
        table = {}
    settings = {**_DEFAULT_CHECKPOINTING, **table}
    mode, option = settings["mode"], settings["selective_ac_option"]
    if mode == "selective" and not (option == "op" or _count(option)):
        draft.fail(
            "selective_ac_option",
            f"expected 'op' or a number of blocks such as '2', got {describe_value(option)}",
            _CHECKPOINT_TABLE,
        )
        return
    if mode in ("none", "full") or (mode == "selective" and option == "op"):
        draft.training["activation_checkpointing"] = mode
        return
    if mode == "selective":
        every = int(option)
        bound = TRAINING_BOUNDS["checkpoint_every"]
        if every > bound.maximum:
            draft.fail(
                "selective_ac_option",
                f"expected at most {int(bound.maximum)} blocks ({bound.beyond}), got {every}",
                _CHECKPOINT_TABLE,
            )
            return
        draft.training["activation_checkpointing"] = "full"
        default = "" if table else "torchtitan's default "
        written = f'{default}selective_ac_option = "{option}"'
        if every > 1:
            draft.training["checkpoint_every"] = every
            draft.comments["training.checkpoint_every"] = written
        else:
            draft.comments["training.activation_checkpointing"] = f"{written}: every block"
    elif mode == "memory_budget":
        draft.notes.append(
            '[activation_checkpoint] mode = "memory_budget" leaves what to recompute to the '
            "compiler: the training block leaves it out; give --activation-checkpointing."
        )
    else:
        draft.fail(
            "mode",
            f"expected 'none', 'selective', 'full' or 'memory_budget', got {describe_value(mode)}",
            _CHECKPOINT_TABLE,
        )


def _fp8_all_gather(draft: Draft, document: Mapping[str, Any]) -> None:
    """``training.fp8_param_gather`` when the job trains its linear layers in float8 and
    FSDP gathers them so, which torchtitan turns on only with data-parallel sharding."""
    model = document.get("model")
    converters = model.get("converters", ()) if isinstance(model, Mapping) else ()
    quantize = document.get("quantize")
    linear = quantize.get("linear") if isinstance(quantize, Mapping) else None
    float8 = linear.get("float8") if isinstance(linear, Mapping) else None
    if not isinstance(float8, Mapping) or "enable_fsdp_float8_all_gather" not in float8:
        return
    draft.other_tables.append(_FLOAT8_TABLE)
    enabled = float8["enable_fsdp_float8_all_gather"]
    problem = boolean_problem(enabled)
    if problem is not None:
        draft.fail("enable_fsdp_float8_all_gather", problem, _FLOAT8_TABLE)
        return
    trained = isinstance(converters, list) and any(
        name in converters for name in _FLOAT8_CONVERTERS
    )
    if enabled and trained and draft.degrees.get("dp_shard", -1) != 1:
        draft.training["fp8_param_gather"] = True
        draft.notes.append(
            "[quantize.linear.float8] enable_fsdp_float8_all_gather gathers the float8 linear "
            "layers' weights in fp8: training.fp8_param_gather: true."
        )


def _count(option: object) -> bool:
    """Whether ``option`` is a number of blocks, as torchtitan's ``int()`` reads it."""
    return isinstance(option, str) and option.isdecimal()
