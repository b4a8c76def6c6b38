"""Hugging Face accelerate's settings (read by :mod:`.accelerate_input`) as a meshconf config
whose groups are the ones accelerate builds. accelerate lays its dims out as meshconf's
default order does (dp_replicate, dp_shard, cp, tp, outer to inner), so the degrees carry
over as they are; what accelerate refuses when it starts is refused here, at the setting
responsible.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

from meshconf.core.degrees import AUTO, MAX_WORLD_SIZE
from meshconf.features.convert.arguments import Setting, integer_setting, settings_draft
from meshconf.features.convert.draft import Conversion, Draft, validate, world_size_note
from meshconf.trainers.accelerate_mesh import (
    SIZE_DEGREES,
    SP_SIZE,
    Launch,
    refusals,
    sp_size_problem,
    uses_fsdp,
    uses_fsdp2,
)

ACCELERATE = "accelerate"


def _values(settings: Mapping[str, Setting]) -> dict[str, object]:
    return {name: setting.value for name, setting in settings.items()}


def convert_accelerate(
    settings: Mapping[str, Setting],
    *,
    world_size: int | None = None,
    gpus_per_node: int | None = None,
) -> Conversion:
    """Convert accelerate's settings (from :func:`read_accelerate`) into a validated meshconf
    config whose groups are accelerate's.

    Raises :class:`ConversionError` with every problem, each at the setting it concerns.
    """
    draft = settings_draft(settings, world_size, gpus_per_node)
    keys = {name: setting.key for name, setting in settings.items()}
    sizes = {name: 1 for name in (*SIZE_DEGREES, SP_SIZE)}
    for name in sizes:
        if name in settings:
            value = integer_setting(draft, settings[name])
            if value is not None:
                sizes[name] = value
    problem = sp_size_problem(sizes[SP_SIZE])
    if problem is not None:
        draft.fail(keys[SP_SIZE], problem)
    processes = _world(draft, settings, keys)
    draft.check()
    degrees = {SIZE_DEGREES[name]: sizes[name] for name in SIZE_DEGREES}
    total = prod(degrees.values())
    written = " * ".join(f"{name} {sizes[name]}" for name in SIZE_DEGREES)
    if total > MAX_WORLD_SIZE:
        _past_the_bound(draft, sizes, keys, f"{total} ({written})")
    if total == 1 and (processes is None or processes > 1):
        # Without a parallelism config accelerate's FSDP shards over every process; with one
        # of sizes 1 it replicates. Without num_processes, the -1 is every process.
        sized = any(name in settings for name in (*SIZE_DEGREES, SP_SIZE))
        every = AUTO if processes is None else processes
        if uses_fsdp(_values(settings)) and not sized:
            degrees["dp_shard"] = every
            draft.comments["degrees.dp_shard"] = "accelerate's FSDP shards over every process"
        else:
            degrees["dp_replicate"] = every
            draft.comments["degrees.dp_replicate"] = "accelerate replicates over every process"
    elif processes is not None and total != processes:
        draft.fail(
            keys.get("num_processes"),
            f"is {processes}, but the parallelism sizes multiply to {total} ({written}); "
            "accelerate refuses a ParallelismConfig whose total_size is not num_processes",
        )
    _refusals(draft, settings, keys, degrees)
    draft.check()
    draft.degrees = degrees
    draft.origins.update(
        {("degrees", degree): keys[name] for name, degree in SIZE_DEGREES.items() if name in keys}
    )
    config = validate(draft)
    world_note = (
        world_size_note("accelerate", draft, config, "the settings")
        if processes is None
        else f"world_size is num_processes, {processes}; at start-up meshconf checks that the "
        "launcher's world size agrees."
    )
    notes = [world_note, *_notes(settings, degrees)]
    return draft.conversion(ACCELERATE, notes)


def _past_the_bound(
    draft: Draft, sizes: Mapping[str, int], keys: Mapping[str, str], product_written: str
) -> None:
    """Raises :class:`ConversionError` at the size that takes the product of the sizes
    (``product_written``, with its factors) past the ranks torch numbers, in accelerate's order.
    """
    product = 1
    for name in SIZE_DEGREES:
        product *= sizes[name]
        if product > MAX_WORLD_SIZE:
            draft.fail(
                keys[name],
                f"the parallelism sizes multiply to {product_written}, more ranks than torch "
                f"can number ({MAX_WORLD_SIZE})",
            )
            break
    draft.check()


def _world(draft: Draft, settings: Mapping[str, Setting], keys: Mapping[str, str]) -> int | None:
    """num_processes as the world size, num_processes / num_machines as the node size."""
    processes = machines = None
    if "num_processes" in settings:
        processes = integer_setting(draft, settings["num_processes"])
    if "num_machines" in settings:
        machines = integer_setting(draft, settings["num_machines"])
    if processes is None:
        return None
    if draft.world_size is not None and draft.world_size != processes:
        draft.fail(
            keys["num_processes"],
            f"is {processes}, but --world-size is {draft.world_size}; give one of them",
        )
        return None
    draft.world_size = processes
    draft.origins[("world_size",)] = keys["num_processes"]
    if machines is not None:
        if processes % machines:
            draft.fail(
                keys["num_machines"],
                f"{machines} machines cannot share {processes} processes evenly; accelerate "
                "runs num_processes / num_machines on each",
            )
        elif draft.gpus_per_node not in (None, processes // machines):
            draft.fail(
                keys["num_machines"],
                f"runs {processes // machines} processes on each machine (num_processes "
                f"{processes} / num_machines {machines}), but --gpus-per-node is "
                f"{draft.gpus_per_node}; give one of them",
            )
        elif draft.gpus_per_node is None:
            draft.gpus_per_node = processes // machines
            draft.origins[("gpus_per_node",)] = keys["num_machines"]
            draft.comments["gpus_per_node"] = "num_processes / num_machines"
    return processes


def _refusals(
    draft: Draft,
    settings: Mapping[str, Setting],
    keys: Mapping[str, str],
    degrees: Mapping[str, int],
) -> None:
    """What accelerate refuses when it starts, at the size responsible, or where FSDP2 was
    turned on when that size was not written."""
    launch = Launch(degrees, abs(prod(degrees.values())), uses_fsdp2(_values(settings)))
    for degree, message in refusals(launch, lambda name: f"{name}_size"):
        draft.fail(keys.get(f"{degree}_size", keys.get("fsdp_version")), message)


def _notes(settings: Mapping[str, Setting], degrees: Mapping[str, int]) -> list[str]:
    notes = []
    if uses_fsdp2(_values(settings)):
        notes.append(
            "FSDP2 shards over accelerate's dp_shard_cp, dp_shard * cp: meshconf's fsdp in the "
            "dense domain (`meshconf.compat.accelerate.parallelism_config` hands accelerate "
            "that group)."
        )
    strategy = settings.get("cp_comm_strategy")
    if strategy is not None and degrees["cp"] > 1:
        notes.append(
            f"{strategy.key} {strategy.value}: how context parallelism exchanges keys and "
            "values, which is accelerate's setting, not the mesh's; keep it in accelerate's "
            "config."
        )
    return notes
