"""``DistributedContext``: a validated MeshConfig turned into this rank's DeviceMeshes.

The same code runs on one CPU process with no launcher, under torchrun or SLURM on GPUs,
and in one process against torch's fake process group for any world size (``simulate``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from meshconf.core.errors import InvalidArgumentError, MeshconfError, UnknownDomainError, format_key
from meshconf.core.layout import DimLayout, DomainLayout
from meshconf.features.topology import topology_warnings
from meshconf.model.config import MeshConfig
from meshconf.runtime.groups import GroupCounters, GroupRegistry
from meshconf.runtime.launch import Launch, LaunchError, read_launch
from meshconf.sources.loading import at_world_size, load_config

_SHORT_NAMES = {"dp_replicate": "dpr", "dp_shard": "dps"}


class RuntimeSetupError(MeshconfError):
    """The process group or device cannot be set up as the config asks."""


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


def _register_fake_backend() -> None:
    # Importing this module registers torch's "fake" backend (no communication), which
    # meshconf uses for size-1 dims and for simulated worlds.
    import torch.testing._internal.distributed.fake_pg  # noqa: F401


def _pick_device(requested: str, launch: Launch) -> torch.device:
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


def _pick_backend(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    return "nccl" if device.type == "cuda" else "gloo"


def _rank_grid(layout: DomainLayout) -> torch.Tensor:
    """The domain's ranks as an N-D tensor: entry ``[c0, c1, ...]`` is ``rank_at(c)``."""
    grid = torch.zeros((), dtype=torch.int64)
    for axis, dim in enumerate(layout.dims):
        remaining = torch.arange(dim.size, dtype=torch.int64)
        offsets = torch.zeros(dim.size, dtype=torch.int64)
        for mode in reversed(dim.modes):
            offsets += remaining % mode.size * mode.stride
            remaining = remaining // mode.size
        shape = [1] * len(layout.dims)
        shape[axis] = dim.size
        grid = grid + offsets.reshape(shape)
    return grid.to(torch.int)


def _layout_mesh(
    domain: str,
    dims: Sequence[DimLayout],
    world_size: int,
    groups: list[dist.ProcessGroup],
    device_type: str,
) -> DeviceMesh:
    """A mesh over ``dims`` that is not the world reshaped, as torch's own ``_unflatten``
    and ``_flatten`` would describe it: a layout over the ranks in order, a dim's modes nested.

    A mesh tensor would do for the mesh alone, but its flattening would become the mesh's
    rank map, and torch only concatenates meshes (FSDP over ``fsdp`` with TP over ``tp``) or
    lets their DTensors meet when the rank maps agree; those of every other mesh are the
    ranks in order. torch has no public constructor for this, so this is the private one
    that ``DeviceMesh.from_group`` uses.
    """
    try:
        from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout

        axes = [
            _FlatLayout(
                tuple(mode.size for mode in dim.modes), tuple(mode.stride for mode in dim.modes)
            )
            for dim in dims
        ]
        mesh = DeviceMesh(
            device_type,
            _layout=_MeshLayout(axes),
            _rank_map=torch.arange(world_size, dtype=torch.int),
            mesh_dim_names=tuple(dim.name for dim in dims),
            _init_backend=False,
        )
    except (ImportError, TypeError) as error:
        raise RuntimeSetupError(
            f"domain {domain!r} places dims partly inside and partly across nodes, which "
            f"needs the layout-based DeviceMesh of torch 2.10 or later (torch {torch.__version__}: "
            f"{error})"
        ) from None
    mesh._dim_group_names = [group.group_name for group in groups]
    for group in groups:
        mesh._pg_registry[group.group_name] = group
    return mesh


