"""Hydra: a typed schema node for a ``parallelism`` config group, and a ``_target_`` that
returns the validated :class:`~meshconf.model.config.MeshConfig`.

The schema node lets Hydra refuse a mistyped value or an unknown key while it composes
(``parallelism.degrees.tp=abc``); meshconf's own rules run when the node is instantiated. Every
field of the node defaults to ``None``, meaning "not set", so that meshconf's defaults apply
(``dp_shard``'s depends on the other degrees, which a fixed default could not express).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass
from typing import (  # noqa: UP035 - OmegaConf 2.3 reads these forms
    TYPE_CHECKING,
    Any,
    Dict,
    List,
    Optional,
    TypeAlias,
)

from meshconf.core.degrees import DEGREE_NAMES, WORLD_FACTORS
from meshconf.core.errors import ConfigError, Diagnostic, MeshconfError
from meshconf.core.messages import install_command
from meshconf.core.settings import TRAINING_SETTINGS
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_config
from meshconf.sources.overrides import InterpolationError, node_location, resolve

try:
    from hydra.core.config_store import ConfigStore
    from hydra.errors import CompactHydraException
    from omegaconf import Container, OmegaConf
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise MeshconfError(
        f"meshconf.integrations.hydra needs hydra-core ({error}); "
        f"install it with: {install_command('hydra')}"
    ) from None

#: The name the schema node is stored under in its group. Options list it in their defaults;
#: the leading underscore marks it as a base to extend, not an option to pick.
SCHEMA_NAME = "_meshconf_schema"
TARGET = "meshconf.integrations.hydra.build_config"


def _degree_node(name: str, degrees: list[str]) -> type:
    """A node with one ``Optional[int]`` field per degree, so that Hydra refuses a value
    that is not an integer while it composes."""
    return make_dataclass(name, [(degree, Optional[int], None) for degree in degrees])  # noqa: UP045


#: The type of a training setting's field, by its kind, in the forms OmegaConf 2.3 reads.
_SETTING_TYPES: Mapping[str, Any] = {
    "integer": Optional[int],  # noqa: UP045
    "number": Optional[float],  # noqa: UP045
    "choice": Optional[str],  # noqa: UP045
    "switch": Optional[bool],  # noqa: UP045
    "path": Optional[str],  # noqa: UP045
}


def _training_node() -> type:
    """A node with one field per training setting, typed by its kind, so that Hydra refuses
    a value of the wrong type while it composes."""
    return make_dataclass(
        "TrainingNode",
        [(row.key, _SETTING_TYPES[row.kind], None) for row in TRAINING_SETTINGS],
    )


# Made from the degree and training settings' tables, so that a new degree or setting
# reaches Hydra without an edit here.
if TYPE_CHECKING:
    DegreesNode: TypeAlias = Any
    InsideNodeNode: TypeAlias = Any
    TrainingNode: TypeAlias = Any
else:
    DegreesNode = _degree_node("DegreesNode", list(DEGREE_NAMES))
    InsideNodeNode = _degree_node("InsideNodeNode", list(WORLD_FACTORS))
    TrainingNode = _training_node()


@dataclass
class RuntimeNode:
    device: Optional[str] = None  # noqa: UP045
    backend: Optional[str] = None  # noqa: UP045
    timeout_s: Optional[int] = None  # noqa: UP045
    setup_timeout_s: Optional[int] = None  # noqa: UP045
    build: Optional[str] = None  # noqa: UP045


@dataclass
class LevelNode:
    name: Optional[str] = None  # noqa: UP045
    size: Optional[int] = None  # noqa: UP045
    bandwidth_gb_s: Optional[float] = None  # noqa: UP045


@dataclass
class MeshConfigNode:
    """The Hydra schema of a meshconf block; the same keys as :class:`MeshConfig`."""

    _target_: str = TARGET
    world_size: Optional[int] = None  # noqa: UP045
    gpus_per_node: Optional[int] = None  # noqa: UP045
    degrees: DegreesNode = field(default_factory=DegreesNode)
    order: Optional[List[str]] = None  # noqa: UP006, UP045
    # A node rather than None, so that `parallelism.inside_node.tp=8` works on the command
    # line; left all None, it means no inside_node at all.
    inside_node: InsideNodeNode = field(default_factory=InsideNodeNode)
    levels: Optional[List[LevelNode]] = None  # noqa: UP006, UP045
    # A mapping rather than None, as inside_node: `parallelism.inside.nvlink=[tp]` works;
    # left empty, it means no inside at all.
    inside: Dict[str, List[str]] = field(default_factory=dict)  # noqa: UP006
    derived: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    domains: Optional[Dict[str, List[str]]] = None  # noqa: UP006, UP045
    runtime: RuntimeNode = field(default_factory=RuntimeNode)
    # A node, as inside_node: `parallelism.training.zero_stage=1` works; left all None, it
    # means no training block.
    training: TrainingNode = field(default_factory=TrainingNode)


class HydraConfigError(ConfigError, CompactHydraException):
    """A :class:`ConfigError` that Hydra reports as its message alone, without a traceback.

    Hydra quotes ``repr()`` of what a ``_target_`` raised, so that is the message too."""

    def __repr__(self) -> str:
        return str(self)


def register_configs(group: str = "parallelism") -> None:
    """Store the schema node as ``{group}/_meshconf_schema`` in Hydra's ConfigStore.

    An option of the group extends it with ``defaults: [_meshconf_schema, _self_]``."""
    ConfigStore.instance().store(group=group, name=SCHEMA_NAME, node=MeshConfigNode)


def build_config(**fields: Any) -> MeshConfig:
    """The ``_target_`` of the schema node: validate the composed fields with meshconf.

    ``hydra.utils.instantiate(cfg.parallelism)`` calls it and returns the MeshConfig; Hydra
    wraps a failure in its InstantiationException, whose message is then meshconf's. Use
    :func:`instantiate` to get the :class:`ConfigError` itself."""
    try:
        return load_config(_set_values(fields))
    except ConfigError as error:
        raise HydraConfigError(error.diagnostics) from None


def instantiate(node: Any) -> MeshConfig:
    """Validate a meshconf node of a composed Hydra config and return its :class:`MeshConfig`.

    The node may extend the schema node (its ``_target_`` is meshconf's) or be a plain
    mapping of meshconf keys (an option that left ``_meshconf_schema`` out of its defaults);
    both are validated the same way. Raises :class:`HydraConfigError` (a
    :class:`ConfigError`), which Hydra prints as its message alone, for an invalid node, an
    interpolation that cannot be resolved (such as ``${oc.env:VAR}`` with ``VAR`` unset), or
    another ``_target_``; every key is placed at its full path, such as
    ``parallelism.degrees.tp``."""
    prefix = node_location(node)
    try:
        values = resolve(node) if isinstance(node, Container) else dict(node)
    except InterpolationError as error:
        key = tuple(error.key.split(".")) if error.key else prefix
        raise HydraConfigError([Diagnostic(key, error.message)]) from None
    if not isinstance(values, dict):
        wrong = f"expected a mapping of meshconf keys, got {type(values).__name__}"
        raise HydraConfigError([Diagnostic(prefix, wrong)])
    target = values.pop("_target_", TARGET)
    if target != TARGET:
        wrong = (
            f"{target!r} is not meshconf's {TARGET!r}; list {SCHEMA_NAME} in the option's "
            "defaults, or leave _target_ out"
        )
        raise HydraConfigError([Diagnostic((*prefix, "_target_"), wrong)])
    try:
        return build_config(**values)
    except ConfigError as error:
        raise HydraConfigError(
            [
                Diagnostic((*prefix, *d.path), d.message, d.source, d.line, d.column, d.override)
                for d in error.diagnostics
            ]
        ) from None


def _set_values(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields as plain containers, without those left ``None`` (not set)."""
    plain: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, Container):
            value = OmegaConf.to_container(value, resolve=True)
        if isinstance(value, Mapping) and name in ("degrees", "inside_node", "runtime", "training"):
            value = _set_values(value)
        if name == "levels" and isinstance(value, list):
            value = [_set_values(level) if isinstance(level, Mapping) else level for level in value]
        if value is not None and not (name in ("inside_node", "inside", "training") and not value):
            plain[name] = value
    return plain
