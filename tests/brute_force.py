"""What the brute-force tests share: mixed-radix digits written out by hand (no meshconf code),
and the messages a config is refused with."""

from __future__ import annotations

from typing import Any

import pytest

from meshconf import ConfigError, load_config


def errors(data: dict[str, Any]) -> list[str]:
    """The rendered diagnostics ``load_config(data)`` raises (it must raise)."""
    with pytest.raises(ConfigError) as raised:
        load_config(data)
    return [diagnostic.render() for diagnostic in raised.value.diagnostics]


def unravel(index: int, sizes: list[int]) -> list[int]:
    """The digits of ``index`` in the mixed radix ``sizes``, most significant first."""
    digits = []
    for size in reversed(sizes):
        index, digit = divmod(index, size)
        digits.append(digit)
    return digits[::-1]


def ravel(digits: list[int], sizes: list[int]) -> int:
    """The number whose digits in the mixed radix ``sizes`` are ``digits``."""
    index = 0
    for digit, size in zip(digits, sizes, strict=True):
        index = index * size + digit
    return index
