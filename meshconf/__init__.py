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
    from meshconf.model.schema import build_schema as build_schema
    from meshconf.model.sections import (
        Degrees as Degrees,
        InsideNode as InsideNode,
        RuntimeOptions as RuntimeOptions,
    )
    from meshconf.model.training import TrainingOptions as TrainingOptions
    from meshconf.runtime import DistributedContext as DistributedContext
    from meshconf.sources.loading import load_config as load_config


def _homes() -> dict[str, str]:
    """Each public name and the module that defines it, read from the imports above.

    Those imports are the one list of the public names: type checkers read them, and this
    reads them for lazy loading and ``__all__``. A name is imported when first read, so that
    `import meshconf` (and so every `meshconf` command) loads only what it uses: pydantic and
    the models for a config, the JSON Schema generator for a schema, torch for the runtime.
    """
    # Imported on the first public name read, not by `import meshconf` itself.
    import ast
    from pathlib import Path

    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.asname or alias.name: str(node.module)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


_HOMES: dict[str, str] = {}


def __getattr__(name: str) -> Any:
    if not _HOMES:
        _HOMES.update(_homes())
    if name == "__all__":
        # The runtime imports torch, so it stays out: `from meshconf import *` does not.
        value: Any = [
            "__version__",
            *sorted(n for n, home in _HOMES.items() if not home.startswith("meshconf.runtime")),
        ]
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module 'meshconf' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    if not _HOMES:
        _HOMES.update(_homes())
    return sorted({*globals(), *_HOMES})
