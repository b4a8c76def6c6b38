"""The torch side of meshconf: DeviceMeshes from a validated MeshConfig.

The only package of meshconf that imports torch. Install it with ``pip install meshconf[torch]``.
Beside the layers: may import ``core``, ``model``, ``sources`` and ``features``; never the
command line, ``compat`` or ``integrations``.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    from meshconf.core.errors import MeshconfError

    raise MeshconfError(
        "meshconf's runtime needs torch, which is not installed: pip install 'meshconf[torch]'"
    ) from error

from meshconf.runtime.context import DistributedContext, RuntimeSetupError, TopologyWarning
from meshconf.runtime.groups import GroupCounters
from meshconf.runtime.launch import Launch, LaunchError, read_launch
from meshconf.runtime.reductions import all_reduce

__all__ = [
    "DistributedContext",
    "GroupCounters",
    "Launch",
    "LaunchError",
    "RuntimeSetupError",
    "TopologyWarning",
    "all_reduce",
    "read_launch",
]
