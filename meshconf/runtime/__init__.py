"""The torch side of meshconf: DeviceMeshes from a validated MeshConfig.

The only package of meshconf that imports torch, from the ``torch`` extra.
Beside the layers: may import ``core``, ``model``, ``sources`` and ``features``; never the
command line, ``compat`` or ``integrations``.
"""

from __future__ import annotations

# Imported before torch: it reads the memory limit that a failed import of torch reports.
from meshconf.sources.host_memory import address_space_limit

try:
    import torch  # noqa: F401
except (ImportError, OSError, MemoryError) as error:  # pragma: no cover - tested in subprocesses
    from meshconf.core.errors import MeshconfError
    from meshconf.core.messages import install_command

    if isinstance(error, ModuleNotFoundError) and error.name == "torch":
        raise MeshconfError(
            f"meshconf's runtime needs torch, which is not installed: {install_command('torch')}"
        ) from error
    # Under an address-space limit (ulimit -v) lower than what torch's libraries take to
    # map, the import stops with a bare MemoryError or a library that fails to load; the
    # limit is what the user can change.
    limit = address_space_limit()
    detail = f": {error}" if str(error) else ""
    if limit is not None:
        detail += (
            f"; this process may use {limit >> 20} MiB of address space (ulimit -v), "
            "which may be less than torch needs to load"
        )
    raise MeshconfError(
        f"torch is installed but could not be loaded: {type(error).__name__}{detail}"
    ) from error

from meshconf.runtime.torch_support import check_torch

check_torch()

from meshconf.runtime.context import DistributedContext  # noqa: E402
from meshconf.runtime.groups import GroupCounters  # noqa: E402
from meshconf.runtime.launch import Launch, read_launch  # noqa: E402
from meshconf.runtime.order import CreationOrderError  # noqa: E402
from meshconf.runtime.reductions import all_reduce  # noqa: E402
from meshconf.runtime.rendezvous import RankFailedError  # noqa: E402
from meshconf.runtime.setup import TopologyWarning  # noqa: E402
from meshconf.runtime.step_memory import MeasuredMemory, TrainingStep, measure_memory  # noqa: E402
from meshconf.runtime.store import RuntimeSetupError, SetupTimeoutError  # noqa: E402

# A traceback names an exception by its module: these read as the names the docs give them,
# meshconf.runtime.RankFailedError, not the module each is defined in.
for _exported in (
    CreationOrderError,
    RankFailedError,
    RuntimeSetupError,
    SetupTimeoutError,
    TopologyWarning,
):
    _exported.__module__ = __name__
del _exported

__all__ = [
    "CreationOrderError",
    "DistributedContext",
    "GroupCounters",
    "Launch",
    "MeasuredMemory",
    "RankFailedError",
    "RuntimeSetupError",
    "SetupTimeoutError",
    "TopologyWarning",
    "TrainingStep",
    "all_reduce",
    "measure_memory",
    "read_launch",
]
