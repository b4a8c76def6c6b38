"""meshconf: declarative, validated N-D parallel device meshes for PyTorch training."""

from meshconf.config import Degrees, MeshConfig, RuntimeOptions
from meshconf.domains import DATALOADING, DEFAULT_DERIVED, DEFAULT_DOMAINS, DENSE, LOSS, SPARSE
from meshconf.errors import (
    ConfigError,
    Diagnostic,
    MeshconfError,
    SourceError,
    WorldSizeUnknownError,
)
from meshconf.layout import DimLayout, DomainLayout, LayoutError, Mode, RankGroup
from meshconf.loading import load_config

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
    "LayoutError",
    "MeshConfig",
    "MeshconfError",
    "Mode",
    "RankGroup",
    "RuntimeOptions",
    "SourceError",
    "WorldSizeUnknownError",
    "load_config",
]
