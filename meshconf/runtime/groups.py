"""One process group per distinct group of ranks, created on first request.

Keys are canonical: the set of ranks (as the group's smallest rank and its sorted, merged
modes) plus whether the group must carry real traffic. Two dims of two domains that hold
the same ranks share one communicator; a group of the whole world is the default group.

Only the members of a group create it (``new_group(..., use_local_synchronization=True)``),
so every rank creates just the handful of groups it belongs to. torch names such groups
after their ranks and the number of groups made so far, so all ranks must request groups in
the same order: meshconf walks domains and dims in config order, and the decision to create
or reuse a group is the same on every member, because it depends only on the dims' modes.
When meshes are built on first use, the ``check`` hooks let the context compare that order
across the members before torch would wait on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from meshconf.core.layout import Mode, RankGroup, group_identity
from meshconf.runtime.torch_support import set_group_timeout

if TYPE_CHECKING:
    from meshconf.runtime.order import CreationWatch

GroupKey = tuple[int, tuple[Mode, ...], bool]


def key_text(key: GroupKey) -> str:
    """``3:2x4,4x1:real``: the group's smallest rank, its modes and whether it is real."""
    base, modes, real = key
    return f"{base}:{','.join(f'{m.size}x{m.stride}' for m in modes)}:{'real' if real else 'fake'}"


@dataclass
class GroupCounters:
    """What the registry did on this rank; tests and benchmarks read these."""

    new_group_calls: int = 0
    real_groups: int = 0
    fake_groups: int = 0
    default_group_reuses: int = 0
    cache_hits: int = 0

    @property
    def groups_created(self) -> int:
        return self.real_groups + self.fake_groups


@dataclass
class GroupRegistry:
    world_size: int
    backend: str
    timeout: timedelta
    counters: GroupCounters = field(default_factory=GroupCounters)
    #: Bound on creating a group (its members meeting in the store); the group then gets
    #: ``timeout`` for its collectives. None: ``timeout`` for both.
    creation_timeout: timedelta | None = None
    check: CreationWatch | None = None
    _groups: dict[GroupKey, dist.ProcessGroup] = field(default_factory=dict)
    _created: list[dist.ProcessGroup] = field(default_factory=list)

    def get(self, group: RankGroup, *, real: bool, description: str) -> dist.ProcessGroup:
        """The communicator of ``group``; ``real=False`` allows the no-traffic fake backend
        for a group of one rank."""
        fake = group.size == 1 and not real
        key: GroupKey = (group.base, group_identity(group.modes), not fake)
        existing = self._groups.get(key)
        if existing is not None:
            self.counters.cache_hits += 1
            return existing
        if group.size == self.world_size and not fake:
            process_group = dist.group.WORLD
            assert process_group is not None
            self.counters.default_group_reuses += 1
        else:
            if self.check is not None:
                self.check.before(group, key_text(key), description)
            self.counters.new_group_calls += 1
            try:
                created = dist.new_group(
                    ranks=sorted(group),
                    timeout=self.creation_timeout or self.timeout,
                    backend="fake" if fake else self.backend,
                    use_local_synchronization=True,
                    group_desc=f"meshconf:{description}",
                )
            except (RuntimeError, dist.DistError) as error:
                if self.check is None:
                    raise
                self.check.failed(group, key_text(key), description, error)
                raise
            assert created is not None, "meshconf only creates groups this rank belongs to"
            process_group = created
            self._created.append(process_group)
            if self.creation_timeout not in (None, self.timeout) and not fake:
                set_group_timeout(self.timeout, process_group)
            if fake:
                self.counters.fake_groups += 1
            else:
                self.counters.real_groups += 1
        self._groups[key] = process_group
        return process_group

    def set_timeout(self, timeout: timedelta, *, default_group: bool = True) -> None:
        """Apply ``timeout`` to the real groups made so far (and to the default group unless
        ``default_group`` is False), and to those made from now on."""
        self.timeout = timeout
        groups = [*([dist.group.WORLD] if default_group else []), *self._created]
        # torch changes the timeout of nccl and gloo groups only; fake ones have none.
        if self.backend in ("nccl", "gloo"):
            for group in groups:
                if dist.get_backend(group) == self.backend:
                    set_group_timeout(timeout, group)

    def destroy(self) -> None:
        """Destroy every group this registry created, once."""
        while self._created:
            dist.destroy_process_group(self._created.pop())
        self._groups.clear()
