"""What a layout means for nodes: where each dim's groups sit, and warnings for layouts that
work but waste the fast links inside a node.

Nodes hold consecutive ranks, ``gpus_per_node`` each, as torchrun and SLURM number them.
"""

from __future__ import annotations

from meshconf.core.errors import Problem
from meshconf.core.levels import NODE
from meshconf.model.config import MeshConfig

#: Dims that talk in every layer, and why their groups belong inside one node.
HIGH_TRAFFIC = {
    "tp": "tensor parallelism exchanges activations in every layer",
    "etp": "expert tensor parallelism exchanges activations in every expert layer",
    "cp": "context parallelism passes attention blocks around its ring in every layer",
}
#: The world factor whose placement decides each one's: etp sits where tp does.
_PLACED_BY = {"tp": "tp", "etp": "tp", "cp": "cp"}


def node_key(config: MeshConfig) -> str:
    """The key that gives the config's node size, as written: ``gpus_per_node``, or the
    node level's ``levels[N].size``."""
    if config.gpus_per_node is None:
        names = [level.name for level in config.levels or ()]
        if NODE in names:
            return f"levels[{names.index(NODE)}].size"
    return "gpus_per_node"


def config_warnings(config: MeshConfig) -> list[Problem]:
    """The warnings ``show`` and ``validate`` give for a config: its :func:`topology_warnings`
    for its own node size (``gpus_per_node``, or the level named node); none when that or
    the world size is unknown."""
    if config.node_size is None or config.resolved_world_size is None:
        return []
    return topology_warnings(config, config.node_size)


def topology_warnings(
    config: MeshConfig, gpus_per_node: int, source: str | None = None
) -> list[Problem]:
    """Problems that do not make the config invalid: a high-traffic dim whose groups leave a
    node, and a world that does not fill whole nodes. ``source`` says where the node size
    comes from when the config does not give it (the launcher's ``LOCAL_WORLD_SIZE``)."""
    warnings = []
    world_size = config.resolved_world_size
    if world_size is not None and world_size % gpus_per_node:
        key = node_key(config)
        given = f"{key} {gpus_per_node}" if source is None else f"{source}, {gpus_per_node}"
        change = (
            f"set {key} to the ranks each node runs"
            if source is None
            else "give the config the ranks each node runs (gpus_per_node)"
        )
        warnings.append(
            Problem(
                ("world_size",),
                f"world_size {world_size} is not a multiple of {given}: the last node would "
                f"run {world_size % gpus_per_node} ranks, but launchers start the same number "
                f"on every node; use a multiple of {gpus_per_node}, or {change}",
            )
        )
    for dim, reason in HIGH_TRAFFIC.items():
        warning = _high_traffic_warning(config, dim, reason, gpus_per_node)
        if warning is not None:
            warnings.append(warning)
    return warnings


def _placed_on_purpose(config: MeshConfig, dim: str) -> bool:
    """A dim whose world factor inside_node names, or that inside keeps in some level: the
    user chose where it goes already."""
    if config.inside is not None:
        return any(dim in kept for kept in config.inside.values())
    if config.inside_node is None:
        return False
    return _PLACED_BY[dim] in config.inside_node.explicit


def _high_traffic_warning(
    config: MeshConfig, dim: str, reason: str, gpus_per_node: int
) -> Problem | None:
    if _placed_on_purpose(config, dim):
        return None
    for domain, layout in config.layouts.items():
        if dim not in layout.dim_names or layout.dim(dim).size == 1:
            continue
        placement = layout.placement(dim, gpus_per_node)
        if placement == "intra-node":
            continue
        size = layout.dim(dim).size
        if size > gpus_per_node or gpus_per_node % size:
            fix = f"use a {dim} that divides {gpus_per_node}"
        elif config.inside_node is not None:
            degree = _PLACED_BY[dim]
            fix = (
                f"give {degree} its part in inside_node: {degree}: {config.dim_sizes[degree]} "
                f"puts it inside (shrink another part to keep their product {gpus_per_node}), "
                f"{degree}: 1 keeps it across nodes on purpose"
            )
        elif config.inside is not None:
            fix = f"keep it in a node with inside: {{node: [{dim}]}}, or in a larger level"
        else:
            fix = f"put {dim} innermost in domain {domain!r} (only dims of size 1 after it)"
        return Problem(
            ("degrees", dim),
            f"{dim} groups of {size} ranks are {placement} in domain {domain!r} with "
            f"{gpus_per_node} GPUs per node; {reason}, so they belong on one node's fast "
            f"links: {fix}",
        )
    return None
