"""Run a function on N real processes (gloo on CPU), forked, with torchrun-style variables."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environ(
    rank: int, world_size: int, port: int, local_world_size: int | None = None
) -> dict[str, str]:
    local = local_world_size or world_size
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % local),
        "LOCAL_WORLD_SIZE": str(local),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _entry(
    rank: int,
    function: Callable[..., None],
    world_size: int,
    local_world_size: int | None,
    port: int,
    args: tuple[Any, ...],
) -> None:
    import torch

    torch.set_num_threads(1)
    function(rank, environ(rank, world_size, port, local_world_size), *args)


def run_ranks(
    function: Callable[..., None],
    world_size: int,
    *args: Any,
    local_world_size: int | None = None,
) -> None:
    """Call ``function(rank, environ, *args)`` on ``world_size`` forked processes, which
    the environment says run ``local_world_size`` to a node (default: all on one).

    Any assertion that fails on any rank fails the caller with that rank's traceback.
    """
    mp.start_processes(
        _entry,
        args=(function, world_size, local_world_size, free_port(), args),
        nprocs=world_size,
        start_method="fork",
    )
