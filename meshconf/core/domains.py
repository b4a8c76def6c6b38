"""The default derived dims and domains, and the names users may give their own."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from types import MappingProxyType

from meshconf.core.formulas import Expr, compile_formula, parse

DATALOADING = "dataloading"
DENSE = "dense"
SPARSE = "sparse"
LOSS = "loss"

#: Formulas for the derived dims every config has unless it redefines them.
DEFAULT_DERIVED: Mapping[str, str] = MappingProxyType(
    {
        "batch": "dp_replicate * dp_shard",
        "fsdp": "dp_shard * cp",
        "loss": "dp_replicate * dp_shard * cp",
        "efsdp": "dp_shard * cp * tp / (ep * etp)",
    }
)
#: The default formulas, parsed once for the features that evaluate them per layout.
DEFAULT_FORMULAS: Mapping[str, Expr] = MappingProxyType(
    {name: parse(text) for name, text in DEFAULT_DERIVED.items()}
)
#: Each default formula compiled once, as a function of the degrees.
DEFAULT_SIZE_OF: Mapping[str, Callable[[Mapping[str, int]], int]] = MappingProxyType(
    {name: compile_formula(expr) for name, expr in DEFAULT_FORMULAS.items()}
)


def default_sizes(degrees: Mapping[str, int]) -> dict[str, int]:
    """Every degree and the size of every default derived dim, for degrees whose derived
    formulas divide exactly (the rules check that first).

    Raises:
        FormulaError: a formula does not divide exactly.
    """
    sizes = dict(degrees)
    for name, size_of in DEFAULT_SIZE_OF.items():
        sizes[name] = size_of(degrees)
    return sizes


#: Dims of each default domain, outer to inner.
DEFAULT_DOMAINS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        DATALOADING: ("pp", "batch", "cp", "tp"),
        DENSE: ("pp", "dp_replicate", "fsdp", "tp"),
        SPARSE: ("pp", "dp_replicate", "efsdp", "ep", "etp"),
        LOSS: ("pp", "loss", "tp"),
    }
)

NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_NAME_LENGTH = 64
