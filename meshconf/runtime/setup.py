"""Device, backend, default process group and node warnings of a context being set up."""

from __future__ import annotations

import os
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Store

from meshconf.core.errors import MeshconfError, format_key
from meshconf.features.plan.topology import node_key, topology_warnings
from meshconf.model.config import MeshConfig
from meshconf.runtime.launch import Launch
from meshconf.runtime.store import RuntimeSetupError


def pick_device(requested: str, launch: Launch) -> torch.device:
    """The device ``runtime.device`` asks for on this rank.

    Raises:
        RuntimeSetupError: cuda asked for but absent, or more ranks on a node than GPUs.
    """
    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise RuntimeSetupError(
            "runtime.device is cuda, but torch sees no CUDA device "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None}); "
            "use device: auto or cpu"
        )
    if requested == "cpu" or not has_cuda:
        return torch.device("cpu")
    if launch.local_rank >= torch.cuda.device_count():
        raise RuntimeSetupError(
            f"local rank {launch.local_rank} has no GPU: this node has "
            f"{torch.cuda.device_count()}; start at most that many ranks per node"
        )
    return torch.device("cuda", launch.local_rank)


def pick_backend(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    return "nccl" if device.type == "cuda" else "gloo"


def init_default_group(
    launch: Launch, store: Store | None, backend: str, timeout: timedelta
) -> None:
    """The default group over ``store`` (a world of one gets a private in-memory store).

    No device_id: a device-bound NCCL default group makes torch create every subgroup by
    ncclCommSplit, which all ranks must join, defeating member-only group creation.
    """
    if store is None:
        store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=launch.rank,
        world_size=launch.world_size,
        timeout=timeout,
    )


def check_existing_default_group(launch: Launch) -> None:
    """An existing default group must fit member-only group creation and the launcher.

    Raises:
        RuntimeSetupError: it was bound to a device.
        MeshconfError: its size is not the launcher's.
    """
    if getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None):
        raise RuntimeSetupError(
            "the default process group was initialized with device_id, so torch would create "
            "every subgroup by a split that all ranks must join; initialize it without "
            "device_id (call torch.cuda.set_device instead) or let meshconf initialize it"
        )
    if dist.get_world_size() != launch.world_size and launch.source != "none":
        raise MeshconfError(
            f"the default process group has {dist.get_world_size()} ranks but "
            f"{launch.source} says {launch.world_size}"
        )


def node_warnings(
    config: MeshConfig,
    launch: Launch,
    *,
    node_from_launcher: bool = False,
    node_named: bool = False,
) -> list[str]:
    """``show``'s topology warnings for the node size in use, and a launcher that runs
    another number of ranks per node than the config places groups on. Each names the key
    the config gives the node's size with; ``node_from_launcher``: it gives none, and the
    size is the launcher's. ``node_named``: the environment tells each rank its node
    (``MESHCONF_LEVEL_NODE``), which the placement check reads instead of the launcher's
    ranks per node."""
    gpus_per_node = config.node_size
    if gpus_per_node is None:
        return []
    messages = []
    runs = launch.local_world_size
    if launch.source != "none" and runs not in (None, gpus_per_node) and not node_named:
        key = node_key(config)
        messages.append(
            f"{key}: the config places groups on nodes of {gpus_per_node} ranks, but "
            f"{launch.source} runs {runs} on this node, so the groups do not sit where the "
            f"config says (they still work); set {key} to {runs} or start {gpus_per_node} "
            "ranks per node"
        )
    source = "the launcher's LOCAL_WORLD_SIZE" if node_from_launcher else None
    problems = topology_warnings(config, gpus_per_node, source)
    return messages + [f"{format_key(problem.path)}: {problem.message}" for problem in problems]


class TopologyWarning(UserWarning):
    """The meshes work, but their groups sit badly on the nodes, or the config and the
    launcher disagree about how many ranks a node runs."""


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside meshconf, so the
    warning names the user's line however many of meshconf's own calls lie between."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        level, frame = level + 1, frame.f_back
    return level


def warn_topology(messages: list[str]) -> None:
    """Warn with each of a context's topology warnings, at the user's line."""
    for message in messages:
        warnings.warn(message, TopologyWarning, stacklevel=_caller_stacklevel())
