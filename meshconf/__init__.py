"""meshconf: declarative, validated N-D parallel device meshes for PyTorch training."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meshconf._version import __version__

if TYPE_CHECKING:
    from meshconf.core.domains import (
        DATALOADING,
        DEFAULT_DERIVED,
        DEFAULT_DOMAINS,
        DENSE,
        LOSS,
        SPARSE,
    )
    from meshconf.core.errors import (
        ArgumentTypeError,
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
    from meshconf.runtime import DistributedContext as DistributedContext
    from meshconf.sources.loading import load_config

# Each public name and the module that defines it. A name is imported when first read, so
# that `import meshconf` (and so every `meshconf` command) loads only what it uses: pydantic
# and the models for a config, the JSON Schema generator for a schema, torch for the runtime.
_HOMES = {
    **dict.fromkeys(
        ("DATALOADING", "DEFAULT_DERIVED", "DEFAULT_DOMAINS", "DENSE", "LOSS", "SPARSE"),
        "meshconf.core.domains",
    ),
    **dict.fromkeys(
        (
            "ArgumentTypeError",
            "ConfigError",
            "Diagnostic",
            "InvalidArgumentError",
            "MeshconfError",
            "SourceError",
            "UnknownDomainError",
            "WorldSizeUnknownError",
        ),
        "meshconf.core.errors",
    ),
    **dict.fromkeys(
        ("DimLayout", "DomainLayout", "LayoutError", "Mode", "RankGroup", "UnevenSplitError"),
        "meshconf.core.layout",
    ),
    **dict.fromkeys(
        ("Degrees", "InsideNode", "MeshConfig", "RuntimeOptions"), "meshconf.model.config"
    ),
    "build_schema": "meshconf.model.schema",
    "load_config": "meshconf.sources.loading",
    "DistributedContext": "meshconf.runtime",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'meshconf' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


# DistributedContext imports torch, so it stays out of __all__: `from meshconf import *`
# does not import torch.
__all__ = [
    "DATALOADING",
    "DEFAULT_DERIVED",
    "DEFAULT_DOMAINS",
    "DENSE",
    "LOSS",
    "SPARSE",
    "ArgumentTypeError",
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
    "__version__",
    "build_schema",
    "load_config",
]
