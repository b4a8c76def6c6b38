"""What a set-up rank answers: its meshes by domain or by dims, each request built once and
kept, the check of its groups against the rank arithmetic, its group counters and timeouts.

:class:`~meshconf.runtime.context.DistributedContext` sets a rank up and tears it down; this
is the part of it a training script calls between the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from meshconf.core.errors import InvalidArgumentError, UnknownDomainError
from meshconf.core.layout import LayoutError
from meshconf.runtime.facts import RankFacts, domain_of
from meshconf.runtime.groups import GroupCounters, GroupRegistry
from meshconf.runtime.meshes import MeshCache
from meshconf.runtime.oracle import expected_groups
from meshconf.runtime.store import RuntimeSetupError


class MeshRequests(RankFacts):
    """The meshes and groups of a rank that is set up (the context's own state)."""

    _registry: GroupRegistry
    _meshes: MeshCache
    _requests: dict[tuple[str, ...], DeviceMesh | None]
    _closed: bool

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has destroyed this context's process groups."""
        return self._closed

    def _check_open(self) -> None:
        """Raises :class:`RuntimeSetupError` once the context is closed: its groups, and the
        default group it initialized, are gone, and torch would only say that no default
        process group exists."""
        if self._closed:
            raise RuntimeSetupError(
                f"rank {self.rank}'s DistributedContext is closed: close() (or the end of its "
                "with block) destroyed its process groups, so it builds no mesh; build a new "
                "DistributedContext"
            )

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

    def _enabled(self, dim: str) -> bool:
        # A dim that stays real at size 1 is a usable mesh at size 1: fully_shard over it works.
        return self.config.dim_sizes[dim] > 1 or self._meshes.must_stay_real(dim)

    @property
    def build_seconds(self) -> float:
        """Seconds this rank spent creating process groups and building domain meshes."""
        return self._meshes.build_seconds

    def mesh_for(self, domain: str) -> DeviceMesh:
        """The DeviceMesh of a domain, dims named as in the config.

        Raises:
            UnknownDomainError: (a KeyError and a ValueError) the config has no such domain.
            RuntimeSetupError: the context is closed.
        """
        self._check_open()
        if domain not in self.config.layouts:
            raise UnknownDomainError(
                f"unknown domain {domain!r}; domains are {', '.join(self.config.layouts)}"
            )
        return self._meshes.domain(domain)

    @property
    def world_mesh(self) -> DeviceMesh:
        """The whole world as a 1-D mesh named ``world``, over the default group.

        Raises:
            RuntimeSetupError: the context is closed.
        """
        self._check_open()
        return self._meshes.world()

    def build_all(self) -> dict[str, DeviceMesh]:
        """Every domain's mesh, in config order (the order an eager build creates them in).

        Raises:
            RuntimeSetupError: the context is closed.
        """
        self._check_open()
        return {domain: self._meshes.domain(domain) for domain in self.config.layouts}

    def named_mesh(
        self,
        dims: Mapping[str, str | Sequence[str]],
        flattened: Mapping[str, Sequence[str]] | None = None,
        *,
        outside: Sequence[str] = (),
    ) -> DeviceMesh:
        """A mesh over meshconf dims under the names another library reads them by, for a
        library that takes a mesh built elsewhere (accelerate, NeMo AutoModel): ``dims`` maps
        each of its names, outer to inner, to a degree or derived dim, or to several, outer
        first, that the one dim joins; ``flattened`` maps the name of each flattened dim it
        reads to the names it joins, as torch's ``DeviceMesh._flatten`` would have made them;
        ``outside``, meshconf dims outside all of those that complete the world, for a mesh
        over part of it (one pipeline stage's ranks: ``outside=["pp"]``). The ranks are
        numbered as the config numbers them (its ``order``, ``levels`` and ``inside`` kept),
        and each group is the one every other mesh of this context with the same ranks uses.
        Built once, kept.

        Raises:
            InvalidArgumentError: (a ValueError) a dim the config does not have, dims (with
                ``outside``) that do not cover the world once, or a flattened dim joining names
                not in ``dims``.
            RuntimeSetupError: the context is closed.
        """
        self._check_open()
        joined = {
            name: (dim,) if isinstance(dim, str) else tuple(dim) for name, dim in dims.items()
        }
        flattened = {} if flattened is None else flattened
        for name, parts in flattened.items():
            unknown = [part for part in parts if part not in dims]
            if unknown or not parts:
                raise InvalidArgumentError(
                    f"flattened dim {name!r} joins {list(parts)}; it may join only the names "
                    f"of dims: {', '.join(dims)}"
                )
        try:
            return self._meshes.named(joined, flattened, tuple(outside))
        except LayoutError as error:
            raise InvalidArgumentError(str(error)) from None

    def get_optional_mesh(self, dims: str | Sequence[str]) -> DeviceMesh | None:
        """The mesh over one dim or several dims of one domain, or None if a dim has size 1.

        ``fsdp`` (and ``efsdp`` when ``ep > 1``) is present even at size 1, so that
        ``fully_shard(model, mesh=ctx.get_mesh("fsdp"))`` runs unchanged on one GPU. The
        answer to each request is kept: asking again costs a dictionary look-up.

        Raises:
            InvalidArgumentError: (a ValueError) an unknown dim, a repeated one, or dims no
                domain has in that order.
            RuntimeSetupError: the context is closed.
        """
        self._check_open()
        request = (dims,) if isinstance(dims, str) else tuple(dims)
        if request not in self._requests:
            domain = domain_of(self.config, list(request))
            enabled = all(self._enabled(name) for name in request)
            self._requests[request] = self._meshes.dims(domain, request) if enabled else None
        return self._requests[request]

    def get_mesh(self, dims: str | Sequence[str]) -> DeviceMesh:
        """Like get_optional_mesh, but a dim of size 1 is an error.

        Raises:
            InvalidArgumentError: (a ValueError) as get_optional_mesh, or a dim of the request
                has size 1.
        """
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
        """Build every domain and compare each dim's process group, and this rank's place in
        it, with the rank arithmetic of the degrees (``oracle.expected_groups``, written apart
        from the layouts the meshes are built from); an empty list is the good answer."""
        problems = []
        meshes = self.build_all()
        # Dims share process groups; a group of a million ranks is read once.
        members: dict[str, torch.Tensor] = {}
        for (domain, dim), group in expected_groups(self.config, self.rank).items():
            mesh = meshes[domain]
            process_group = mesh.get_group(dim)
            if process_group.group_name not in members:
                ranks = dist.get_process_group_ranks(process_group)
                members[process_group.group_name] = torch.tensor(ranks, dtype=torch.int64)
            actual = members[process_group.group_name]
            place = (group == self.rank).nonzero().flatten().tolist()
            if not torch.equal(actual, group) or [mesh.get_local_rank(dim)] != place:
                problems.append(
                    f"{domain}.{dim}: process group has ranks {actual[:8].tolist()}..., "
                    f"the arithmetic of the degrees says {group[:8].tolist()}..."
                )
        return problems
