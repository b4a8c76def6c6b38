"""The checks every compat function makes of what it is given, before it reads it: a
validated ``MeshConfig``, an open ``DistributedContext``, a switch, a world size. Each raises
a ``ConfigError`` naming the argument, what it takes and what it got, so that a wrong argument
never surfaces as an ``AttributeError`` deep inside.

Needs no torch: a ``DistributedContext`` exists only once :mod:`meshconf.runtime` is loaded,
so an argument is checked against it only then.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from meshconf.core.errors import ConfigError, Diagnostic, describe_value
from meshconf.model.config import MeshConfig

if TYPE_CHECKING:
    from meshconf.runtime import DistributedContext

#: How a config is made, said where an argument is not one.
MAKE_CONFIG = "meshconf.load_config('mesh.yaml')"
#: How a context is made, said where an argument is not one.
MAKE_CONTEXT = "meshconf.DistributedContext(config) on every rank"


def refused(name: str, message: str, error: type[ConfigError] = ConfigError) -> ConfigError:
    """``error`` with one problem, reported on the argument ``name``."""
    return error([Diagnostic((name,), message)])


def mesh_config(value: object) -> MeshConfig:
    """``value``, when it is a validated :class:`MeshConfig`.

    Raises:
        ConfigError: anything else: a path, a mapping, a context, None.
    """
    if isinstance(value, MeshConfig):
        return value
    hint = f"a path or a mapping goes through {MAKE_CONFIG} first"
    if _is_context(value):
        hint = "pass the context's config (config=context.config)"
    raise refused("config", f"expected a MeshConfig, got {describe_value(value)}; {hint}")


def open_context(value: object) -> DistributedContext:
    """``value``, when it is a :class:`meshconf.runtime.DistributedContext` that is not
    closed: the meshes a trainer is handed are built from its process groups.

    Raises:
        ConfigError: anything else (a MeshConfig: build the context from it), or a context
            whose ``close()`` has destroyed its groups.
    """
    if not _is_context(value):
        how = "from it:" if isinstance(value, MeshConfig) else "with"
        wrong = f"expected a DistributedContext, got {describe_value(value)}"
        raise refused("context", f"{wrong}; build one {how} {MAKE_CONTEXT}")
    context: DistributedContext = value  # type: ignore[assignment]
    if context.closed:
        raise refused(
            "context",
            "the DistributedContext is closed: close() (or the end of its with block) destroyed "
            f"its process groups; build a new one with {MAKE_CONTEXT}",
        )
    return context


def _is_context(value: object) -> bool:
    runtime = sys.modules.get("meshconf.runtime.context")
    return runtime is not None and isinstance(value, runtime.DistributedContext)


def switch(value: object, name: str) -> bool | None:
    """``value``, when it is True, False or None (read from the environment); a string such
    as ``'false'`` is refused rather than read as true.

    Raises:
        ConfigError: anything else.
    """
    if value is None or isinstance(value, bool):
        return value
    raise refused(name, f"expected True, False or None, got {describe_value(value)}")


def world_ranks(value: object, how: str) -> int:
    """``value``, when it is a number of ranks (an integer >= 1); ``how`` says where the
    caller finds it.

    Raises:
        ConfigError: anything else, None included.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise refused(
        "world_size",
        f"expected the number of ranks, an integer >= 1, got {describe_value(value)}; {how}",
    )
