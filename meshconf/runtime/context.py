"""``DistributedContext``: a validated MeshConfig turned into this rank's DeviceMeshes.

The same code runs on one CPU process with no launcher, under torchrun or SLURM on GPUs,
and in one process against torch's fake process group for any world size (``simulate``).
Set-up (joining the world, the config check across ranks, group creation) is bounded by
``runtime.setup_timeout_s``; a rank that fails in it tells every other rank why
(rendezvous.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from types import TracebackType

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

# Importing fake_pg registers torch's "fake" backend (no communication), which meshconf uses
# for size-1 dims and for simulated worlds.
from torch.testing._internal.distributed.fake_pg import FakeStore

from meshconf.core.errors import MeshconfError
from meshconf.core.levels import NODE, environment_name
from meshconf.core.messages import first_line
from meshconf.model.config import MeshConfig
from meshconf.runtime.groups import GroupRegistry
from meshconf.runtime.inputs import (
    check_config,
    check_launched_world,
    check_simulated_world,
    environment,
    launch_of,
)
from meshconf.runtime.launch import Launch
from meshconf.runtime.meshes import MeshCache
from meshconf.runtime.order import CreationOrderError, CreationWatch
from meshconf.runtime.placement import check_placement, publish_units
from meshconf.runtime.rendezvous import (
    RankFailedError,
    RankReasonError,
    Rendezvous,
    join,
    publish_failure,
)
from meshconf.runtime.requests import MeshRequests
from meshconf.runtime.setup import (
    check_existing_default_group,
    init_default_group,
    node_warnings,
    pick_backend,
    pick_device,
    warn_topology,
)
from meshconf.runtime.store import RuntimeSetupError, SetupTimeoutError, StoreGoneError
from meshconf.sources.loading import at_world_size, load_config

#: The closing barrier of every closed context, kept until the interpreter exits. gloo's worker
#: thread lets go of a finished collective a moment after the caller sees it finish; if its
#: reference is the last one and the interpreter is already shutting down, freeing the work's
#: tensors needs the GIL and the process aborts ("terminate called without an active
#: exception"). A reference held here frees the work on the main thread, at exit.
_LAST_BARRIERS: list[dist.Work] = []
# Errors every rank already knows about (published, or each rank's own timeout).
_ALREADY_KNOWN = (
    RankFailedError,
    SetupTimeoutError,
    CreationOrderError,
    StoreGoneError,
    KeyboardInterrupt,
)


def _told(error: MeshconfError) -> MeshconfError:
    """``error`` without the frames meshconf raised it through: its message says all it
    knows, and on every rank of a failed start the traceback is then the user's line and
    the call that failed, a few lines a rank. This rank's own reason is a
    ``RuntimeSetupError``, as documented (``RankReasonError`` only marks it for publishing)."""
    if type(error) is RankReasonError:
        return RuntimeSetupError(str(error))
    return error.with_traceback(None)


class DistributedContext(MeshRequests):
    """This rank's view of a mesh config: launcher facts, device and meshes.

    >>> ctx = DistributedContext.from_yaml("examples/single_gpu.yaml")  # doctest: +SKIP
    >>> dense = ctx.mesh_for("dense")  # doctest: +SKIP
    """

    #: Where the groups sit badly on nodes (``meshconf show``'s warnings, for the node size
    #: in the config or else the launcher's LOCAL_WORLD_SIZE); rank 0 also warns with them.
    topology_warnings: list[str]
    _rendezvous: Rendezvous | None

    def __init__(self, config: MeshConfig, *, environ: Mapping[str, str] | None = None) -> None:
        """Join the world, check that every rank has the same config and, with
        ``runtime.build: eager`` (the default), create every domain's groups.

        Raises:
            MeshconfError: the launcher's environment is incomplete or disagrees with the config.
            RuntimeSetupError: this rank could not set up; ``RankFailedError`` when another
                rank failed (its reason is the message), ``SetupTimeoutError`` when ranks did
                not arrive within ``runtime.setup_timeout_s`` (they are named).
            ConfigError: the config does not fit the launcher's world size.
        """
        check_config(config)
        environ = environment(environ)
        launch = launch_of(environ)
        self._open(config, launch, environ)

    @classmethod
    def from_yaml(
        cls,
        path: str | os.PathLike[str],
        overrides: Sequence[str] = (),
        key: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> DistributedContext:
        """Load, validate and set up in one call (``overrides`` and ``key`` as in load_config).

        A rank that cannot load the config tells the other ranks why, so that they fail
        with its reason instead of waiting for it.

        Raises:
            ConfigError: on the rank whose config is invalid.
            MeshconfError, RuntimeSetupError: as the constructor.
        """
        environ = environment(environ)
        launch = launch_of(environ)
        try:
            config = load_config(path, overrides, key)
        except MeshconfError as error:
            # This rank's own bound is in the config it could not read: it keeps the store
            # (if it hosts it) as long as the other ranks' bounds.
            rendezvous = join(
                launch, environ, MeshConfig().runtime.setup_timeout_s, bound_known=False
            )
            if rendezvous is not None:
                rendezvous.publish(f"rank {launch.rank} could not load the config: {error}")
            raise _told(error) from None
        context = cls.__new__(cls)
        context._open(config, launch, environ)
        return context

    def _open(self, config: MeshConfig, launch: Launch, environ: Mapping[str, str]) -> None:
        rendezvous = join(launch, environ, config.runtime.setup_timeout_s)
        owns_default_group = not dist.is_initialized()
        try:
            self._start(config, launch, rendezvous, owns_default_group, environ)
        except BaseException as error:
            try:
                if rendezvous is not None and not isinstance(error, _ALREADY_KNOWN):
                    publish_failure(rendezvous, launch.rank, error)
            finally:
                registry: GroupRegistry | None = getattr(self, "_registry", None)
                if registry is not None:
                    registry.destroy()
                if owns_default_group and dist.is_initialized():
                    dist.destroy_process_group()
            if isinstance(error, MeshconfError):
                raise _told(error) from None
            raise
        if self.is_main_process:
            warn_topology(self.topology_warnings)

    def _start(
        self,
        config: MeshConfig,
        launch: Launch,
        rendezvous: Rendezvous | None,
        owns_default_group: bool,
        environ: Mapping[str, str],
    ) -> None:
        # Levels say where nodes are themselves, or leave them out on purpose.
        from_launcher = config.levels is None and config.gpus_per_node is None
        if from_launcher and launch.local_world_size:
            config = config.model_copy(update={"gpus_per_node": launch.local_world_size})
        device = pick_device(config.runtime.device, launch)
        backend = pick_backend(config.runtime.backend, device)
        setup_timeout = timedelta(seconds=config.runtime.setup_timeout_s)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's lazy init then picks this rank's GPU
        if not owns_default_group:
            check_existing_default_group(launch)
            if launch.source == "none":
                rank, size = dist.get_rank(), dist.get_world_size()
                launch = Launch(rank, size, rank, size, "none")
        check_launched_world(config, launch)
        self._prepare(config, launch, device, backend, owns_default_group)
        self.topology_warnings = node_warnings(
            self.config,
            launch,
            node_from_launcher=from_launcher,
            node_named=environment_name(NODE) in environ,
        )
        self._rendezvous = rendezvous
        if rendezvous is not None:
            self._check_same_config(rendezvous, environ)
        if owns_default_group:
            store = None if rendezvous is None else rendezvous.root_store
            init_default_group(launch, store, backend, setup_timeout)
        self._registry.creation_timeout = setup_timeout
        lazy = self.config.runtime.build == "lazy"
        if rendezvous is not None:
            self._registry.check = CreationWatch(rendezvous, same_order=lazy)
        if not lazy:
            self._create_every_group()
        if rendezvous is not None:
            rendezvous.phase("built")
        # A default group the script initialized keeps its own timeout.
        timeout = timedelta(seconds=self.config.runtime.timeout_s)
        self._registry.set_timeout(timeout, default_group=owns_default_group)

    @classmethod
    def simulate(
        cls, config: MeshConfig, *, rank: int, world_size: int, device_type: str = "cpu"
    ) -> DistributedContext:
        """Build rank ``rank``'s meshes of a ``world_size`` world in this one process.

        The default process group and every group are torch's fake backend: nothing
        communicates, but every group, mesh and counter is what a real run would create.
        Every domain is built, whatever ``runtime.build`` says. Needs a process with no
        default process group; call ``close()`` afterwards.

        Raises:
            RuntimeSetupError: a default group exists, ``rank`` is outside the world, or the
                world is larger than :data:`~meshconf.features.simulation.MAX_SIMULATED_WORLD`.
            ConfigError: the config does not fit ``world_size``.
        """
        check_config(config)
        check_simulated_world(rank, world_size)
        if dist.is_initialized():
            raise RuntimeSetupError("simulate needs a process without a default process group")
        config = at_world_size(config, world_size)
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
        context = cls.__new__(cls)
        launch = Launch(rank, world_size, 0, config.gpus_per_node or world_size, "simulated")
        context._prepare(config, launch, torch.device(device_type), "fake", True)
        context._create_every_group()
        return context

    def _create_every_group(self) -> None:
        # Domains in config order, dims outer to inner: one order on every rank. The meshes
        # themselves create no group, so they are built when asked for.
        for domain in self.config.layouts:
            self._meshes.groups(domain)

    def _prepare(
        self,
        config: MeshConfig,
        launch: Launch,
        device: torch.device,
        backend: str,
        owns_default_group: bool,
    ) -> None:
        self.config = at_world_size(config, launch.world_size)
        self.launch = launch
        self.device = device
        self.backend = backend
        self._owns_default_group = owns_default_group
        self._rendezvous = None
        self._closed = False
        self._registry = GroupRegistry(
            launch.world_size, backend, timedelta(seconds=self.config.runtime.timeout_s)
        )
        self._meshes = MeshCache(self.config, launch.rank, device.type, self._registry)
        self._requests: dict[tuple[str, ...], DeviceMesh | None] = {}
        self.topology_warnings = []

    def _check_same_config(self, rendezvous: Rendezvous, environ: Mapping[str, str]) -> None:
        """Every rank must have loaded the same resolved config: each compares its
        fingerprint with rank 0's, through the store, before any process group exists. With
        ``inside``, each publishes where it is and checks its kept groups (:mod:`.placement`)."""
        mine = self.config.fingerprint
        if self.config.inside:
            self.topology_warnings += publish_units(self.config, rendezvous, environ, self.device)
        rendezvous.phase("joined", mine)
        theirs = rendezvous.store.get("joined/0").decode()
        if theirs != mine:
            raise RankReasonError(
                f"rank {self.rank} loaded another config than rank 0 (fingerprints "
                f"{mine[:12]} and {theirs[:12]}); every rank must read the same file with the "
                "same overrides"
            )
        if self.config.inside:
            warn_topology(check_placement(self.config, rendezvous))
        rendezvous.phase("checked")

    def close(self) -> None:
        """Wait for every rank, then destroy the groups this context created, each once, and
        the default group if this context initialized it. Safe to call twice.

        The wait keeps a rank from closing connections that another rank's last collectives
        still use (gloo aborts that rank's process). Leaving a ``with`` block by an exception
        skips it, and so does a set-up that failed (a mesh asked for lazily that could not be
        built), since the other ranks may never arrive.

        Raises:
            RuntimeSetupError: a rank stopped before it came to close (the groups of this
                rank are destroyed all the same).
        """
        self._close(wait=True)

    def _close(self, *, wait: bool) -> None:
        if self._closed:
            return
        self._closed = True
        failed = self._rendezvous is not None and self._rendezvous.failed
        stopped = None
        if wait and not failed and self.world_size > 1 and dist.is_initialized():
            last = self._barrier()
            try:
                last.wait()
            except (RuntimeError, dist.DistError) as error:
                stopped = first_line(error)
            else:
                _LAST_BARRIERS.append(last)
                if self._rendezvous is not None:
                    self._rendezvous.closed()
        self._requests.clear()
        self._meshes.clear()
        self._registry.destroy()
        if self._owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
        if stopped is not None:
            raise RuntimeSetupError(
                f"rank {self.rank} closed its process groups, but not every rank came to "
                f"close them: a rank stopped ({stopped})"
            )

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._close(wait=exc is None)

    def __repr__(self) -> str:
        return (
            f"DistributedContext(rank={self.rank}, world_size={self.world_size}, "
            f"device={self.device}, backend={self.backend!r}, domains={list(self.config.layouts)})"
        )
