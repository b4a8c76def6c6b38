"""How a model's layers are cut into pipeline chunks, where the chunks go on the ranks, and
what each pipeline rank holds.

Pure Python. Formulas and sources in docs/plan.md ("Pipeline stages").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from meshconf.core.schedules import SCHEDULE_BY_NAME, Placement
from meshconf.core.setting_values import Ends
from meshconf.core.settings import TRAINING_BOUNDS
from meshconf.features.plan.estimate.architecture import Architecture, LayerKind

#: The kinds of blocks, in model order.
KINDS: tuple[LayerKind, ...] = ("dense", "moe")


def stage_layers(
    layers: int,
    pp: int,
    chunks_per_stage: int,
    ends: Ends = (None, None),
    placement: Placement = "rounds",
) -> list[list[list[int]]]:
    """The layers of every pipeline rank, chunk by chunk (see :func:`rank_chunks`)."""
    ranks = (rank_chunks(layers, pp, chunks_per_stage, rank, ends, placement) for rank in range(pp))
    return [[list(chunk) for chunk in chunks] for chunks in ranks]


def chunk_ids(pp: int, chunks_per_stage: int, rank: int, placement: Placement = "rounds") -> range:
    """The model chunks a pipeline rank runs, in model order, placed in rounds, in a V or
    mirrored as ``meshconf.core.schedules.Chunks`` says."""
    if placement == "v":
        return range(rank, 2 * pp - rank, 2 * (pp - rank) - 1)
    if placement == "mirror":
        low, high = sorted((rank, pp - 1 - rank))
        return range(low, high + 1, max(1, high - low))
    return range(rank, pp * chunks_per_stage, pp)


def rank_of_chunk(pp: int, chunk: int, placement: Placement = "rounds") -> int:
    """The pipeline rank that runs a chunk (:func:`chunk_ids`; mirrored, the rank that runs it
    for the micro-batches entering at the first rank)."""
    if placement == "v" and chunk >= pp:
        return 2 * pp - 1 - chunk
    return chunk % pp


def rank_chunks(
    layers: int,
    pp: int,
    chunks_per_stage: int,
    rank: int,
    ends: Ends = (None, None),
    placement: Placement = "rounds",
) -> list[range]:
    """The layers of one pipeline rank, chunk by chunk. The model is cut into
    ``pp * chunks_per_stage`` chunks of consecutive layers, placed on the ranks by
    :func:`chunk_ids`. Sizes differ by at most one, and the larger ones go to the middle chunks
    first, so the first chunk (with the embedding) and the last (with the output) are the
    smaller ones when the layers do not divide evenly. ``ends`` gives the first and the last
    chunk's layers instead, as Megatron-LM's ``--decoder-first-pipeline-num-layers`` and
    ``--decoder-last-pipeline-num-layers`` do (0 leaves a chunk the embedding or the output
    alone); the other chunks then share the rest, the earlier ones taking one more."""
    count = pp * chunks_per_stage
    if ends != (None, None) and count >= 2:
        split = EndSplit.of(layers, count, ends)
        return [
            range(split.start(c), split.start(c) + split.size(c))
            for c in chunk_ids(pp, chunks_per_stage, rank, placement)
        ]
    base, extra = divmod(layers, count)
    found = []
    for chunk in chunk_ids(pp, chunks_per_stage, rank, placement):
        start = chunk * base + _extras_before(chunk, extra, count)
        size = base + _extras_before(chunk + 1, extra, count) - _extras_before(chunk, extra, count)
        found.append(range(start, start + size))
    return found


@dataclass(frozen=True)
class EndSplit:
    """A split of ``count`` (at least 2) chunks whose first or last chunk's layers are
    given (:func:`rank_chunks`), each chunk's size and first layer in a few operations,
    whatever the count; a size is never below 0."""

    count: int
    first: int | None
    last: int | None
    #: Layers of each free chunk, and how many of the free chunks take one more.
    base: int
    extra: int

    @classmethod
    def of(cls, layers: int, count: int, ends: Ends) -> EndSplit:
        first, last = ends
        free = count - (first is not None) - (last is not None)
        rest = max(0, layers - (first or 0) - (last or 0))
        base, extra = divmod(rest, free) if free else (0, 0)
        return cls(count, first, last, base, extra)

    @property
    def lead(self) -> int:
        """The first free chunk: 1 when the first chunk's layers are given."""
        return 0 if self.first is None else 1

    def size(self, chunk: int) -> int:
        if chunk == 0 and self.first is not None:
            return self.first
        if chunk == self.count - 1 and self.last is not None:
            return self.last
        return self.base + (1 if chunk - self.lead < self.extra else 0)

    def start(self, chunk: int) -> int:
        """The chunk's first layer: the first chunk's, then the free chunks' before it."""
        before = min(max(0, chunk - self.lead), self.count - self.lead - (self.last is not None))
        head = (self.first or 0) if chunk > 0 else 0
        return head + before * self.base + min(before, self.extra)

    def chunk_of(self, layer: int) -> int:
        return _chunk_holding(layer, self.count, self.start)


