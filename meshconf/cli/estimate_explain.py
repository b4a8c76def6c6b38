"""``--explain``: one layout's memory by term, what each term holds under the settings, and
its source (docs/estimate.md has each term's check), as text and as JSON."""

from __future__ import annotations

from typing import Any

from meshconf.cli.estimate_report import gib
from meshconf.features.plan.estimate.step import Estimate
from meshconf.features.plan.estimate.step_inputs import Training
from meshconf.features.plan.estimate.terms import NOT_COUNTED, memory_terms


def explain_json(found: Estimate, training: Training) -> dict[str, Any]:
    """The memory by term as ``--format json`` gives it beside the estimate."""
    terms = [
        {"term": term.name, "gib": gib(term.bytes), "holds": term.holds, "source": term.source}
        for term in memory_terms(found, training)
    ]
    return {"terms": terms, "not_counted": NOT_COUNTED}


def explain_lines(found: Estimate, training: Training) -> list[str]:
    """The memory by term as text: a table, then what is not counted."""
    terms = memory_terms(found, training)
    lines = [
        f"memory by term (GiB, pipeline rank {found.memory.pp_rank}; each term's check in "
        "docs/estimate.md):"
    ]
    width = max(len(term.name) for term in terms)
    for term in terms:
        lines.append(f"  {term.name:<{width}}  {gib(term.bytes):>7.2f}  {term.holds}")
        lines.append(f"  {'':<{width}}  {'':>7}  source: {term.source}")
    lines.append(f"not counted: {NOT_COUNTED}")
    return lines
