"""Generated hostile input to the Python API: ``load_config`` on mappings, overrides and
environment values, under a memory limit (300 MiB above what the test process holds) and a
CPU-time limit per example.

Each call either returns a MeshConfig or raises a MeshconfError whose diagnostics are each one
line; nothing else may escape. ``MESHCONF_FUZZ_LONG=1`` runs ten times as many examples.
"""

from __future__ import annotations

import itertools
import os
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from meshconf import ConfigError, MeshconfError, load_config

LONG = os.environ.get("MESHCONF_FUZZ_LONG") == "1"
EXAMPLES = 1000 if LONG else 100
CPU_SECONDS = 2.0
MEMORY_MIB = 300

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # time is checked as CPU time below; wall time depends on the machine's load
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)

NAMES = [
    "world_size",
    "gpus_per_node",
    "degrees",
    "derived",
    "domains",
    "inside_node",
    "runtime",
    "tp",
    "pp",
    "dp_shard",
    "dp_replicate",
    "cp",
    "ep",
    "etp",
    "dense",
    "fsdp",
    "a",
    "b",
]


@contextmanager
def memory_limit() -> Iterator[None]:
    """Cap this process's address space at what it uses now plus MEMORY_MIB."""
    with open("/proc/self/status") as status:
        used_kib = int(status.read().split("VmSize:")[1].split()[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (used_kib * 1024 + MEMORY_MIB * 1024 * 1024, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def interpolation(names: list[str]) -> st.SearchStrategy[str]:
    ref = st.sampled_from(names)
    plain = ref.map(lambda name: f"${{{name}}}")
    resolver = st.tuples(st.sampled_from(["oc.select", "oc.env", "oc.decode"]), ref).map(
        lambda pair: f"${{{pair[0]}:{pair[1]}}}"
    )
    nested = st.integers(1, 40).map(lambda depth: "${oc.select:" * depth + "a" + "}" * depth)
    return st.one_of(plain, resolver, nested, st.lists(plain, min_size=2, max_size=12).map("".join))


LEAVES = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.integers(min_value=-2, max_value=4096),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
    st.sampled_from(["tp", "dp_shard * tp", "pp / 0", "-1", "8", "x" * 200]),
    interpolation(NAMES),
)


def containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.one_of(st.sampled_from(NAMES), st.text(max_size=8), st.integers(-3, 3), st.none())
    return st.one_of(
        st.lists(children, max_size=6),
        st.dictionaries(keys, children, max_size=6),
        st.frozensets(st.sampled_from(NAMES), max_size=4),
        st.tuples(children, children),
    )


VALUES = st.recursive(LEAVES, containers, max_leaves=40)
CONFIGS = st.dictionaries(st.sampled_from(NAMES), VALUES, min_size=1, max_size=8)


def check_call(*args: Any, **kwargs: Any) -> None:
    start = time.process_time()
    try:
        with memory_limit():
            load_config(*args, **kwargs)
    except ConfigError as error:
        assert error.diagnostics
        assert len(error.diagnostics) <= 51
        assert all("\n" not in diagnostic.render() for diagnostic in error.diagnostics)
    except MeshconfError as error:
        assert "\n" not in str(error)
    assert time.process_time() - start < CPU_SECONDS


@FUZZ
@given(config=CONFIGS)
def test_mappings(config: dict[str, Any]) -> None:
    check_call(config)


@st.composite
def bombs(draw: st.DrawFn) -> dict[str, Any]:
    fan, levels = draw(st.integers(2, 12)), draw(st.integers(2, 10))
    config: dict[str, Any] = {"world_size": 8, "a0": draw(st.text(max_size=30))}
    for level in range(1, levels + 1):
        ref = f"${{a{level - 1}}}"
        config[f"a{level}"] = draw(
            st.sampled_from([[ref] * fan, ref * fan, {f"k{i}": ref for i in range(fan)}])
        )
    return config


@FUZZ
@given(config=bombs())
def test_interpolation_bombs(config: dict[str, Any]) -> None:
    check_call(config)


@FUZZ
@given(depth=st.integers(0, 10_000), holds_itself=st.booleans())
def test_deep_and_self_containing(depth: int, holds_itself: bool) -> None:
    config: dict[str, Any] = {"world_size": 8}
    inner = config
    for _ in range(depth):
        inner["x"] = {}
        inner = inner["x"]
    if holds_itself or depth < 64:
        inner["loop"] = config
    with pytest.raises(ConfigError) as caught, memory_limit():
        load_config(config)
    (diagnostic,) = caught.value.diagnostics
    if depth < 64:  # shallow: made to hold itself
        assert diagnostic.message == "contains itself"
    elif not holds_itself:
        assert diagnostic.message == "nested deeper than 64 levels"
    else:
        assert diagnostic.message in ("nested deeper than 64 levels", "contains itself")


_NAMED_KEYS = st.sampled_from(
    [
        "degrees.tp",
        "world_size",
        "domains.d",
        "derived.x",
        "a",
        "+a",
        "++b",
        "~degrees",
        "domains.dense[0]",
        "a.b.c",
        "x[3]",
        "=",
    ]
)
_DEEP_KEYS = st.tuples(
    st.sampled_from(["", "+", "++", "~"]),
    st.integers(1, 5000),
    st.sampled_from([".a", "[0]", ".0", ".degrees"]),
).map(lambda parts: parts[0] + "x" + parts[2] * parts[1])
OVERRIDE_KEYS = st.one_of(_NAMED_KEYS, _DEEP_KEYS)
OVERRIDE_VALUES = st.one_of(
    st.text(max_size=30),
    interpolation(["world_size", "a", "b", "degrees.tp"]),
    st.tuples(
        st.sampled_from(["!!int", "!!float", "!!bool", "!!set", "!!timestamp", "!!str"]),
        st.sampled_from(["abc", "0b10", "maybe", "8", "{a, b}", "2020-01-01"]),
    ).map(" ".join),
)


@FUZZ
@given(overrides=st.lists(st.tuples(OVERRIDE_KEYS, OVERRIDE_VALUES).map("=".join), max_size=5))
def test_overrides(overrides: list[str]) -> None:
    check_call({"world_size": 8, "a": 1}, overrides)


@FUZZ
@given(value=st.one_of(st.text(max_size=50), st.integers(1, 100_000).map(lambda n: "7" * n)))
def test_environment_values(value: str) -> None:
    os.environ["MESHCONF_FUZZ_VALUE"] = value.replace("\x00", "")  # the OS refuses NUL
    try:
        check_call(
            {
                "world_size": "${oc.env:MESHCONF_FUZZ_VALUE}",
                "degrees": {"tp": "${oc.env:MESHCONF_FUZZ_VALUE}"},
            }
        )
    finally:
        del os.environ["MESHCONF_FUZZ_VALUE"]


# --- the classes of the last corpora -------------------------------------------------------

#: Where a config holds an integer (or a key, or a formula that may be one).
INTEGER_PATHS = [
    ("world_size",),
    ("gpus_per_node",),
    ("degrees", "tp"),
    ("degrees", "dp_shard"),
    ("inside_node", "tp"),
    ("levels", 0, "size"),
    ("levels", 0, "bandwidth_gb_s"),
    ("runtime", "timeout_s"),
    ("training", "zero_stage"),
    ("training", "checkpoint_every"),
    ("derived", "x"),
    ("domains", "d", 0),
]
#: Objects that are no plain data: some cannot even be copied.
OBJECTS = [
    (x for x in ()),
    memoryview(b"ab"),
    b"8",
    bytearray(b"8"),
    range(3),
    complex(1, 2),
    object(),
    len,
    Ellipsis,
]


def placed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A small config with ``value`` at ``path``."""
    config: dict[str, Any] = {"world_size": 8, "levels": [{"name": "node", "size": 8}]}
    node: Any = config
    for part, following in itertools.pairwise(path):
        if isinstance(part, int):
            node = node[part]
        else:
            node = node.setdefault(part, [{}] if isinstance(following, int) else {})
    node[path[-1]] = value
    return config


def refused_in_meshconf_s_words(config: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(MeshconfError) as caught, memory_limit():
        load_config(config, **kwargs)
    text = str(caught.value)
    assert "set_int_max_str_digits" not in text and "\n" not in text.strip(), text
    return text


@FUZZ
@given(
    path=st.sampled_from(INTEGER_PATHS),
    digits=st.sampled_from([31, 400, 4300, 4301, 5000, 20_000]),
    sign=st.sampled_from([1, -1]),
)
def test_integers_of_thousands_of_digits_anywhere(
    path: tuple[Any, ...], digits: int, sign: int
) -> None:
    """Every field, and a key, with an integer too long for Python to write as text: one line
    in meshconf's words, never Python's advice to raise its limit."""
    value = sign * 10 ** (digits - 1)
    refused_in_meshconf_s_words(placed(path, value))
    refused_in_meshconf_s_words({"world_size": 8, "degrees": {value: 2}})


def test_the_world_size_argument_of_thousands_of_digits() -> None:
    refused_in_meshconf_s_words({"degrees": {"tp": 2}}, world_size=10**5000)


@FUZZ
@given(path=st.sampled_from([*INTEGER_PATHS, ("levels",), ("inside",), ("degrees",)]))
def test_objects_that_are_no_plain_data_anywhere(path: tuple[Any, ...]) -> None:
    for value in OBJECTS:
        text = refused_in_meshconf_s_words(placed(path, value))
        assert "pickle" not in text, text
