"""The pipeline schedules, one row each: its name, how torch and Megatron-LM spell it, where it
places the model chunks, how it groups micro-batches and the order it runs a step's passes in.

:data:`SCHEDULES` is the one table of the schedules: the config's ``training.pp_schedule``,
its JSON Schema, ``--pp-schedule``, the converters and the estimate read it. The estimate's
formulas of each order (micro-batches in flight, bubble, the counts a schedule cannot run)
live in ``meshconf.features.plan.estimate.schedule``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from meshconf.core.messages import spoken_list

#: How a schedule holds the model chunks: one a pipeline rank; ``virtual_stages`` a rank placed
#: in rounds, chunk ``c`` on rank ``c % pp`` (looped); two a rank in a V, chunks ``r`` and
#: ``2 pp - 1 - r`` on rank ``r``, so the first rank holds the embedding and the output; or
#: one a rank and a copy of its mirror rank's, rank ``r`` running chunk ``r`` for the
#: micro-batches that enter at the first rank and chunk ``pp - 1 - r`` for those that enter at
#: the last (mirror).
Chunks = Literal["one", "looped", "v", "mirror"]
#: Where the chunks sit on the ranks: in rounds (one or looped), in a V, or mirrored.
Placement = Literal["rounds", "v", "mirror"]
_PLACEMENTS: Mapping[Chunks, Placement] = {
    "one": "rounds",
    "looped": "rounds",
    "v": "v",
    "mirror": "mirror",
}
#: How many micro-batches a schedule runs each model chunk on before the next chunk's
#: (``microbatch_group``): ``pp`` to the step's ``m``, a last group of at least ``pp``
#: (Megatron-LM's interleaved schedule), or any number up to ``m`` (Llama 3's).
Grouping = Literal["pp_to_m", "up_to_m"]
#: The order a schedule runs a step's passes in, which sets what a rank holds and how long it
#: waits: depth-first, one forward and one backward pass after a warm-up (1F1B, Narayanan et
#: al. 2021; interleaved over looped chunks); breadth-first, every forward pass before the
#: backward passes (GPipe; LoopedBFS, Lamy-Poirier, arXiv:2211.05953); ZB-V's, the backward
#: pass for the weights run apart to fill the bubble (Qi et al. 2024, section 6); or
#: overlapped, a forward and a backward pass of two micro-batches at once (DeepSeek's DualPipe,
#: the DeepSeek-V3 report, table 2).
Order = Literal["depth_first", "breadth_first", "zero_bubble_v", "overlapped"]

#: Megatron-Core's schedules (``get_forward_backward_func``): without model chunks per
#: pipeline rank, and with them.
WITHOUT_INTERLEAVING = "forward_backward_pipelining_without_interleaving"
WITH_INTERLEAVING = "forward_backward_pipelining_with_interleaving"


@dataclass(frozen=True)
class PipelineSchedule:
    """One pipeline schedule."""

    name: str
    #: What it is, after its name in the config's reference and the JSON Schema.
    meaning: str
    chunks: Chunks
    order: Order
    #: torch.distributed.pipelining's name of it (torchtitan's
    #: ``pipeline_parallel_schedule``), None where torch has none.
    torch: str | None = None
    #: The Megatron-Core schedule that runs it, None where none does.
    megatron: str | None = None
    #: None where it takes no ``microbatch_group``.
    grouping: Grouping | None = None
    #: Where its micro-batches in flight come from, past what the activations' source cites
    #: (1F1B's and GPipe's); "" where nothing more.
    source: str = ""

    @property
    def looped(self) -> bool:
        """It runs ``virtual_stages`` model chunks a pipeline rank, placed in rounds."""
        return self.chunks == "looped"

    @property
    def placement(self) -> Placement:
        return _PLACEMENTS[self.chunks]

    def chunks_per_rank(self, virtual_stages: int) -> int:
        """Model chunks each pipeline rank runs: the virtual stages looped, two in a V, or one
        (mirrored, a copy of its mirror rank's besides)."""
        return {"looped": virtual_stages, "v": 2}.get(self.chunks, 1)


SCHEDULES: tuple[PipelineSchedule, ...] = (
    PipelineSchedule(
        "1f1b",
        "the default",
        chunks="one",
        order="depth_first",
        torch="1F1B",
        megatron=WITHOUT_INTERLEAVING,
    ),
    PipelineSchedule(
        "interleaved",
        "1F1B over virtual_stages chunks a rank",
        chunks="looped",
        order="depth_first",
        torch="Interleaved1F1B",
        megatron=WITH_INTERLEAVING,
        grouping="pp_to_m",
    ),
    PipelineSchedule(
        "llama3",
        "Llama 3's: interleaved, each chunk running microbatch_group micro-batches before the "
        "next chunk's, fewer than pp too",
        chunks="looped",
        order="depth_first",
        grouping="up_to_m",
        source="The Llama 3 Herd of Models, section 3.3.2",
    ),
    PipelineSchedule(
        "loopedbfs",
        "torch's LoopedBFS: every forward pass of every chunk before the backward passes",
        chunks="looped",
        order="breadth_first",
        torch="LoopedBFS",
        source="Lamy-Poirier (arXiv:2211.05953), torch's ScheduleLoopedBFS",
    ),
    PipelineSchedule(
        "gpipe",
        "every forward pass before the backward passes",
        chunks="one",
        order="breadth_first",
        torch="GPipe",
    ),
    PipelineSchedule(
        "zbv",
        "torch's ZBVZeroBubble",
        chunks="v",
        order="zero_bubble_v",
        torch="ZBVZeroBubble",
        source="Qi et al. (ICLR 2024) section 6, torch's ScheduleZBVZeroBubble",
    ),
    PipelineSchedule(
        "dualpipev",
        "DualPipeV",
        chunks="v",
        order="overlapped",
        torch="DualPipeV",
        source="the DeepSeek-V3 report, table 2, torch's ScheduleDualPipeV",
    ),
    PipelineSchedule(
        "dualpipe",
        "DeepSeek's DualPipe",
        chunks="mirror",
        order="overlapped",
        source="the DeepSeek-V3 report, table 2, DeepSeek's DualPipe",
    ),
)

SCHEDULE_NAMES: tuple[str, ...] = tuple(schedule.name for schedule in SCHEDULES)
SCHEDULE_BY_NAME: Mapping[str, PipelineSchedule] = {row.name: row for row in SCHEDULES}
#: The schedule a config or a plan runs when it names none.
DEFAULT_SCHEDULE = SCHEDULES[0].name
# A schedule's name: one of SCHEDULE_NAMES, which the config's field checks.
if TYPE_CHECKING:
    Schedule = str
else:
    Schedule = Literal[SCHEDULE_NAMES]


def _named(chunks: Chunks) -> list[str]:
    return [schedule.name for schedule in SCHEDULES if schedule.chunks == chunks]


#: The schedules that run ``virtual_stages`` chunks a rank, and those that take a
#: ``microbatch_group``, as messages list them (``a, b or c``).
LOOPED_LISTED = spoken_list(_named("looped"), "or")
GROUPED_LISTED = spoken_list([row.name for row in SCHEDULES if row.grouping is not None], "or")
#: ``training.pp_schedule`` as the config's reference and the JSON Schema describe it.
SCHEDULES_DESCRIBED = (
    "The pipeline schedule: "
    + spoken_list([f"{row.name} ({row.meaning})" for row in SCHEDULES], "or")
    + f"; {spoken_list(_named('v'))} place two chunks on each rank in a V, the first rank "
    f"holding the embedding and the output; {spoken_list(_named('mirror'))} sends half the "
    "micro-batches from each end, each rank holding its chunk and a copy of its mirror rank's."
)


def megatron_schedule(interleaved: bool) -> PipelineSchedule:
    """The schedule Megatron-LM runs: its interleaved one where model chunks per pipeline
    rank are given, else 1F1B."""
    spelling = WITH_INTERLEAVING if interleaved else WITHOUT_INTERLEAVING
    return next(row for row in SCHEDULES if row.megatron == spelling)