class DistributedContext:
    """This rank's view of a mesh config: launcher facts, devices and lazily built meshes.

    >>> ctx = DistributedContext.from_yaml("examples/single_gpu.yaml")  # doctest: +SKIP
    >>> dense = ctx.mesh_for("dense")  # doctest: +SKIP
    """

    config: MeshConfig
    launch: Launch
    device: torch.device
    backend: str
    build_seconds: float
    #: Where the groups sit badly on nodes (``meshconf show``'s warnings, for the node size
    #: in the config or else the launcher's LOCAL_WORLD_SIZE); rank 0 also warns with them.
    topology_warnings: list[str]

    def __init__(self, config: MeshConfig, *, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        launch = read_launch(environ)
        if config.gpus_per_node is None and launch.local_world_size is not None:
            config = config.model_copy(update={"gpus_per_node": launch.local_world_size})
        device = _pick_device(config.runtime.device, launch)
        backend = _pick_backend(config.runtime.backend, device)
        timeout = timedelta(seconds=config.runtime.timeout_s)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's lazy init then picks this rank's GPU
        owns_default_group = not dist.is_initialized()
        if owns_default_group:
            _init_default_group(launch, environ, backend, device, timeout)
        elif getattr(dist.distributed_c10d._get_default_group(), "bound_device_id", None):
            raise RuntimeSetupError(
                "the default process group was initialized with device_id, so torch would create "
                "every subgroup by a split that all ranks must join; initialize it without "
                "device_id (call torch.cuda.set_device instead) or let meshconf initialize it"
            )
        elif dist.get_world_size() != launch.world_size and launch.source != "none":
            raise LaunchError(
                f"the default process group has {dist.get_world_size()} ranks but "
                f"{launch.source} says {launch.world_size}"
            )
        if launch.source == "none":
            launch = Launch(
                dist.get_rank(),
                dist.get_world_size(),
                dist.get_rank(),
                dist.get_world_size(),
                "none",
            )
        try:
            self._setup(config, launch, device, backend, owns_default_group)
            if launch.world_size > 1:
                self._check_same_config()
        except BaseException:
            if owns_default_group:
                dist.destroy_process_group()
            raise
        if self.is_main_process:
            for message in self.topology_warnings:
                warnings.warn(message, TopologyWarning, stacklevel=_caller_stacklevel())

    @classmethod
    def from_yaml(
        cls,
        path: str | os.PathLike[str],
        overrides: Sequence[str] = (),
        key: str | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> DistributedContext:
        """Load, validate and set up in one call (``overrides`` and ``key`` as in load_config)."""
        return cls(load_config(path, overrides, key), environ=environ)

    @classmethod
    def simulate(
        cls, config: MeshConfig, *, rank: int, world_size: int, device_type: str = "cpu"
    ) -> DistributedContext:
        """Build rank ``rank``'s meshes of a ``world_size`` world in this one process.

        The default process group and every group are torch's fake backend: nothing
        communicates, but every group, mesh and counter is what a real run would create.
        Needs a process with no default process group; call ``close()`` afterwards.
        """
        if dist.is_initialized():
            raise RuntimeSetupError("simulate needs a process without a default process group")
        if not 0 <= rank < world_size:
            raise RuntimeSetupError(f"rank {rank} is outside the world [0, {world_size})")
        _register_fake_backend()
        from torch.testing._internal.distributed.fake_pg import FakeStore

        config = at_world_size(config, world_size)
        dist.init_process_group("fake", rank=rank, world_size=world_size, store=FakeStore())
        context = cls.__new__(cls)
        launch = Launch(rank, world_size, 0, config.gpus_per_node or world_size, "simulated")
        context._setup(config, launch, torch.device(device_type), "fake", owns_default_group=True)
        return context

    def _setup(
        self,
        config: MeshConfig,
        launch: Launch,
        device: torch.device,
        backend: str,
        owns_default_group: bool,
    ) -> None:
        if config.world_size is not None and config.world_size != launch.world_size:
            raise LaunchError(
                f"world_size: the config says {config.world_size}, but {launch.source} started "
                f"{launch.world_size} ranks"
            )
        self.config = at_world_size(config, launch.world_size)
        self.launch = launch
        self.device = device
        self.backend = backend
        self.build_seconds = 0.0
        self._owns_default_group = owns_default_group
        self._closed = False
        self._meshes: dict[str, DeviceMesh] = {}
        self._world_mesh: DeviceMesh | None = None
        self._unsorted_submeshes: dict[tuple[str, tuple[str, ...]], DeviceMesh] = {}
        self._registry = GroupRegistry(
            launch.world_size, backend, timedelta(seconds=self.config.runtime.timeout_s)
        )
        self.topology_warnings = _node_warnings(self.config, launch)
        _register_fake_backend()

    def _check_same_config(self) -> None:
        """Every rank must have loaded the same resolved config: compare fingerprints."""
        value = int.from_bytes(hashlib.sha256(self.config.fingerprint.encode()).digest()[:7], "big")
        both = torch.tensor([value, -value], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        if both[0].item() != -both[1].item():
            raise RuntimeSetupError(
                f"rank {self.rank}: the ranks loaded different configs (this rank's fingerprint "
                f"is {self.config.fingerprint[:12]}); every rank must read the same file with "
                "the same overrides"
            )

    # Launcher facts ------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.launch.rank

    @property
    def world_size(self) -> int:
        return self.launch.world_size

    @property
    def local_rank(self) -> int:
        return self.launch.local_rank

    @property
    def local_world_size(self) -> int | None:
        """Ranks on this node, when the launcher says (torchrun always does)."""
        return self.launch.local_world_size

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        """Local rank 0: the first process on this node."""
        return self.local_rank == 0

    @property
    def current_device(self) -> torch.device:
        """The device this rank computes on (d9d's name for ``device``)."""
        return self.device

    @property
    def node_rank(self) -> int | None:
        """This rank's node, when the launcher says how many ranks a node runs."""
        local = self.local_world_size
        return None if local is None else self.rank // local

    @property
    def num_nodes(self) -> int | None:
        """How many nodes the world spans, when the launcher says how many ranks a node runs."""
        local = self.local_world_size
        return None if local is None else -(-self.world_size // local)

    # Synchronisation -------------------------------------------------------------------

    def wait_world(self) -> None:
        """Block until every rank of the world gets here (a barrier on the default group)."""
        if self.device.type == "cuda" and self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index or 0])
        else:
            dist.barrier()

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the block on rank 0 first and on the other ranks after it (say, to download
        or preprocess once and read the result everywhere)."""
        with self._first(self.is_main_process):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the block on each node's local rank 0 first and on the other ranks after."""
        with self._first(self.is_local_main_process):
            yield

    @contextmanager
    def _first(self, goes_first: bool) -> Iterator[None]:
        if not goes_first:
            self.wait_world()
        try:
            yield
        finally:
            if goes_first:
                self.wait_world()

    def set_timeout(self, seconds: float) -> None:
        """Change the timeout of the default group and of every process group this context
        created, and of those it creates from now on (``runtime.timeout_s`` sets the first)."""
        if isinstance(seconds, bool) or not seconds > 0:
            raise InvalidArgumentError(
                f"a timeout must be a positive number of seconds, got {seconds!r}"
            )
        self._registry.set_timeout(timedelta(seconds=seconds))

    @property
    def counters(self) -> GroupCounters:
        """Process groups this rank created or reused so far."""
        return self._registry.counters

    # Meshes ----------------------------------------------------------------------------

    def _must_stay_real(self, dim: str) -> bool:
        # FSDP's mixed precision needs a real group even over one rank.
        return dim == "fsdp" or (dim == "efsdp" and self.config.resolved_degrees["ep"] > 1)

    def _enabled(self, dim: str) -> bool:
        # A dim that stays real at size 1 is a usable mesh at size 1: fully_shard over it works.
        return self.config.dim_sizes[dim] > 1 or self._must_stay_real(dim)

    def mesh_for(self, domain: str) -> DeviceMesh:
        """The DeviceMesh of a domain, dims named as in the config; built on first use."""
        mesh = self._meshes.get(domain)
        if mesh is not None:
            return mesh
        layouts = self.config.layouts
        if domain not in layouts:
            raise UnknownDomainError(f"unknown domain {domain!r}; domains are {', '.join(layouts)}")
        start = time.perf_counter()
        layout = layouts[domain]
        groups = [
            self._registry.get(
                layout.group(self.rank, dim.name),
                real=self._must_stay_real(dim.name),
                description=f"meshconf:{domain}.{dim.name}",
            )
            for dim in layout.dims
        ]
        if layout.is_row_major:
            mesh = DeviceMesh.from_group(
                groups, self.device.type, mesh=_rank_grid(layout), mesh_dim_names=layout.dim_names
            )
        else:
            mesh = _layout_mesh(
                layout.name, layout.dims, layout.world_size, groups, self.device.type
            )
        self.build_seconds += time.perf_counter() - start
        self._meshes[domain] = mesh
        return mesh

    @property
    def world_mesh(self) -> DeviceMesh:
        """The whole world as a 1-D mesh named ``world``, over the default group."""
        if self._world_mesh is None:
            world = dist.group.WORLD
            assert world is not None
            self._world_mesh = DeviceMesh.from_group(
                world, self.device.type, mesh_dim_names=("world",)
            )
        return self._world_mesh

    def build_all(self) -> dict[str, DeviceMesh]:
        """Every domain's mesh, in config order."""
        return {domain: self.mesh_for(domain) for domain in self.config.layouts}

    def _domain_of(self, names: list[str]) -> str:
        layouts = self.config.layouts
        known = list(dict.fromkeys(dim for layout in layouts.values() for dim in layout.dim_names))
        unknown = [name for name in names if name not in known]
        if unknown:
            raise InvalidArgumentError(
                f"unknown mesh dim {unknown[0]!r}; valid dims are {', '.join(known)}"
            )
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"mesh dims {names} repeat a name")
        unordered = None
        for domain, layout in layouts.items():
            if not set(names) <= set(layout.dim_names):
                continue
            in_order = [dim for dim in layout.dim_names if dim in names]
            if in_order == names:
                return domain
            unordered = unordered or (domain, in_order)
        if unordered is not None:
            raise InvalidArgumentError(
                f"mesh dims {names} are all in domain {unordered[0]!r} but in another order; "
                f"ask for {unordered[1]}"
            )
        summary = "; ".join(f"{d} {list(layout.dim_names)}" for d, layout in layouts.items())
        raise InvalidArgumentError(f"no domain has all of {names}; the domains are {summary}")

    def get_optional_mesh(self, dims: str | Sequence[str]) -> DeviceMesh | None:
        """The mesh over one dim or several dims of one domain, or None if a dim has size 1.

        ``fsdp`` (and ``efsdp`` when ``ep > 1``) is present even at size 1, so that
        ``fully_shard(model, mesh=ctx.get_mesh("fsdp"))`` runs unchanged on one GPU."""
        names = [dims] if isinstance(dims, str) else list(dims)
        domain = self._domain_of(names)
        if not all(self._enabled(name) for name in names):
            return None
        return self._mesh_over(domain, names)

    def _mesh_over(self, domain: str, names: list[str]) -> DeviceMesh:
        """The mesh over dims of ``domain``, whatever their sizes."""
        mesh = self.mesh_for(domain)
        if len(names) == 1:
            return mesh[names[0]]
        layout = self.config.layout(domain)
        strides = [
            mode.stride for name in names for mode in layout.dim(name).modes if mode.size > 1
        ]
        if strides == sorted(strides, reverse=True):
            return mesh[tuple(names)]
        # torch slices only dims whose ranks step down in stride from dim to dim (replicas
        # inside a node and shards across nodes do not); such a mesh is built on its own,
        # over the same groups and rank map.
        key = (domain, tuple(names))
        submesh = self._unsorted_submeshes.get(key)
        if submesh is None:
            submesh = _layout_mesh(
                layout.name,
                [layout.dim(name) for name in names],
                layout.world_size,
                [mesh.get_group(name) for name in names],
                self.device.type,
            )
            self._unsorted_submeshes[key] = submesh
        return submesh

    def get_mesh(self, dims: str | Sequence[str]) -> DeviceMesh:
        """Like get_optional_mesh, but a dim of size 1 is a ValueError."""
        mesh = self.get_optional_mesh(dims)
        if mesh is None:
            names = [dims] if isinstance(dims, str) else list(dims)
            off = [f"{n}={self.config.dim_sizes[n]}" for n in names if not self._enabled(n)]
            raise InvalidArgumentError(
                f"mesh {names} is not enabled: {', '.join(off)}; use get_optional_mesh to get "
                "None instead"
            )
        return mesh

    def mismatched_groups(self) -> list[str]:
        """Build every domain and compare each dim's process group with the layout math;
        one line per dim whose group holds other ranks (an empty list is the good answer)."""
        problems = []
        for domain, mesh in self.build_all().items():
            layout = self.config.layout(domain)
            for dim in layout.dims:
                expected = sorted(layout.group(self.rank, dim.name))
                actual = dist.get_process_group_ranks(mesh.get_group(dim.name))
                if actual != expected or mesh.get_local_rank(dim.name) != expected.index(self.rank):
                    problems.append(
                        f"{domain}.{dim.name}: process group has ranks {actual[:8]}..., "
                        f"the layout says {expected[:8]}..."
                    )
        return problems

    # Coordinates, logging, seeds --------------------------------------------------------

    def coordinate(self, domain: str) -> dict[str, int]:
        """This rank's index along every dim of a domain (from the layout; no torch call)."""
        return self.config.layout(domain).coordinate(self.rank)

    @property
    def log_prefix(self) -> str:
        """``[pp0 dpr1 fsdp0 tp3]``: this rank's coordinate along the dense dims of size > 1."""
        layouts = self.config.layouts
        layout = layouts.get("dense") or next(iter(layouts.values()))
        coordinate = layout.coordinate(self.rank)
        parts = [
            f"{_SHORT_NAMES.get(dim.name, dim.name)}{coordinate[dim.name]}"
            for dim in layout.dims
            if dim.size > 1
        ]
        return "[" + (" ".join(parts) or f"rank{self.rank}") + "]"

    def seed(self, base_seed: int, vary_along: Sequence[str] = ()) -> int:
        """A seed equal on ranks that share coordinates along ``vary_along`` and different
        otherwise: ``torch.manual_seed(ctx.seed(42, vary_along=["pp"]))``."""
        offset, scale = 0, 1
        for name in vary_along:
            layout = self.config.layout(self._domain_of([name]))
            offset += layout.coordinate(self.rank)[name] * scale
            scale *= layout.dim(name).size
        return base_seed + offset

    # Teardown ---------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy the groups this context created, each once, and the default group if
        this context initialized it. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._meshes.clear()
        self._world_mesh = None
        self._unsorted_submeshes.clear()
        self._registry.destroy()
        if self._owns_default_group and dist.is_initialized():
            dist.destroy_process_group()

    def __enter__(self) -> DistributedContext:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DistributedContext(rank={self.rank}, world_size={self.world_size}, "
            f"device={self.device}, backend={self.backend!r}, domains={list(self.config.layouts)})"
        )


def _node_warnings(config: MeshConfig, launch: Launch) -> list[str]:
    """``show``'s topology warnings for the node size in use, and a launcher that runs
    another number of ranks per node than the config places groups on."""
    gpus_per_node = config.gpus_per_node
    if gpus_per_node is None:
        return []
    messages = []
    if launch.source != "none" and launch.local_world_size not in (None, gpus_per_node):
        messages.append(
            f"gpus_per_node: the config places groups on nodes of {gpus_per_node} ranks, but "
            f"{launch.source} runs {launch.local_world_size} on this node, so the groups do not "
            "sit where the config says (they still work); set gpus_per_node to "
            f"{launch.local_world_size} or start {gpus_per_node} ranks per node"
        )
    problems = topology_warnings(config, gpus_per_node)
    return messages + [f"{format_key(problem.path)}: {problem.message}" for problem in problems]


def _init_default_group(
    launch: Launch,
    environ: Mapping[str, str],
    backend: str,
    device: torch.device,
    timeout: timedelta,
) -> None:
    # No device_id: a device-bound NCCL default group makes torch create every subgroup by
    # ncclCommSplit, which all ranks must join, defeating member-only group creation.
    options: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if launch.source == "none":
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(store=store, rank=0, world_size=1, **options)
        return
    address, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    if not address or not port:
        raise LaunchError(
            f"{launch.source} gave rank {launch.rank} of {launch.world_size}, but MASTER_ADDR "
            "and MASTER_PORT are not set (torchrun sets them; under SLURM, export them)"
        )
    try:
        dist.init_process_group(
            init_method=f"tcp://{address}:{port}",
            rank=launch.rank,
            world_size=launch.world_size,
            **options,
        )
    except (RuntimeError, dist.DistError) as error:
        raise RuntimeSetupError(
            f"rank {launch.rank}: could not join the {launch.world_size}-rank world at "
            f"{address}:{port} (runtime.timeout_s is {timeout.total_seconds():g} s): "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}; did every "
            "rank start?"
        ) from None
