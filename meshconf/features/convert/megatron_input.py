"""Megatron-LM's parallelism settings, read from a command line, from the launch line of a
shell script, or from a YAML file as NeMo writes them; each setting keeps where it was
written, so that a problem with it is reported at its line and column.

Shell scripts are read, not run: assignments (``TP=8``, ``ARGS=(--a 1 --b 2)``,
``WORLD=$((8 * 4))``) are expanded where later lines use them; anything that only running
the script would give (the environment, command output, positional parameters) stays as
written, and a setting that needs it is reported.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from meshconf.features.convert.common import ConversionError, SourceProblem
from meshconf.sources.yaml_reader import YamlError, read_yaml

#: Megatron's arguments that set a mesh size, by their name with ``_`` for ``-``.
SIZE_SETTINGS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "num_distributed_optimizer_instances",
)
#: Switches: present means true.
FLAG_SETTINGS = ("use_tp_pp_dp_mapping", "use_distributed_optimizer")
#: Megatron-Core's ``initialize_model_parallel(order=...)``, such as ``tp-cp-ep-dp-pp``.
ORDER_SETTING = "order"
#: torchrun's options that give the world size.
LAUNCH_SETTINGS = ("nproc_per_node", "nnodes")
#: NeMo's trainer keys that give the world size.
NEMO_WORLD: dict[tuple[str | int, ...], str] = {
    ("trainer", "devices"): "nproc_per_node",
    ("trainer", "num_nodes"): "nnodes",
}

_VALUED = (*SIZE_SETTINGS, ORDER_SETTING)
_LAUNCHERS = re.compile(r"(.*/)?(torchrun|torch\.distributed\.(run|launch))$")
_SCRIPT = re.compile(r".*\.py$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Words that may precede an assignment without making it a command.
_DECLARATIONS = ("export", "readonly", "declare", "local")
_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
}


@dataclass(frozen=True)
class Setting:
    """One setting: its canonical name, the key as written, its value and its position."""

    name: str
    key: str
    value: Any
    position: tuple[int, int] | None


@dataclass(frozen=True)
class _Word:
    text: str
    line: int
    column: int
    operator: bool = False


def _fail(key: str | None, message: str, position: tuple[int, int] | None) -> ConversionError:
    return ConversionError([SourceProblem("", key, message, position)])


def _arithmetic(text: str, variables: Mapping[str, Any]) -> str:
    """``$(( ... ))`` over integers and the script's variables; the text itself if it
    uses anything else."""
    expanded = re.sub(
        r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
        lambda match: str(variables.get(match[1], match[0])),
        text,
    )

    def evaluate(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return evaluate(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        raise ValueError(text)

    try:
        return str(evaluate(ast.parse(expanded.strip(), mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError):
        return f"$(({text}))"


class _Tokenizer:
    """Words of a shell text, with variables expanded as the reader assigns them."""

    def __init__(self, text: str, variables: dict[str, Any]) -> None:
        self.text, self.variables = text, variables
        self.index, self.line, self.column = 0, 1, 1

    def _advance(self, count: int = 1) -> None:
        for _ in range(count):
            if self.text[self.index] == "\n":
                self.line, self.column = self.line + 1, 1
            else:
                self.column += 1
            self.index += 1

    def _expand(self) -> tuple[str, list[_Word] | None]:
        """The expansion at a ``$``: its text, or the words of a whole array."""
        rest = self.text[self.index :]
        if rest.startswith("$(("):
            end = rest.find("))")
            if end > 0:
                self._advance(end + 2)
                return _arithmetic(rest[3:end], self.variables), None
        match = re.match(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\]|:-([^}]*))?\}", rest) or (
            re.match(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?])", rest)
        )
        if match is None:
            self._advance()
            return "$", None
        self._advance(len(match[0]))
        value = self.variables.get(match[1])
        if isinstance(value, list):
            return " ".join(word.text for word in value), value
        if value is None:
            default = match.group(3) if match.re.groups >= 3 else None
            return (match[0] if default is None else default), None
        return str(value), None

    def words(self) -> Iterator[_Word]:
        text = self.text
        while self.index < len(text):
            char = text[self.index]
            if char == "\\" and text[self.index + 1 : self.index + 2] == "\n":
                self._advance(2)
            elif char in " \t\r":
                self._advance()
            elif char == "#":
                while self.index < len(text) and text[self.index] != "\n":
                    self._advance()
            elif char in "\n;|&()":
                yield _Word("\n" if char in ";|&" else char, self.line, self.column, True)
                self._advance()
            else:
                yield from self._word()

    def _word(self) -> Iterator[_Word]:
        line, column, parts, quote = self.line, self.column, [], None
        text = self.text
        while self.index < len(text):
            char = text[self.index]
            if quote is None and self._at_word_end():
                break
            if char in "'\"" and quote in (None, char):
                quote = None if quote else char
                self._advance()
            elif char == "\\" and quote != "'" and self.index + 1 < len(text):
                parts.append(text[self.index + 1])
                self._advance(2)
            elif char == "$" and quote != "'":
                expanded, array = self._expand()
                if array is not None and quote is None and not parts and self._at_word_end():
                    yield from array
                    return
                if quote is None and not parts and self._at_word_end() and " " in expanded:
                    for piece in expanded.split():
                        yield _Word(piece, line, column)
                    return
                parts.append(expanded)
            else:
                parts.append(char)
                self._advance()
        yield _Word("".join(parts), line, column)

    def _at_word_end(self) -> bool:
        rest = self.text[self.index : self.index + 2]
        return not rest or rest[0] in " \t\r\n;|&()" or rest == "\\\n"


def _commands(text: str) -> Iterator[list[_Word]]:
    """The script's commands, after the assignments before them took effect."""
    variables: dict[str, Any] = {}
    tokens = _Tokenizer(text, variables).words()
    command: list[_Word] = []
    for word in tokens:
        if word.operator and word.text == "\n":
            if command:
                yield command
            command = []
        elif not word.operator and not command and word.text in _DECLARATIONS:
            continue
        elif not word.operator and not command and _assignment(word):
            name, value = word.text.split("=", 1)
            following = next(tokens, None)
            if value == "" and following is not None and following.text == "(":
                elements: list[_Word] = []
                for element in tokens:
                    if element.operator and element.text == ")":
                        break
                    if not element.operator:
                        elements.append(element)
                variables[name] = elements
                continue
            variables[name] = value
            if following is not None and not (following.operator and following.text == "\n"):
                command.append(following)
        elif not word.operator:
            command.append(word)
    if command:
        yield command