def chunks_from_layers(
    layers: int, pp: int, layers_per_stage: int, weights: tuple[int, int], schedule: str
) -> tuple[int, str | None]:
    """The model chunks per pipeline rank when each chunk holds ``layers_per_stage`` of the
    ``layers`` plus the ends' ``weights``, as torchtitan's ``pipeline_parallel_layers_per_stage``
    sets them (the chunk count rounded up); with why the schedule cannot run them (torchtitan
    refuses the same, and more than ``virtual_stages`` may give), or None. The count returned
    is at least 1 and at most that bound.

    Raises:
        KeyError: ``schedule`` is not a schedule's name.
    """
    weighted = layers + sum(weights)
    chunks = -(-weighted // layers_per_stage)
    per_rank = max(1, chunks // pp)
    plural = "" if layers_per_stage == 1 else "s"
    made = f"{layers_per_stage} layer{plural} a chunk make {chunks} chunks of {weighted} layers"
    # the bound of virtual_stages, so that no estimate holds more chunks a rank
    most = int(TRAINING_BOUNDS["virtual_stages"].maximum)
    # a looped schedule runs any count from 2, the others the count they place
    row = SCHEDULE_BY_NAME[schedule]
    runs = row.chunks_per_rank(per_rank)
    problem = None
    if chunks % pp:
        problem = f"{made}: not a multiple of pp {pp}"
    elif row.looped and per_rank < 2:
        problem = f"{made}, {per_rank} a pipeline rank: {schedule} needs at least 2"
    elif per_rank != runs:
        problem = f"{made}, {per_rank} a pipeline rank: {schedule} runs {_WORDS[runs]}"
    elif per_rank > most:
        problem = f"{made}, {per_rank} a pipeline rank: more than {most}"
    return min(per_rank, most), problem


#: The chunk counts a schedule that does not loop places on a rank, in words.
_WORDS = {1: "one", 2: "two"}


def weighted_ends(layers: int, count: int, embedding: int, output: int) -> Ends:
    """The layers of the first and last of ``count`` chunks when the embedding counts as
    ``embedding`` layers and the output as ``output``, as torchtitan's
    ``generate_llm_fqn_per_model_part`` splits them (``pipeline_parallel_first_stage_less_layers``
    and ``..._last_...``; Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split`` are weights of 1, on a split that divides
    evenly). The ``layers + embedding + output`` weighted layers are shared evenly, the
    earlier chunks taking one more, as :class:`EndSplit` then shares the middle chunks."""
    base, extra = divmod(layers + embedding + output, count)
    return (max(0, base + (1 if extra else 0) - embedding), max(0, base - output))


def weights_problem(layers: int, count: int, embedding: int, output: int) -> str | None:
    """Why the ends cannot count as ``embedding`` and ``output`` layers in a split of
    ``layers`` into ``count`` chunks (torchtitan refuses the same), or None."""
    weighted = layers + embedding + output
    per_chunk = weighted // count
    counted = f"the embedding and output counted as {embedding} and {output} layers"
    if per_chunk == 0:
        return f"{count} pipeline chunks for {weighted} layers ({counted}): some chunk holds none"
    heaviest = max(embedding, output)
    if heaviest <= per_chunk:
        return None
    return (
        f"{counted} make {weighted} layers for {count} pipeline chunks, {per_chunk} a chunk: "
        f"fewer than the {heaviest} layers one end counts as"
    )


def split_problem(layers: int, count: int, ends: Ends) -> str | None:
    """Why ``layers`` cannot be cut into ``count`` chunks (with ``ends``), or None."""
    if ends == (None, None):
        if count > layers:
            return f"{count} pipeline chunks for {layers} layers: some chunk holds none"
        return None
    if count < 2:
        return "--first-stage-layers and --last-stage-layers need at least 2 pipeline chunks"
    given = [size for size in ends if size is not None]
    rest = layers - sum(given)
    middle = count - len(given)
    if rest < 0 or rest < middle or (middle == 0 and rest != 0):
        first, last = ("-" if size is None else str(size) for size in ends)
        return (
            f"first and last chunks of {first} and {last} layers leave {rest} of {layers} "
            f"layers for the other {middle} pipeline chunks: each needs at least one"
        )
    return None


def _extras_before(chunk: int, extra: int, count: int) -> int:
    """How many of the chunks before ``chunk`` get one layer more: chunks 1 to count - 2
    first, then chunk 0, then chunk count - 1."""
    middle = min(extra, max(0, count - 2))
    zero = 1 if extra > middle and chunk > 0 else 0
    inside = max(0, min(chunk, middle + 1) - 1)
    last = 1 if extra > middle + 1 and chunk >= count else 0
    return inside + zero + last


def candidate_ranks(
    arch: Architecture,
    pp: int,
    chunks_per_stage: int,
    ends: Ends = (None, None),
    placement: Placement = "rounds",
) -> list[int]:
    """The pipeline ranks that can need the most memory. Ranks whose chunks hold the same
    numbers and kinds of layers differ only in the micro-batches in flight, which fall with
    the rank in rounds, so the first rank of each run of equal ranks is enough, with the
    last rank (the output). Runs end where a round of chunks crosses the chunks with one
    layer more (chunks 1 to ``extra``; with ``ends``, the free chunks that take one more) or
    the first layer with experts. In a V, where the micro-batches in flight do not fall with
    the rank, both ends of each run are taken; mirrored, each in the first half of the ranks,
    whose mirror ranks hold the same."""
    count = pp * chunks_per_stage
    experts = arch.experts
    if ends != (None, None) and count >= 2:
        split = EndSplit.of(arch.layers, count, ends)
        # the first chunk, the free chunks with one layer more, those without, the last
        boundaries: tuple[int, ...] = (split.lead, split.lead + split.extra, count - 1)
        chunk_of = split.chunk_of
    else:
        base, extra = divmod(arch.layers, count)
        boundaries = (1, min(extra, max(0, count - 2)) + 1)

        def chunk_of(layer: int) -> int:
            return _chunk_holding(
                layer, count, lambda chunk: chunk * base + _extras_before(chunk, extra, count)
            )

    edges = {0, pp - 1}
    moe_edges: tuple[int, ...] = ()
    if experts is not None and 0 < experts.dense_layers < arch.layers:
        moe_edges = (chunk_of(experts.dense_layers - 1), chunk_of(experts.dense_layers))
    # in rounds a run's first rank is enough; otherwise the ranks on both sides of a boundary
    around = (0,) if placement == "rounds" else (-1, 0, 1)
    for chunk in boundaries:
        if 0 <= chunk < count:
            rank = rank_of_chunk(pp, chunk, placement)
            edges.update(rank + step for step in around)
    for chunk in moe_edges:
        rank = rank_of_chunk(pp, chunk, placement)
        edges.update(rank + step for step in {*around, 1})
    if placement == "mirror":
        # a rank and its mirror rank hold the same two chunks, and as many in flight
        edges = {min(rank, pp - 1 - rank) for rank in edges if 0 <= rank < pp}
    return sorted(rank for rank in edges if 0 <= rank < pp)


def _chunk_holding(layer: int, count: int, start: Callable[[int], int]) -> int:
    """The chunk of ``count`` that holds a layer, by binary search on their first layers."""
    low, high = 0, count - 1
    while low < high:
        middle = (low + high + 1) // 2
        if start(middle) <= layer:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(frozen=True)
class RankStage:
    """What one pipeline rank holds: the kinds of layers of each of its chunks, and
    whether it has the embedding (first) and the output (last)."""

    rank: int
    chunks: tuple[dict[LayerKind, int], ...]
    first: bool
    last: bool

    @cached_property
    def layers(self) -> dict[LayerKind, int]:
        return {kind: sum(chunk[kind] for chunk in self.chunks) for kind in KINDS}

    @cached_property
    def chunk_sizes(self) -> tuple[tuple[int, ...], ...]:
        """Each chunk's layers of each kind, hashable."""
        return tuple(tuple(chunk[kind] for kind in KINDS) for chunk in self.chunks)


@lru_cache(maxsize=1024)
def rank_stages(
    arch: Architecture,
    pp: int,
    chunks_per_stage: int,
    ends: Ends = (None, None),
    placement: Placement = "rounds",
) -> tuple[RankStage, ...]:
    """The candidate ranks (:func:`candidate_ranks`) with what they hold."""
    ranks = candidate_ranks(arch, pp, chunks_per_stage, ends, placement)
    return tuple(rank_stage(arch, pp, chunks_per_stage, rank, ends, placement) for rank in ranks)


def rank_stage(
    arch: Architecture,
    pp: int,
    chunks_per_stage: int,
    rank: int,
    ends: Ends = (None, None),
    placement: Placement = "rounds",
) -> RankStage:
    chunks = rank_chunks(arch.layers, pp, chunks_per_stage, rank, ends, placement)
    ids = chunk_ids(pp, chunks_per_stage, rank, placement)
    kinds = tuple(kind_counts(arch, chunk) for chunk in chunks)
    return RankStage(rank, kinds, 0 in ids, pp * chunks_per_stage - 1 in ids)


def kind_counts(arch: Architecture, layers: range) -> dict[LayerKind, int]:
    """How many of ``layers`` are dense and how many have experts."""
    first_moe = arch.layers if arch.experts is None else arch.experts.dense_layers
    dense = max(0, min(layers.stop, first_moe) - layers.start)
    return {"dense": dense, "moe": len(layers) - dense}
