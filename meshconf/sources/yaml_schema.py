"""What YAML meshconf reads: YAML 1.2's core schema for plain scalars, the tags of plain data
and nothing else, and the characters YAML allows; and the loader that constructs it, merge
keys as the YAML merge spec ranks them and integers of at most ``MAX_INT_DIGITS`` digits."""

from __future__ import annotations

import re

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import BaseResolver

from meshconf.core.messages import shorten

#: The most digits an integer may have: a longer one is refused before it is converted.
MAX_INT_DIGITS = 30
MERGE_TAG = "tag:yaml.org,2002:merge"
_STR_TAG = "tag:yaml.org,2002:str"
NULL_TAG = "tag:yaml.org,2002:null"
_TAG_PREFIX = "tag:yaml.org,2002:"
_KNOWN_TAGS = frozenset({"bool", "int", "float", "null", "str", "merge", "map", "seq"})
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_REFUSED_TAGS = {
    "set": "a !!set has no order, and where order matters the layout would depend on the "
    "hash seed; write a list such as [pp, tp]",
    "omap": "!!omap is not supported; write a mapping",
    "pairs": "!!pairs is not supported; write a mapping",
    "timestamp": "!!timestamp is not supported; no meshconf key holds a date",
    "binary": "!!binary is not supported; no meshconf key holds bytes",
}
_ALLOWED_ASCII = bytes([9, 10, 13, *range(0x20, 0x7F)])
# Characters YAML 1.2 does not allow in a stream (NUL, other C0/C1 controls, surrogates,
# U+FFFE, U+FFFF).
_FORBIDDEN = re.compile("[^\t\n\r\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


class CoreResolver(BaseResolver):
    """YAML 1.2 core schema, plus ``<<`` merge keys."""


_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?(?:0|[1-9][0-9]*)|0x[0-9a-fA-F]+|0o[0-7]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*|[0-9]+(?:\.[0-9]*)?[eE][-+]?[0-9]+)"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
CoreResolver.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
CoreResolver.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
CoreResolver.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))
CoreResolver.add_implicit_resolver(NULL_TAG, _NULL, ["~", "n", "N", ""])
CoreResolver.add_implicit_resolver(MERGE_TAG, re.compile(r"^(?:<<)$"), ["<"])

#: What an explicit scalar tag accepts: the text YAML 1.2's core schema reads as that type.
_SCALAR_FORMS: dict[str, tuple[tuple[re.Pattern[str], ...], str]] = {
    "bool": ((_BOOL,), "true or false"),
    "int": ((_INT,), "an integer such as 8, 0x10 or 0o10"),
    "float": ((_FLOAT, _INT), "a number such as 1.5, 2e3 or .inf"),
    "null": ((_NULL,), "null, ~ or nothing"),
}


def tag_problem(node: Node) -> str | None:
    """Why ``node``'s tag is refused (not plain data, or disagreeing with its text), or None."""
    tag = node.tag
    if tag == _STR_TAG and isinstance(node, ScalarNode):
        return None
    short = tag[len(_TAG_PREFIX) :] if tag.startswith(_TAG_PREFIX) else None
    if short in _REFUSED_TAGS:
        return _REFUSED_TAGS[short]
    if short not in _KNOWN_TAGS:
        shown = f"!!{short}" if short is not None else tag
        return f"unknown tag {shown}; meshconf configs hold plain data only"
    if isinstance(node, ScalarNode):
        if short in _SCALAR_FORMS:
            patterns, wanted = _SCALAR_FORMS[short]
            text = str(node.value)
            if not any(pattern.match(text) for pattern in patterns):
                return f"!!{short} needs {wanted}, got {shorten(text)!r}"
        elif short not in ("str", "merge"):
            return f"!!{short} cannot tag a scalar"
    elif tag != (_MAP_TAG if isinstance(node, MappingNode) else _SEQ_TAG):
        kind = "a mapping" if isinstance(node, MappingNode) else "a list"
        return f"!!{short} cannot tag {kind}"
    return None


def forbidden_character(text: str) -> int | None:
    """The index of the first character YAML does not allow in ``text``, or None."""
    if text.isascii() and not text.encode("ascii").translate(None, _ALLOWED_ASCII):
        return None  # the common case, checked in C
    bad = _FORBIDDEN.search(text)
    return None if bad is None else bad.start()


def merge_sources(value_node: Node) -> list[Node]:
    """What a ``<<`` merges: the node after it, or each node of the list after it."""
    return list(value_node.value) if isinstance(value_node, SequenceNode) else [value_node]


class _Constructor(SafeConstructor):
    def flatten_mapping(self, node: MappingNode) -> None:
        """Replace ``<<`` pairs by the pairs they merge, in the order the YAML merge spec
        ranks them: construction keeps the last of equal keys, so the lowest rank comes first
        (the last mapping listed after ``<<``, ..., the first one, then the mapping's own)."""
        own: list[tuple[Node, Node]] = []
        merged: list[list[tuple[Node, Node]]] = []
        for key_node, value_node in node.value:
            if key_node.tag != MERGE_TAG:
                own.append((key_node, value_node))
                continue
            for source in merge_sources(value_node):
                if not isinstance(source, MappingNode):
                    raise ConstructorError(
                        None,
                        None,
                        "a merge key (<<) takes a mapping or a list of mappings",
                        source.start_mark,
                    )
                self.flatten_mapping(source)
                merged.append(source.value)
        node.value = [pair for pairs in reversed(merged) for pair in pairs] + own

    def construct_core_int(self, node: ScalarNode) -> int:
        text = str(self.construct_scalar(node))
        digits = text.lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise ConstructorError(
                None, None, f"integer with more than {MAX_INT_DIGITS} digits", node.start_mark
            )
        if digits.startswith("0x"):
            value = int(digits[2:], 16)
        elif digits.startswith("0o"):
            value = int(digits[2:], 8)
        else:
            value = int(digits)
        return -value if text.startswith("-") else value


_Constructor.add_constructor(  # type: ignore[type-var]
    "tag:yaml.org,2002:int", _Constructor.construct_core_int
)

try:
    from yaml._yaml import CParser as _Parser
except ImportError:  # PyYAML built without libyaml

    class _Parser(  # type: ignore[no-redef]
        yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser, yaml.composer.Composer
    ):
        def __init__(self, stream: str) -> None:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)


class Loader(_Parser, _Constructor, CoreResolver):
    """PyYAML's safe loading with the core schema's resolver and meshconf's construction."""

    def __init__(self, stream: str) -> None:
        _Parser.__init__(self, stream)
        _Constructor.__init__(self)
        CoreResolver.__init__(self)
