"""d9d's ``DistributedContext``, as meshconf's with the members only d9d has.

Imported by :meth:`meshconf.compat.d9d.DeviceMeshParameters.build`, so that reading the
parameters needs no torch.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from meshconf.runtime import DistributedContext as MeshconfContext

if TYPE_CHECKING:
    from meshconf.compat.d9d import DeviceMeshParameters

#: Where a process without MASTER_ADDR (started without a launcher) says the master is.
LOCAL_MASTER = "127.0.0.1"


def _master_address(environ: Mapping[str, str]) -> str:
    """MASTER_ADDR as an IP address when the name resolves, as written when it does not."""
    name = environ.get("MASTER_ADDR")
    if not name:
        return LOCAL_MASTER
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


class DistributedContext(MeshconfContext):
    """A :class:`meshconf.runtime.DistributedContext` over d9d's five domains, with d9d's
    ``mesh_params``, ``master_addr`` and ``logger``, and node counts that assume one node
    when the launcher does not say how many ranks a node runs (d9d counts GPUs instead).

    Raises:
        MeshconfError: the launcher started another number of ranks.
        meshconf.runtime.RuntimeSetupError: the process group or device cannot be set up.
    """

    def __init__(
        self,
        params: DeviceMeshParameters,
        log_level: int = logging.INFO,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(params.to_mesh_config(), environ=environ)
        self._params = params
        self._master_addr = _master_address(os.environ if environ is None else environ)
        self._logger = logging.getLogger("meshconf.compat.d9d")
        self._logger.setLevel(log_level)
        self._logger.handlers.clear()
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(
            logging.Formatter(f"{self.log_prefix} %(asctime)s - %(levelname)s - %(message)s")
        )
        self._logger.addHandler(handler)

    @property
    def mesh_params(self) -> DeviceMeshParameters:
        """The parameters this context was built from."""
        return self._params

    @property
    def master_addr(self) -> str:
        """The master's address from MASTER_ADDR, resolved to an IP address where it can be;
        127.0.0.1 without a launcher."""
        return self._master_addr

    @property
    def logger(self) -> logging.Logger:
        """A logger that writes to stdout with this rank's coordinates in every line."""
        return self._logger

    @property
    def num_nodes(self) -> int:
        """How many nodes the world spans; 1 when the launcher does not say."""
        nodes = super().num_nodes
        return 1 if nodes is None else nodes

    @property
    def node_rank(self) -> int:
        """This rank's node; 0 when the launcher does not say how many ranks a node runs."""
        node = super().node_rank
        return 0 if node is None else node
