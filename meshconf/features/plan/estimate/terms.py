"""Each memory term of an estimate, as ``--explain`` gives it: its bytes, what it holds
under the settings (what the estimate decided, read from it), and its source."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate import gpu_overheads as runtime_terms
from meshconf.features.plan.estimate.memory import Gathered
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate.step_inputs import Training

#: Where each term comes from.
SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "params": "torchtitan's tensor-parallel plan; ZeRO (SC 2020) figure 1; FSDP2's padding",
        "grads": "ZeRO (SC 2020) figure 1",
        "optimizer": "torch.optim.AdamW's state; ZeRO's K = 12",
        "gathers": "FSDP2's reshard_after_forward, prefetch and reduce-scatter buffer; "
        "torchtitan's FSDP groups (apply_fsdp); torch.distributed.pipelining",
        "activations": "Korthikanti et al. (MLSys 2023) section 4; Narayanan et al. (SC 2021) "
        "section 2.2; the loss measured with torch's MemTracker; selective: torchtitan's "
        "SelectiveAC; norms-latent-swiglu: the DeepSeek-V3 report, sections 3.2.3 and 3.3.3",
        "runtime": "; ".join(runtime_terms.SOURCES.values()),
    }
)
_GROUP_SOURCE = "micro-batch groups: Megatron-Core's get_pp_rank_microbatches"
#: What data parallelism shards at each ZeRO stage.
_SHARDED = (
    "nothing",
    "the optimizer state",
    "the optimizer state and the gradients",
    "the optimizer state, the gradients and the parameters",
)
#: What the gathers hold, by what the estimate decided they hold (``Memory.gathered``);
#: ``{stage}`` is the ZeRO stage.
GATHERED: Mapping[Gathered, str] = MappingProxyType(
    {
        "whole": "nothing: ZeRO {stage} keeps the weights whole",
        "unsharded": "nothing: no weight is sharded (fsdp and efsdp are 1)",
        "gradient": "one block's gradient before its reduce-scatter",
        "resharded": "one block gathered, the next prefetched, the previous block's gradient "
        "in its reduce-scatter buffer",
        "kept": "every block of the rank gathered from its forward to its backward pass",
        "accumulated": "every block of the rank gathered, and its gradients unsharded until "
        "the last micro-batch (no resharding under the pipeline)",
        "loss": "the final norm and the output gathered, as FSDP keeps them from their forward "
        "pass to their backward pass",
        "output": "the final norm and the output gathered again for the norm's backward pass, "
        "their all-gather buffer, and the output's gradient in its reduce-scatter buffer",
        "embedding": "the embedding gathered, its all-gather buffer, and its gradient in its "
        "reduce-scatter buffer",
    }
)
#: The gathers that hold the blocks' weights (which ``fp8_param_gather`` gathers in fp8).
_BLOCKS_GATHERED: tuple[Gathered, ...] = ("resharded", "kept", "accumulated")
#: What the estimate leaves out of the memory.
NOT_COUNTED = "temporaries of single ops beyond those named"


@dataclass(frozen=True)
class Term:
    """One memory term of an estimate: its name, its bytes, what it holds under the
    settings, and its source."""

    name: str
    bytes: int
    holds: str
    source: str


def memory_terms(found: Estimate, training: Training) -> tuple[Term, ...]:
    """Each memory term of ``found``, estimated under ``training``."""
    holds = {
        "params": _params_hold(training),
        "grads": f"the rank's gradients in {training.grad_dtype}",
        "optimizer": f"AdamW: two {training.optimizer_dtype} moments"
        + ("" if training.param_dtype == "fp32" else ", an fp32 master copy")
        + ", a step per tensor",
        "gathers": _gathers_hold(found, training),
        "activations": _activations_hold(found),
        "runtime": _runtime_hold(found, training),
    }
    # where the schedule's micro-batches in flight come from, past 1F1B's and GPipe's
    row = training.pipeline_schedule
    schedule = f"{row.name}: {row.source}" if row.source else None
    group = None if training.microbatch_group is None else _GROUP_SOURCE
    sources = {
        **SOURCES,
        "activations": "; ".join(
            source for source in (SOURCES["activations"], schedule, group) if source
        ),
    }
    return tuple(
        Term(term, getattr(found.memory, term), held, sources[term]) for term, held in holds.items()
    )


def _gib(size: float) -> str:
    return f"{size / GIB:.2f}"


def _params_hold(training: Training) -> str:
    stage = training.zero_stage
    copies = (
        ", its chunk and a copy of its mirror rank's," if training.placement == "mirror" else ""
    )
    # ZeRO 3 keeps a shard in param_dtype, gathered in fp8 (the gathers); below, the whole
    # weights are kept in fp8
    fp8 = training.fp8_param_gather and stage != 3
    weights = f"in {training.param_dtype}" + (
        ", the blocks' dense linear weights in fp8" if fp8 else ""
    )
    sharding = f"ZeRO {stage}: data parallelism shards {_SHARDED[stage]}"
    return f"the rank's weights{copies} after tp, ep and etp, {weights}; {sharding}"


def _gathers_hold(found: Estimate, training: Training) -> str:
    gathered = found.memory.gathered
    held = GATHERED[gathered].format(stage=training.zero_stage)
    if training.fp8_param_gather and gathered in _BLOCKS_GATHERED:
        held += "; the blocks' dense linear weights gathered in fp8"
    return held


def _activations_hold(found: Estimate) -> str:
    memory = found.memory
    if memory.phase == "embedding":
        return "nothing: the peak falls in the embedding's backward pass, which comes last"
    stored = memory.activations - memory.output_head - memory.block_backward
    plural = "" if memory.in_flight == 1 else "es"
    held = (
        f"{_gib(stored)} GiB stored by the blocks of {memory.in_flight} "
        f"chunk-micro-batch{plural} in flight, "
    )
    if memory.output_head:
        return held + (
            f"{_gib(memory.output_head)} GiB for the final norm and the loss's fp32 copies of "
            "the logits"
        )
    if memory.phase == "output":
        return held + "at the final norm's backward pass"
    return held + (
        f"{_gib(memory.block_backward)} GiB for one block's backward pass, what it recomputes "
        "and the gradients in flight"
    )


def _runtime_hold(found: Estimate, training: Training) -> str:
    runtime = found.runtime
    if runtime.given is not None:
        return "as --runtime-gib gives it"
    groups = runtime.communicators
    sends = ", ".join(f"{name} of {size}" for name, size in groups.items())
    communicators = (
        f"NCCL's buffers for the {len(groups)} communicator{'' if len(groups) == 1 else 's'} "
        f"the rank sends over ({sends}) {_gib(runtime.nccl)}"
        if groups
        else "no NCCL communicator (no dim sends)"
    )
    reserve = (
        "as --allocator-gib gives it"
        if training.allocator_gib is not None
        else f"{float(runtime_terms.RESERVED_RATIO - 1):.4f} of the tensors' "
        f"{_gib(found.memory.training_state)}, reserved over allocated as published"
    )
    return (
        f"the CUDA context {_gib(runtime.cuda_context)}, {communicators}, the allocator's "
        f"reserve {_gib(runtime.allocator)} ({reserve})"
    )
