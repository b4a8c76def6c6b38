"""Megatron-LM's parallelism arguments as a meshconf config whose groups are Megatron's.

Megatron's data-parallel size is what tp, pp and cp leave of the world; its distributed
optimizer instances are meshconf's dp_replicate and the ranks each one shards over are
dp_shard. The order string becomes ``order:``. Megatron lays experts out on a grid of their
own, meshconf borrows their ranks from dp_shard * cp * tp; every Megatron group is compared
with the meshconf dims that stand for it (:mod:`.megatron_grid`), and the conversion is
refused, naming the group, where meshconf cannot hold the same ranks.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshconf.core.degrees import WORLD_FACTORS
from meshconf.core.domains import DEFAULT_DOMAINS, SPARSE
from meshconf.core.errors import describe_value
from meshconf.features.convert.arguments import Setting, integer_setting, settings_draft
from meshconf.features.convert.draft import (
    DEFAULT_DEGREES,
    Conversion,
    ConversionError,
    Draft,
    validate,
    world_size_note,
)
from meshconf.features.convert.megatron_grid import (
    DEFAULT_ORDER,
    TOKENS,
    TP_PP_DP_ORDER,
    Grid,
    checked_grids,
    full_order,
    pairings,
)
from meshconf.features.convert.megatron_input import SIZE_DEGREES
from meshconf.features.convert.megatron_training import training_block
from meshconf.model.config import MeshConfig

MEGATRON = "megatron"
#: The longest order worth reading: each of the tokens once, with dashes.
_MAX_ORDER_CHARS = 32
#: The sparse domain with ep outside efsdp: Megatron's expert grid when dp is inner to ep.
EP_OUTSIDE_SPARSE = ("pp", "dp_replicate", "ep", "efsdp", "etp")


def _sizes(draft: Draft, settings: Mapping[str, Setting]) -> dict[str, int]:
    sizes = {name: 1 for name in SIZE_DEGREES}
    for name in SIZE_DEGREES:
        setting = settings.get(name)
        if name == "expert_tensor_parallel_size" and (setting is None or setting.value is None):
            sizes[name] = sizes["tensor_model_parallel_size"]  # Megatron's default
        elif setting is not None:
            value = integer_setting(draft, setting)
            if value is not None:
                sizes[name] = value
    return sizes


def _order(draft: Draft, settings: Mapping[str, Setting], sizes: Mapping[str, int]) -> str:
    written = settings.get("order")
    mapping = settings.get("use_tp_pp_dp_mapping")
    if written is None:
        return TP_PP_DP_ORDER if mapping is not None and mapping.value is True else DEFAULT_ORDER
    if not isinstance(written.value, str):
        draft.fail(
            written.key,
            f"expected an order such as {DEFAULT_ORDER}, got {describe_value(written.value)}",
        )
        return DEFAULT_ORDER
    if len(written.value) > _MAX_ORDER_CHARS:
        draft.fail(
            written.key,
            f"expected an order such as {DEFAULT_ORDER}, got a string of "
            f"{len(written.value):,} characters (an order names at most {len(TOKENS)} parts)",
        )
        return DEFAULT_ORDER
    names = written.value.lower().split("-")
    # dp, what the others leave of the world, may be above 1: an order must name it
    by_token = {SIZE_DEGREES[name]: size for name, size in sizes.items()} | {"dp": 2}
    unknown = [name for name in names if name not in TOKENS]
    repeated = sorted({name for name in names if names.count(name) > 1})
    missing = [name for name in TOKENS if name not in names and by_token[name] > 1]
    if unknown or repeated or missing:
        draft.fail(
            written.key,
            f"{written.value!r} is not an order Megatron accepts: it names each of "
            f"{', '.join(TOKENS)} at most once, inner to outer, and every one above 1 "
            f"({', '.join(unknown + repeated + missing)})",
        )
        return DEFAULT_ORDER
    if mapping is not None and mapping.value is True and written.value.lower() != TP_PP_DP_ORDER:
        draft.fail(written.key, f"{written.value} contradicts {mapping.key} ({TP_PP_DP_ORDER})")
    return written.value.lower()


def meshconf_order(order: str) -> tuple[str, ...]:
    """Megatron's order, inner to outer, as meshconf's, outer to inner: ep is dropped (it
    is 1 in Megatron's dense grid), dp is dp_replicate outside dp_shard, and a world factor
    Megatron does not have (of size 1 in the conversion) goes outermost."""
    outer_first = [name for name in reversed(full_order(order)) if name != "ep"]
    result: list[str] = []
    for name in outer_first:
        result += ["dp_replicate", "dp_shard"] if name == "dp" else [name]
    return (*(name for name in WORLD_FACTORS if name not in result), *result)


def _world(draft: Draft, settings: Mapping[str, Setting]) -> str | None:
    """The world size from torchrun's or NeMo's node count and GPUs per node; a note on
    where it came from when it did."""
    per_node = settings.get("nproc_per_node")
    nodes = settings.get("nnodes")
    if per_node is None:
        return None
    gpus = integer_setting(draft, per_node)
    count = 1 if nodes is None else integer_setting(draft, nodes)
    if gpus is None or count is None:
        return None
    if draft.world_size is not None and draft.world_size != gpus * count:
        draft.fail(
            per_node.key,
            f"{gpus} GPUs x {count} nodes = {gpus * count} ranks, but "
            f"--world-size is {draft.world_size}",
        )
        return None
    draft.world_size = gpus * count
    if draft.gpus_per_node is None:
        draft.gpus_per_node = gpus
    nodes_text = "1 node" if nodes is None else f"{nodes.key} {count}"
    return (
        f"world_size {gpus * count} is {per_node.key} {gpus} x {nodes_text}; at start-up "
        "meshconf checks that the launcher's world size agrees."
    )


def convert_megatron(
    settings: Mapping[str, Setting],
    *,
    world_size: int | None = None,
    gpus_per_node: int | None = None,
) -> Conversion:
    """Convert Megatron-LM's settings (from :mod:`.megatron_input`) into a validated meshconf
    config whose groups are the ones Megatron builds.

    Raises :class:`ConversionError` with every problem, each at the argument it concerns.
    """
    draft = settings_draft(settings, world_size, gpus_per_node)
    keys = {name: setting.key for name, setting in settings.items()}
    if "order" not in keys and "use_tp_pp_dp_mapping" in keys:
        keys["order"] = keys["use_tp_pp_dp_mapping"]
    sizes = _sizes(draft, settings)
    training_block(draft, settings, sizes)
    order = _order(draft, settings, sizes)
    launch_note = _world(draft, settings)
    draft.check()
    etp, tp = sizes["expert_tensor_parallel_size"], sizes["tensor_model_parallel_size"]
    if etp not in (1, tp):
        draft.fail(
            keys.get("expert_tensor_parallel_size", keys.get("tensor_model_parallel_size")),
            f"expert tp {etp} is neither 1 nor tp ({tp}); meshconf's etp is one of those",
        )
    grids = None
    if draft.world_size is not None:
        grids = checked_grids(draft, keys, sizes, draft.world_size, order)
    draft.check()
    draft.degrees = {SIZE_DEGREES[name]: value for name, value in sizes.items()}
    draft.degrees["dp_shard"] = DEFAULT_DEGREES["dp_shard"]
    instances = sizes["num_distributed_optimizer_instances"]
    if grids is not None:
        dp = grids[0].sizes["dp"]
        draft.degrees["dp_shard"] = dp // instances
        draft.comments["degrees.dp_shard"] = f"Megatron's data-parallel size {dp} / {instances}"
    if instances > 1:
        draft.comments["degrees.dp_replicate"] = "distributed-optimizer instances"
    if "expert_tensor_parallel_size" not in keys and tp > 1:
        draft.comments["degrees.etp"] = "Megatron's default expert tp: tp"
    draft.origins.update(
        {("degrees", degree): keys[name] for name, degree in SIZE_DEGREES.items() if name in keys}
    )
    if "order" in keys:
        draft.origins[("order",)] = keys["order"]
    converted = meshconf_order(order)
    draft.order = None if converted == WORLD_FACTORS else converted
    try:
        config = validate(draft)
    except ConversionError as error:
        uneven = [problem for problem in error.problems if "unevenly" in problem.message]
        if grids is None or not uneven:
            raise
        draft.fail(
            keys.get("order"),
            f"meshconf cannot express Megatron's groups with order {order}: {uneven[0].message}",
        )
        draft.check()
        raise
    if grids is not None:
        config = _match_groups(draft, config, keys, grids, sizes, order)
    notes = [
        launch_note or world_size_note("Megatron-LM", draft, config, "the arguments"),
        *_notes(sizes, order, settings, grids),
        *draft.notes,
    ]
    return draft.conversion(MEGATRON, notes)


def _match_groups(
    draft: Draft,
    config: MeshConfig,
    keys: Mapping[str, str],
    grids: tuple[Grid, Grid],
    sizes: Mapping[str, int],
    order: str,
) -> MeshConfig:
    """The config whose groups are Megatron's: the default domains, or the sparse domain
    with ep outside efsdp; a problem naming the first group neither holds."""
    pairs = pairings(*grids, sizes["num_distributed_optimizer_instances"])
    key = keys.get("order", keys.get("expert_model_parallel_size"))
    if isinstance(pairs, str):
        draft.fail(
            keys.get("num_distributed_optimizer_instances"),
            f"meshconf cannot express this: {pairs}",
        )
        draft.check()
        return config
    failing = [pair for pair in pairs if not pair.holds(config.layouts)]
    if failing and all(pair.domain == SPARSE for pair in failing):
        draft.domains = {**DEFAULT_DOMAINS, SPARSE: EP_OUTSIDE_SPARSE}
        try:
            alternative: MeshConfig | None = validate(draft)
        except ConversionError:
            alternative = None
        if alternative is not None and all(pair.holds(alternative.layouts) for pair in pairs):
            draft.notes.append(
                f"Megatron's expert grid for order {order} puts ep outside the expert "
                "data-parallel ranks, so the sparse domain lists ep before efsdp; the other "
                "domains are the defaults."
            )
            return alternative
        draft.domains = None
    if failing:
        pair = failing[0]
        dims = ", ".join(pair.dims)
        draft.fail(
            key,
            f"meshconf cannot express Megatron's {pair.megatron} groups with order "
            f"{order}: no layout of the {pair.domain} domain's {dims} holds the same ranks",
        )
        draft.check()
    return config


def _notes(
    sizes: Mapping[str, int],
    order: str,
    settings: Mapping[str, Setting],
    grids: tuple[Grid, Grid] | None,
) -> list[str]:
    instances = sizes["num_distributed_optimizer_instances"]
    notes = [
        "Megatron's data-parallel size is what tp, pp and cp leave of the world; here it is "
        f"dp_replicate ({instances}, Megatron's distributed-optimizer instances) times dp_shard "
        "(the ranks each instance shards over). meshconf's fsdp, dp_shard * cp, is the group "
        "Megatron's distributed optimizer shards over."
    ]
    optimizer = settings.get("use_distributed_optimizer")
    if optimizer is None or optimizer.value is not True:
        notes.append(
            "--use-distributed-optimizer is not set: Megatron keeps a full copy of the "
            "optimizer state on every data-parallel rank, which is training.zero_stage: 0. "
            "The groups are the same either way."
        )
    else:
        notes.append(
            "--use-distributed-optimizer shards the optimizer state alone: training.zero_stage: 1."
        )
    if "moe_router_group_topk" in settings:
        notes.append(
            "--moe-router-group-topk is training.moe_max_nodes: the estimate takes Megatron's "
            "groups of experts as the units of the level the expert group crosses (a node), "
            "as DeepSeek-V3 routes each token to at most that many nodes."
        )
    if meshconf_order(order) != WORLD_FACTORS:
        converted = ", ".join(meshconf_order(order))
        notes.append(
            f"Megatron's order {order} (inner to outer) is order: [{converted}] "
            "(outer to inner); the dims and domains keep their meaning."
        )
    if grids is not None:
        notes.append(
            "Megatron's groups are the meshconf dims: tp = tp, cp = cp, pp = pp, dp = batch, "
            "dp-cp = loss, ep = ep, expert-tp = etp, expert-dp = [dp_replicate, efsdp]"
            + (
                ", and within an instance fsdp and efsdp, across instances dp_replicate"
                if instances > 1
                else ""
            )
            + "; each was compared rank for rank."
        )
    else:
        notes.append(
            "Without the world size, the groups were not compared with Megatron's: "
            "pass --world-size N."
        )
    return notes
