"""What a :class:`~meshconf.runtime.context.DistributedContext` is given, checked before
anything is set up: the config, the launcher's environment, and a simulated rank and world."""

from __future__ import annotations

import os
from collections.abc import Mapping

from meshconf.core.errors import MeshconfError, argument_type_error
from meshconf.features.simulation import check_world_size
from meshconf.model.config import MeshConfig
from meshconf.runtime.launch import Launch, read_launch
from meshconf.runtime.rendezvous import report_launch_error
from meshconf.runtime.store import RuntimeSetupError


def check_config(config: object) -> None:
    """Raises :class:`ArgumentTypeError` unless ``config`` is a validated MeshConfig."""
    if not isinstance(config, MeshConfig):
        raise argument_type_error(
            "config", "a MeshConfig (from meshconf.load_config or MeshConfig(...))", config
        )


def environment(environ: object) -> Mapping[str, str]:
    """The launcher's variables: ``os.environ`` unless a mapping of strings is given.

    Raises:
        ArgumentTypeError: ``environ`` is neither None nor a mapping of strings to strings.
    """
    if environ is None:
        return os.environ
    if not isinstance(environ, Mapping) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in environ.items()
    ):
        raise argument_type_error("environ", "a mapping of strings to strings, or None", environ)
    return environ


def launch_of(environ: Mapping[str, str]) -> Launch:
    """The launcher's variables; when they are wrong, the other ranks are told why (if this
    rank can reach the store) before the error is raised here.

    Raises:
        MeshconfError: as ``read_launch``.
    """
    try:
        return read_launch(environ)
    except MeshconfError as error:
        report_launch_error(environ, error)
        raise


def check_launched_world(config: MeshConfig, launch: Launch) -> None:
    """Raises :class:`MeshconfError` when the config's world size is not the launcher's (or,
    without a launcher, the default process group's)."""
    wanted = config.world_size
    if wanted is None or wanted == launch.world_size:
        return
    if launch.source != "none":
        raise MeshconfError(
            f"world_size: the config says {wanted}, but {launch.source} started "
            f"{launch.world_size} ranks"
        )
    if launch.world_size > 1:
        raise MeshconfError(
            f"world_size: the config says {wanted}, but the default process group this "
            f"script initialized has {launch.world_size} ranks"
        )
    # No launcher's variables and no default group: one process alone (``python train.py``,
    # or ``accelerate launch --cpu``, which starts one process unless told how many).
    raise MeshconfError(
        f"world_size: the config says {wanted} ranks, but this process was started alone, "
        "without a launcher's RANK and WORLD_SIZE, so the world is 1 rank; start "
        f"{wanted} processes: `torchrun --nproc_per_node {wanted} train.py`, or `accelerate "
        f"launch --num_processes {wanted} train.py` (`accelerate launch --cpu` starts one "
        "process unless given --num_processes)"
    )


def check_simulated_world(rank: int, world_size: int) -> None:
    """Raises :class:`ArgumentTypeError` unless both are integers, and
    :class:`RuntimeSetupError` for a world larger than
    :data:`~meshconf.features.simulation.MAX_SIMULATED_WORLD` or a rank outside it."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise argument_type_error(name, "an integer", value)
    try:
        check_world_size(
            world_size, instead="the config's layouts (MeshConfig.layout) answer for any world size"
        )
    except MeshconfError as error:
        raise RuntimeSetupError(str(error)) from error
    if not 0 <= rank < world_size:
        raise RuntimeSetupError(f"rank {rank} is outside the world [0, {world_size})")
