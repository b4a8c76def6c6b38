"""What a GPU holds beside the training state: the CUDA context, NCCL's buffers for each
communicator a rank sends over, and the caching allocator's reserve above the tensors. None
of them can be measured without a GPU: each figure is a published one, cited beside it, that
``--cuda-context-gib``, ``--nccl-communicator-gib``, ``--allocator-gib`` or, for all three,
``--runtime-gib`` replaces. docs/estimate.md says which are published and which measured.

Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from statistics import median

from meshconf.core.setting_values import GIB
from meshconf.features.plan.estimate.step_inputs import Training

#: The CUDA context PyTorch creates on each GPU with CUDA's lazy module loading
#: (``CUDA_MODULE_LOADING=LAZY``, PyTorch's default since 1.13 with CUDA 11.7): about 0.3 GB;
#: about 0.7 GB with every module loaded at start. Published, as reported for PyTorch on
#: A100 and H100; not measured here.
CUDA_CONTEXT_BYTES = 300 * 10**6
#: NCCL's buffers per communicator, through PyTorch, after its first collective: 544 MB for a
#: communicator of 2 GPUs and 688 MB for one of more, measured on 4 A100s with NVLink (NCCL
#: issue #964). They grow with the channels and connections a communicator sets up and stop
#: growing beyond 2 nodes (NCCL #986); each communicator a rank joins has its own unless
#: made by ``ncclCommSplit`` with resource sharing (the same). Published; not measured here.
NCCL_PAIR_BYTES = 544 * 10**6
NCCL_GROUP_BYTES = 688 * 10**6


@dataclass(frozen=True)
class ReservedPeak:
    """One published run's peak reserved and peak allocated memory (``max_reserved`` and
    ``max_active`` as torchtitan logs them), in the unit its source prints."""

    source: str
    allocated: Fraction
    reserved: Fraction

    @property
    def ratio(self) -> Fraction:
        return self.reserved / self.allocated


#: Peak reserved against peak allocated memory in published training runs under FSDP2 (or
#: its per-parameter prototype) and torchtitan, each from one run's own log. Published; not
#: measured here: torch's memory tracker on CPU has no caching allocator to show.
RESERVED_PEAKS: tuple[ReservedPeak, ...] = (
    ReservedPeak(
        "torchtitan commit 61310642f, dsv3_numerics_verification.md: DeepSeek-V3 16B on 8 "
        "H100s, eager FSDP2, peak active 36.17 GiB, peak reserved 40.78 GiB",
        Fraction("36.17"),
        Fraction("40.78"),
    ),
    ReservedPeak(
        "the same run under torchtitan's graph_trainer (simple_fsdp, compiled): peak active "
        "34.24 GiB, peak reserved 36.11 GiB",
        Fraction("34.24"),
        Fraction("36.11"),
    ),
    ReservedPeak(
        "meta-llama/llama-cookbook PR #165: Llama 2 7B on 8 GPUs, per-parameter sharding "
        "(FSDP2's prototype), peak active 14.93 GB, peak reserved 19.52 GB",
        Fraction("14.93"),
        Fraction("19.52"),
    ),
)
#: Reserved over allocated at the peak: the median over :data:`RESERVED_PEAKS` (1.055 to
#: 1.307 among them). The allocator's reserve is the tensors at the peak times this less one.
RESERVED_RATIO: Fraction = median(peak.ratio for peak in RESERVED_PEAKS)

#: Where each term's figure comes from.
SOURCES: Mapping[str, str] = {
    "cuda_context": "published: CUDA's lazy module loading, about 0.3 GB per GPU under PyTorch "
    "(0.7 GB without)",
    "nccl": "published: NCCL issue #964, 544 MB per 2-GPU communicator and 688 MB per larger "
    "one (4 x A100, NVLink, through PyTorch); NCCL #986, one set of buffers per communicator",
    "allocator": "published: the median peak reserved / peak allocated of "
    f"{len(RESERVED_PEAKS)} runs under FSDP2 and torchtitan ("
    + "; ".join(peak.source for peak in RESERVED_PEAKS)
    + ")",
}


@dataclass(frozen=True)
class Runtime:
    """Bytes of each runtime term on one rank; ``communicators`` the size of each
    communicator counted, by the dim that sends over it; ``given`` the whole term as
    ``--runtime-gib`` gives it, in place of the parts."""

    communicators: Mapping[str, int]
    cuda_context: int = 0
    nccl: int = 0
    allocator: int = 0
    given: int | None = None

    @property
    def total(self) -> int:
        if self.given is not None:
            return self.given
        return self.cuda_context + self.nccl + self.allocator


def runtime_memory(training: Training, communicators: Mapping[str, int], tensors: int) -> Runtime:
    """The runtime terms of a rank that sends over ``communicators`` (each dim's group size;
    a group of one sends nothing and has none) and whose tensors hold ``tensors`` bytes at
    its peak."""
    groups = {name: size for name, size in communicators.items() if size > 1}
    if training.runtime_gib is not None:
        return Runtime(groups, given=round(training.runtime_gib * GIB))
    if training.nccl_communicator_gib is not None:
        nccl = len(groups) * round(training.nccl_communicator_gib * GIB)
    else:
        nccl = sum(NCCL_PAIR_BYTES if size == 2 else NCCL_GROUP_BYTES for size in groups.values())
    return Runtime(
        groups,
        cuda_context=_given(training.cuda_context_gib, CUDA_CONTEXT_BYTES),
        nccl=nccl,
        allocator=_given(training.allocator_gib, allocator_reserve(tensors)),
    )


def allocator_reserve(tensors: int) -> int:
    """The caching allocator's reserve above ``tensors`` bytes allocated at the peak."""
    return round(tensors * (RESERVED_RATIO - 1))


def _given(gib: float | None, published: int) -> int:
    return published if gib is None else round(gib * GIB)
