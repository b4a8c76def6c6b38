"""The private torch names the runtime relies on, each probed once when the runtime is imported.

torch does not promise these across releases. Probing them up front turns a rename into one
clear line that names the torch version and the missing piece, instead of an AttributeError
in the middle of building a mesh. pyproject.toml's ``torch`` extra states the tested range.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from meshconf.core.errors import MeshconfError

TESTED_TORCH = "2.13.0 and 2.14.1"


def _module_attribute(module: str, name: str) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            return hasattr(importlib.import_module(module), name)
        except ImportError:
            return False

    return probe


def _attributes(*paths: str) -> dict[str, Callable[[], bool]]:
    """A probe for each ``module.name`` of ``paths``, under that path."""
    return {path: _module_attribute(*path.rsplit(".", 1)) for path in paths}


def _device_mesh() -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh


_C10D = "torch.distributed.distributed_c10d"
#: What the runtime uses, and the probe that says whether this torch has it.
PROBES: dict[str, Callable[[], bool]] = {
    **_attributes(
        "torch.distributed._mesh_layout._MeshLayout", "torch.distributed._mesh_layout._FlatLayout"
    ),
    "DeviceMesh(_layout=..., _rank_map=..., _init_backend=...)": lambda: (
        {"_layout", "_rank_map", "_init_backend"}
        <= set(inspect.signature(_device_mesh().__init__).parameters)
    ),
    "DeviceMesh._dim_group_names": lambda: (
        "_dim_group_names" in _device_mesh().get_group.__code__.co_names
    ),
    "DeviceMesh._pg_registry": lambda: (
        "_pg_registry" in getattr(_device_mesh(), "__annotations__", {})
    ),
    f"torch.distributed.set_timeout or {_C10D}._set_pg_timeout": lambda: (
        _module_attribute("torch.distributed", "set_timeout")()
        or _module_attribute(_C10D, "_set_pg_timeout")()
    ),
    **_attributes(
        f"{_C10D}._get_default_group",
        f"{_C10D}._get_default_store",
        "torch.testing._internal.distributed.fake_pg.FakeStore",
    ),
}


#: What ``meshconf measure`` uses besides (its memory trackers), probed when it runs: importing
#: them costs more than every other probe together.
MEASURE_PROBES = _attributes(
    "torch.distributed._tools.mem_tracker.MemTracker",
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker",
)


def check_torch(probes: Mapping[str, Callable[[], bool]] = PROBES) -> None:
    """Probe every private name in ``probes``.

    Raises:
        MeshconfError: one line naming the torch version and the first missing name.
    """
    for name, probe in probes.items():
        if not probe():
            raise MeshconfError(
                f"meshconf's runtime needs {name}, which torch {torch.__version__} does not "
                f"have; meshconf is tested with torch {TESTED_TORCH}"
            )


def set_group_timeout(timeout: timedelta, group: dist.ProcessGroup | None) -> None:
    """Change a group's timeout: public in torch 2.14 (``set_timeout``), private before."""
    public = getattr(dist, "set_timeout", None)
    if public is not None:
        public(timeout, group)
    else:
        dist.distributed_c10d._set_pg_timeout(timeout, group)
