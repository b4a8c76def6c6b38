"""The torch side of meshconf: DeviceMeshes from a validated MeshConfig.

The only package of meshconf that imports torch, from the ``torch`` extra.
Beside the layers: may import ``core``, ``model``, ``sources`` and ``features``; never the
command line, ``compat`` or ``integrations``.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised in a subprocess test
    from meshconf.core.errors import MeshconfError
    from meshconf.core.messages import install_command

    raise MeshconfError(
        f"meshconf's runtime needs torch, which is not installed: {install_command('torch')}"
    ) from error

from meshconf.runtime.torch_support import UnsupportedTorchError, check_torch

check_torch()

from meshconf.runtime.context import DistributedContext, TopologyWarning  # noqa: E402
from meshconf.runtime.groups import GroupCounters  # noqa: E402
from meshconf.runtime.launch import Launch, LaunchError, read_launch  # noqa: E402
from meshconf.runtime.order import CreationOrderError  # noqa: E402
from meshconf.runtime.reductions import all_reduce  # noqa: E402
from meshconf.runtime.rendezvous import (  # noqa: E402
    RankFailedError,
    RuntimeSetupError,
    SetupTimeoutError,
)

__all__ = [
    "CreationOrderError",
    "DistributedContext",
    "GroupCounters",
    "Launch",
    "LaunchError",
    "RankFailedError",
    "RuntimeSetupError",
    "SetupTimeoutError",
    "TopologyWarning",
    "UnsupportedTorchError",
    "all_reduce",
    "read_launch",
]
