"""torchtitan's ``[parallelism]`` table (torchtitan 0.2.1's ``Parallelism``) as meshconf
degrees, its degrees being meshconf's one for one, and its FSDP resharding policy as the
``training`` block's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshconf.features.convert.common import Draft, integers, unknown_keys

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
#: The fields that are mesh settings, and the meshconf degree each one is.
TORCHTITAN_DEGREES = {
    "pipeline_parallel_degree": "pp",
    "data_parallel_replicate_degree": "dp_replicate",
    "data_parallel_shard_degree": "dp_shard",
    "context_parallel_degree": "cp",
    "tensor_parallel_degree": "tp",
    "expert_parallel_degree": "ep",
    "expert_tensor_parallel_degree": "etp",
}


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
    if "fsdp_reshard_after_forward" in table:
        # validated with the config, and a problem reported at torchtitan's key
        draft.training["reshard_after_forward"] = table["fsdp_reshard_after_forward"]
        draft.origins[("training", "reshard_after_forward")] = "fsdp_reshard_after_forward"
    overlap = table.get("pipeline_parallel_expert_parallel_overlap", True)
    degrees = draft.degrees
    if (
        table.get("pipeline_parallel_schedule") == "DualPipeV"
        and overlap is True
        and degrees.get("pp", 1) > 1
        and degrees.get("ep", 1) > 1
    ):
        # torchtitan overlaps expert and pipeline traffic only under DualPipeV, and by default
        draft.training["ep_overlap"] = True
        draft.notes.append(
            'pipeline_parallel_schedule = "DualPipeV" with expert parallelism overlaps the '
            "experts' dispatch and combine with compute: training.ep_overlap: true."
        )
    converted = {*TORCHTITAN_DEGREES, "fsdp_reshard_after_forward"}
    not_converted = [key for key in TORCHTITAN_FIELDS if key in table and key not in converted]
    if not_converted:
        draft.notes.append(
            f"Not converted, as they are not mesh settings (keep them in the torchtitan job "
            f"config): {', '.join(not_converted)}."
        )
