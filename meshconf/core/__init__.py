"""The pure math of meshconf: degrees, formulas, rank layouts, default domains, errors.

Layer 1 of 4. May import only the standard library and other modules of ``meshconf.core``:
no pydantic, no YAML, no files, no torch.
"""
