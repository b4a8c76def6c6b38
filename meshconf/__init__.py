"""meshconf: declarative, validated N-D parallel device meshes for PyTorch training."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from meshconf._version import __version__ as __version__

if TYPE_CHECKING:
    from meshconf.core.domains import (
        DATALOADING as DATALOADING,
        DEFAULT_DERIVED as DEFAULT_DERIVED,
        DEFAULT_DOMAINS as DEFAULT_DOMAINS,
        DENSE as DENSE,
        LOSS as LOSS,
        SPARSE as SPARSE,
    )
    from meshconf.core.errors import (
        ArgumentTypeError as ArgumentTypeError,
        ConfigError as ConfigError,
        Diagnostic as Diagnostic,
        InvalidArgumentError as InvalidArgumentError,
        MeshconfError as MeshconfError,
        SourceError as SourceError,
        UnknownDomainError as UnknownDomainError,
        WorldSizeUnknownError as WorldSizeUnknownError,
    )
    from meshconf.core.layout import (
        DimLayout as DimLayout,
        DomainLayout as DomainLayout,
        LayoutError as LayoutError,
        Mode as Mode,
        RankGroup as RankGroup,
        UnevenSplitError as UnevenSplitError,
    )
    from meshconf.model.config import MeshConfig as MeshConfig
    from meshconf.model.json_schema import build_schema as build_schema
    from meshconf.model.sections import (
        Degrees as Degrees,
        InsideNode as InsideNode,
        RuntimeOptions as RuntimeOptions,
    )
    from meshconf.model.training import TrainingOptions as TrainingOptions
    from meshconf.runtime import DistributedContext as DistributedContext
    from meshconf.sources.loading import load_config as load_config


#: Each public name and the module that defines it; the imports above say the same to type
#: checkers (tests/test_code_quality.py checks that they agree). A name is imported when first
#: read, so that `import meshconf` (and so every `meshconf` command) loads only what it uses:
#: pydantic and the models for a config, the JSON Schema generator for a schema, torch for the
#: runtime.
_HOMES: dict[str, str] = {
    "DATALOADING": "meshconf.core.domains",
    "DEFAULT_DERIVED": "meshconf.core.domains",
    "DEFAULT_DOMAINS": "meshconf.core.domains",
    "DENSE": "meshconf.core.domains",
    "LOSS": "meshconf.core.domains",
    "SPARSE": "meshconf.core.domains",
    "ArgumentTypeError": "meshconf.core.errors",
    "ConfigError": "meshconf.core.errors",
    "Diagnostic": "meshconf.core.errors",
    "InvalidArgumentError": "meshconf.core.errors",
    "MeshconfError": "meshconf.core.errors",
    "SourceError": "meshconf.core.errors",
    "UnknownDomainError": "meshconf.core.errors",
    "WorldSizeUnknownError": "meshconf.core.errors",
    "DimLayout": "meshconf.core.layout",
    "DomainLayout": "meshconf.core.layout",
    "LayoutError": "meshconf.core.layout",
    "Mode": "meshconf.core.layout",
    "RankGroup": "meshconf.core.layout",
    "UnevenSplitError": "meshconf.core.layout",
    "MeshConfig": "meshconf.model.config",
    "build_schema": "meshconf.model.json_schema",
    "Degrees": "meshconf.model.sections",
    "InsideNode": "meshconf.model.sections",
    "RuntimeOptions": "meshconf.model.sections",
    "TrainingOptions": "meshconf.model.training",
    "DistributedContext": "meshconf.runtime",
    "load_config": "meshconf.sources.loading",
}
# The runtime imports torch, so it stays out: `from meshconf import *` does not load it.
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
    "TrainingOptions",
    "UnevenSplitError",
    "UnknownDomainError",
    "WorldSizeUnknownError",
    "__version__",
    "build_schema",
    "load_config",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'meshconf' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