def _assignment(word: _Word) -> bool:
    name, equals, _ = word.text.partition("=")
    return bool(equals) and _NAME.fullmatch(name) is not None


def _settings_from_words(words: list[_Word], names: tuple[str, ...]) -> dict[str, Setting]:
    """``--name value``, ``--name=value`` and switches among ``words``; the last one wins,
    as with Megatron's argument parser."""
    found: dict[str, Setting] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.text.startswith("--"):
            continue
        flag, equals, inline = word.text.partition("=")
        name = flag[2:].replace("-", "_")
        if name not in names:
            continue
        if name in FLAG_SETTINGS:
            found[name] = Setting(name, flag, True, (word.line, word.column))
            continue
        if equals:
            found[name] = Setting(name, flag, inline, (word.line, word.column + len(flag) + 1))
            continue
        if index >= len(words) or words[index].text.startswith("--"):
            raise _fail(flag, "needs a value", (word.line, word.column))
        value = words[index]
        index += 1
        found[name] = Setting(name, flag, value.text, (value.line, value.column))
    return found


def read_command_line(text: str) -> dict[str, Setting]:
    """The settings of a shell script's launch line (``torchrun ... pretrain_gpt.py ...``)
    or of a command line: Megatron's arguments after the training script, torchrun's
    ``--nproc-per-node`` and ``--nnodes`` before it.

    Raises :class:`ConversionError` when the text has no launch line (only a script's
    does: a bare command line is all Megatron arguments) or an argument lacks its value.
    """
    commands = list(_commands(text))
    launch = next(
        (
            command
            for command in commands
            if any(
                _LAUNCHERS.fullmatch(word.text) or _SCRIPT.fullmatch(word.text) for word in command
            )
        ),
        None,
    )
    if launch is None:
        if len(commands) > 1:
            raise _fail(
                None,
                "found no launch line: expected a command that runs torchrun or a Megatron "
                "training script such as pretrain_gpt.py",
                None,
            )
        launch = commands[0] if commands else []
    script = next((i for i, word in enumerate(launch) if _SCRIPT.fullmatch(word.text)), -1)
    settings = _settings_from_words(launch[script + 1 :], (*_VALUED, *FLAG_SETTINGS))
    launcher = launch[: max(script, 0)]
    return {**_settings_from_words(launcher, LAUNCH_SETTINGS), **settings}


def read_nemo_yaml(text: str) -> dict[str, Setting]:
    """The settings of a YAML file as NeMo writes them (``model.tensor_model_parallel_size``,
    ``trainer.strategy.…``, ``trainer.devices`` and ``trainer.num_nodes``), wherever they
    sit in the file.

    Raises :class:`ConversionError` for YAML that cannot be read, or a setting written twice
    with different values.
    """
    try:
        document = read_yaml(text)
    except YamlError as error:
        position = None if error.position is None else (error.position.line, error.position.column)
        raise _fail(None, f"invalid YAML: {error.message}", position) from None
    found: dict[str, Setting] = {}
    wanted = (*_VALUED, *FLAG_SETTINGS)

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if not isinstance(node, Mapping):
            return
        for key, value in node.items():
            here = (*path, key)
            name = NEMO_WORLD.get(here[-2:]) if len(here) >= 2 else None
            name = name or (str(key) if key in wanted else None)
            if name is None:
                walk(value, here)
                continue
            at = document.positions.get(here)
            position = None if at is None else (at.line, at.column)
            dotted = ".".join(str(part) for part in here)
            if name in found and found[name].value != value:
                first = found[name]
                raise _fail(
                    dotted,
                    f"{value!r} here but {first.value!r} at {first.key}: which one is meant?",
                    position,
                )
            found[name] = Setting(name, dotted, value, position)

    walk(document.data, ())
    return found
