"""``--explain``: one layout's memory by term, what each term holds under the settings, and
its source (docs/estimate.md has each term's check), as text and as JSON."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from meshconf.cli.estimate_report import gib
from meshconf.features.plan.estimate import runtime as runtime_terms
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate.training import Training

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
#: Where the micro-batches in flight of the schedules past 1F1B's and GPipe's come from.
_SCHEDULE_SOURCES: Mapping[str, str] = MappingProxyType(
    {
        "loopedbfs": "; loopedbfs: Lamy-Poirier (arXiv:2211.05953), torch's ScheduleLoopedBFS",
        "llama3": "; llama3: The Llama 3 Herd of Models, section 3.3.2",
        "zbv": "; zbv: Qi et al. (ICLR 2024) section 6, torch's ScheduleZBVZeroBubble",
        "dualpipev": "; dualpipev: the DeepSeek-V3 report, table 2, torch's ScheduleDualPipeV",
        "dualpipe": "; dualpipe: the DeepSeek-V3 report, table 2, DeepSeek's DualPipe",
    }
)
_SHARDED = (
    "nothing",
    "the optimizer state",
    "the optimizer state and the gradients",
    "the optimizer state, the gradients and the parameters",
)


#: What FSDP holds gathered when the peak falls outside the blocks (``Memory.phase``).
_END_GATHERS = {
    "loss": "the final norm and the output gathered, as FSDP keeps them from their forward "
    "pass to their backward pass",
    "output": "the final norm and the output gathered again for the norm's backward pass, "
    "their all-gather buffer, and the output's gradient in its reduce-scatter buffer",
    "embedding": "the embedding gathered, its all-gather buffer, and its gradient in its "
    "reduce-scatter buffer",
}


def memory_terms(found: Estimate, training: Training) -> list[dict[str, Any]]:
    """Each memory term: its name, GiB, what it holds under ``training``, and its source."""
    memory = found.memory
    stage = training.zero_stage
    sharding = f"ZeRO {stage}: data parallelism shards {_SHARDED[stage]}"
    master = "" if training.param_dtype == "fp32" else ", an fp32 master copy"
    pipelined = found.bubble_fraction > 0
    if stage <= 1:
        gathered = f"nothing: ZeRO {stage} keeps the weights whole"
    elif memory.gathers == 0:
        gathered = "nothing: no weight is sharded (fsdp and efsdp are 1)"
    elif stage == 2:
        gathered = "one block's gradient before its reduce-scatter"
    elif memory.phase in _END_GATHERS:
        gathered = _END_GATHERS[memory.phase]
    elif training.reshards(2 if pipelined else 1):
        gathered = (
            "one block gathered, the next prefetched, the previous block's gradient in its "
            "reduce-scatter buffer"
        )
    elif pipelined:
        gathered = (
            "every block of the rank gathered, and its gradients unsharded until the last "
            "micro-batch (no resharding under the pipeline)"
        )
    else:
        gathered = "every block of the rank gathered from its forward to its backward pass"
    weights = f"in {training.param_dtype}"
    if training.fp8_param_gather and stage == 3:
        in_blocks = memory.gathers and memory.phase == "block"
        gathered += "; the blocks' dense linear weights gathered in fp8" if in_blocks else ""
    elif training.fp8_param_gather:
        weights += ", the blocks' dense linear weights in fp8"
    stored = memory.activations - memory.output_head - memory.block_backward
    if memory.phase == "embedding":
        held = "nothing: the peak falls in the embedding's backward pass, which comes last"
    else:
        held = (
            f"{gib(stored):.2f} GiB stored by the blocks of {memory.in_flight} "
            f"chunk-micro-batch{'' if memory.in_flight == 1 else 'es'} in flight, "
        )
        if memory.output_head:
            held += (
                f"{gib(memory.output_head):.2f} GiB for the final norm and the loss's fp32 "
                "copies of the logits"
            )
        elif memory.phase == "output":
            held += "at the final norm's backward pass"
        else:
            held += (
                f"{gib(memory.block_backward):.2f} GiB for one block's backward pass, what it "
                "recomputes and the gradients in flight"
            )
    copies = (
        ", its chunk and a copy of its mirror rank's," if training.placement == "mirror" else ""
    )
    holds = {
        "params": f"the rank's weights{copies} after tp, ep and etp, {weights}; {sharding}",
        "grads": f"the rank's gradients in {training.grad_dtype}",
        "optimizer": f"AdamW: two {training.optimizer_dtype} moments{master}, a step per tensor",
        "gathers": gathered,
        "activations": held,
        "runtime": _runtime_holds(found, training),
    }
    schedule_sources = _SCHEDULE_SOURCES.get(training.schedule, "")
    if training.microbatch_group is not None:
        schedule_sources += "; micro-batch groups: Megatron-Core's get_pp_rank_microbatches"
    return [
        {
            "term": term,
            "gib": gib(getattr(memory, term)),
            "holds": holds[term],
            "source": SOURCES[term] + (schedule_sources if term == "activations" else ""),
        }
        for term in holds
    ]


def _runtime_holds(found: Estimate, training: Training) -> str:
    runtime = found.runtime
    if runtime.given is not None:
        return "as --runtime-gib gives it"
    groups = runtime.communicators
    communicators = (
        f"NCCL's buffers for the {len(groups)} communicator{'' if len(groups) == 1 else 's'} "
        f"the rank sends over ({', '.join(f'{name} of {size}' for name, size in groups.items())})"
        f" {gib(runtime.nccl):.2f}"
        if groups
        else "no NCCL communicator (no dim sends)"
    )
    reserve = (
        "as --allocator-gib gives it"
        if training.allocator_gib is not None
        else f"{float(runtime_terms.RESERVED_RATIO - 1):.4f} of the tensors' "
        f"{gib(found.memory.training_state):.2f}, reserved over allocated as published"
    )
    return (
        f"the CUDA context {gib(runtime.cuda_context):.2f}, {communicators}, the allocator's "
        f"reserve {gib(runtime.allocator):.2f} ({reserve})"
    )


#: What the estimate leaves out of the memory.
NOT_COUNTED = "temporaries of single ops beyond those named"


def explain_lines(found: Estimate, training: Training) -> list[str]:
    """The memory by term as text: a table, then what is not counted."""
    terms = memory_terms(found, training)
    lines = [
        f"memory by term (GiB, pipeline rank {found.memory.pp_rank}; each term's check in "
        "docs/estimate.md):"
    ]
    width = max(len(term["term"]) for term in terms)
    for term in terms:
        lines.append(f"  {term['term']:<{width}}  {term['gib']:>7.2f}  {term['holds']}")
        lines.append(f"  {'':<{width}}  {'':>7}  source: {term['source']}")
    lines.append(f"not counted: {NOT_COUNTED}")
    return lines
