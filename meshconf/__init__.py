"""meshconf: declarative, validated N-D parallel device meshes for PyTorch training."""

from typing import TYPE_CHECKING, Any

from meshconf.core.domains import DATALOADING, DEFAULT_DERIVED, DEFAULT_DOMAINS, DENSE, LOSS, SPARSE
from meshconf.core.errors import (
    ConfigError,
    Diagnostic,
    InvalidArgumentError,
    MeshconfError,
    SourceError,
    UnknownDomainError,
    WorldSizeUnknownError,
)
from meshconf.core.layout import (
    DimLayout,
    DomainLayout,
    LayoutError,
    Mode,
    RankGroup,
    UnevenSplitError,
)
from meshconf.model.config import Degrees, InsideNode, MeshConfig, RuntimeOptions
from meshconf.model.schema import build_schema
from meshconf.sources.loading import load_config

if TYPE_CHECKING:
    from meshconf.runtime import DistributedContext as DistributedContext


def __getattr__(name: str) -> Any:
    # The runtime imports torch; load it only when asked for, so `import meshconf` stays light
    # (and it stays out of __all__, so `from meshconf import *` does not import torch either).
    if name == "DistributedContext":
        from meshconf.runtime import DistributedContext

        return DistributedContext
    raise AttributeError(f"module 'meshconf' has no attribute {name!r}")


__all__ = [
    "DATALOADING",
    "DEFAULT_DERIVED",
    "DEFAULT_DOMAINS",
    "DENSE",
    "LOSS",
    "SPARSE",
    "ConfigError",
    "Degrees",
    "Diagnostic",
    "DimLayout",
    "DomainLayout",
    "InsideNode",
    "InvalidArgumentError",
    "LayoutError",
    "MeshConfig",
    "MeshconfError",
    "Mode",
    "RankGroup",
    "RuntimeOptions",
    "SourceError",
    "UnevenSplitError",
    "UnknownDomainError",
    "WorldSizeUnknownError",
    "build_schema",
    "load_config",
]
