"""Run a function on N real processes (gloo on CPU), forked, with torchrun-style variables.

The test process itself never creates a process group or runs a collective: every test that
does runs in forked children, so the next fork starts from a clean process. What torch
imports lazily is imported here, before the fork, so that the ranks do not each import it.

Ports: a forked helper process hosts the rendezvous store on a port the kernel picks (port 0)
and keeps it for the whole run, as torchrun's agent does (``TORCHELASTIC_USE_AGENT_STORE=True``),
so no port is probed and then bound by someone else. The store runs in its own process because
its server threads must not exist in the process that forks the ranks (a child forked while
another thread holds a lock inherits the lock held). ``store="absent"`` instead holds a port
that is bound but not listening: nothing answers there, as when rank 0 never started.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

# Imported here, once, before any rank is forked: torch imports torch._dynamo (and sympy
# with it) the first time FSDP2 or DTensor runs, which costs each forked rank about two
# seconds of CPU when the parent has not; imported in the parent, the ranks inherit it.
import torch._dynamo
import torch.distributed as dist
import torch.distributed.tensor  # noqa: F401
import torch.multiprocessing as mp


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
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }


def _host_store(connection: Connection) -> None:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    connection.send(server.port)
    connection.recv()  # serve until the ranks are done


@contextmanager
def _port(store: str) -> Iterator[int]:
    if store == "agent":
        context = mp.get_context("fork")
        ours, theirs = context.Pipe()
        host = context.Process(target=_host_store, args=(theirs,), daemon=True)
        host.start()
        try:
            yield int(ours.recv())
        finally:
            ours.send(None)
            host.join(10)
            if host.is_alive():
                host.kill()
    else:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
            yield int(sock.getsockname()[1])


def _entry(
    rank: int,
    function: Callable[..., None],
    world_size: int,
    local_world_size: int | None,
    port: int,
    store: str,
    stderr_dir: str | None,
    args: tuple[Any, ...],
) -> None:
    import torch

    if stderr_dir is not None:
        # The descriptor itself, so that what torch's C++ code logs is caught too.
        with open(os.path.join(stderr_dir, f"rank{rank}.stderr"), "wb") as file:
            os.dup2(file.fileno(), 2)
    torch.set_num_threads(1)
    env = environ(rank, world_size, port, local_world_size)
    if store == "absent":
        del env["TORCHELASTIC_USE_AGENT_STORE"]
    function(rank, env, *args)


def run_ranks(
    function: Callable[..., None],
    world_size: int,
    *args: Any,
    local_world_size: int | None = None,
    store: str = "agent",
    stderr_dir: str | None = None,
) -> None:
    """Call ``function(rank, environ, *args)`` on ``world_size`` forked processes, which
    the environment says run ``local_world_size`` to a node (default: all on one).

    ``store="agent"``: the rendezvous store runs in this process; ``"absent"``: no store
    answers at MASTER_PORT (rank 0 is expected to host it and is made to stay away).
    ``stderr_dir``: each rank's standard error goes to ``rank<r>.stderr`` there.
    Any assertion that fails on any rank fails the caller with that rank's traceback.
    """
    with _port(store) as port:
        mp.start_processes(
            _entry,
            args=(function, world_size, local_world_size, port, store, stderr_dir, args),
            nprocs=world_size,
            start_method="fork",
        )


def _alone(_: int, function: Callable[..., None], args: tuple[Any, ...]) -> None:
    import torch

    torch.set_num_threads(1)
    function(*args)


def in_child(function: Callable[..., None], *args: Any) -> None:
    """Call ``function(*args)`` in one forked process with no launcher variables."""
    mp.start_processes(_alone, args=(function, args), nprocs=1, start_method="fork")


def assert_domains_hold_their_groups(ctx: Any, rank: int, expected: dict[str, list[int]]) -> None:
    """On one rank of a running world: every domain's mesh covers the world, each dim's process
    group holds the layout's group with this rank at its place, an all-reduce over it sums its
    members, the dims named in ``expected`` have those groups, and the rank arithmetic agrees."""
    import torch

    from meshconf.runtime import all_reduce

    seen = set()
    for domain, mesh in ctx.build_all().items():
        layout = ctx.config.layout(domain)
        assert mesh.mesh_dim_names == layout.dim_names
        assert mesh.mesh.flatten().sort().values.tolist() == list(range(ctx.world_size))
        for dim in layout.dims:
            group = layout.group(rank, dim.name).ranks()
            if dim.name in expected:
                assert group == expected[dim.name], (domain, dim.name, group)
                seen.add(dim.name)
            assert dist.get_process_group_ranks(mesh.get_group(dim.name)) == group
            assert mesh.get_local_rank(dim.name) == group.index(rank)
            if dim.size > 1:
                total = all_reduce(torch.tensor([float(rank)]), "sum", ctx.get_mesh(dim.name))
                assert total.item() == sum(group), (domain, dim.name)
    assert seen == set(expected)
    assert ctx.mismatched_groups() == []


@dataclass
class Ending:
    """How one rank of :func:`run_ranks_apart` ended: the meshconf error it raised (its class
    name and message), ``ok``, or ``died``; and when, in seconds after it started."""

    how: str
    message: str
    seconds: float


def _report(
    rank: int,
    function: Callable[..., None],
    env: dict[str, str],
    args: tuple[Any, ...],
    results: Connection,
) -> None:
    import time

    import torch

    from meshconf import MeshconfError

    torch.set_num_threads(1)
    start = time.monotonic()
    try:
        function(rank, env, *args)
        ending = Ending("ok", "", time.monotonic() - start)
    except MeshconfError as error:
        ending = Ending(type(error).__name__, str(error), time.monotonic() - start)
    except BaseException as error:  # anything else is what the tests look for
        ending = Ending(f"not meshconf's: {type(error).__name__}", str(error)[:500], 0.0)
    results.send((rank, ending))
    os._exit(0)  # leave without tearing down what the function left behind


def run_ranks_apart(
    function: Callable[..., None],
    world_size: int,
    *args: Any,
    store: str = "agent",
    during: Callable[[Callable[[], None]], None] | None = None,
    wait_s: float = 60,
) -> dict[int, Ending]:
    """Call ``function(rank, environ, *args)`` on ``world_size`` forked processes and report
    how each ended, whatever the others do: a rank may die, hang or fail alone.

    ``store="agent"``: a helper process hosts the store, as torchrun's agent does;
    ``"rank0"``: rank 0 hosts it at a free port. ``during(stop_store)`` runs in this process
    once the ranks started; ``stop_store()`` ends the agent's store. A rank that has not ended
    after ``wait_s`` is killed and reported as ``died``.
    """
    context = mp.get_context("fork")
    ours, theirs = context.Pipe(duplex=False)
    with contextlib.ExitStack() as stack:
        if store == "agent":
            port, stop = stack.enter_context(_stoppable_agent())
        else:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            stop = None
        processes = []
        for rank in range(world_size):
            env = environ(rank, world_size, port)
            if store != "agent":
                del env["TORCHELASTIC_USE_AGENT_STORE"]
            process = context.Process(target=_report, args=(rank, function, env, args, theirs))
            process.start()
            processes.append(process)
        if during is not None:
            during(stop or (lambda: None))
        endings: dict[int, Ending] = {}
        for process in processes:
            process.join(wait_s)
        while ours.poll():
            rank, ending = ours.recv()
            endings[rank] = ending
        for rank, process in enumerate(processes):
            if process.is_alive():
                process.kill()
                process.join()
            endings.setdefault(rank, Ending("died", "", 0.0))
    return endings


@contextmanager
def _stoppable_agent() -> Iterator[tuple[int, Callable[[], None]]]:
    context = mp.get_context("fork")
    ours, theirs = context.Pipe()
    host = context.Process(target=_host_store, args=(theirs,), daemon=True)
    host.start()

    def stop() -> None:
        host.kill()
        host.join()

    try:
        yield int(ours.recv()), stop
    finally:
        stop()
