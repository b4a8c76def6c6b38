"""A launch script's words as a shell would expand them, within bounds; the script is read,
never run.

What is expanded: assignments (``TP=8``, ``export TP=8``, arrays ``ARGS=(--a 1 --b 2)``),
``$NAME``, ``${NAME}``, ``${NAME:-default}``, ``${NAME[@]}`` and ``$(( ... ))`` over
integers of at most 18 digits with ``+ - * / %`` and parentheses. Quotes, backslashes,
comments, line continuations and the separators ``; | & ( )`` are understood. Anything else
(command substitution, positional parameters, other parameter expansions, arithmetic past
the bounds) stays as written, and :func:`unexpanded` names it if a setting needs its value.

Every bound is checked as the text is read, so that no script can make the reader take
more than a few seconds or grow past a few MiB: the script's size, the text its expansions
produce, the words they produce, the variables assigned, and the length of an arithmetic
expression. Past one, reading stops with a located line naming the bound.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from meshconf.features.convert.common import ConversionError, SourceProblem

#: Characters of a script or command line; a launch script is a few KiB.
MAX_SCRIPT_CHARS = 1 << 18
#: Characters all expansions produce together.
MAX_EXPANDED_CHARS = 1 << 20
#: Words all expansions produce together, array elements included.
MAX_EXPANDED_WORDS = 100_000
#: Distinct variables a script assigns.
MAX_VARIABLES = 10_000
#: Characters of one ``$(( ... ))`` once its variables are substituted.
MAX_ARITHMETIC_CHARS = 256
#: Digits of one integer in arithmetic, and the range of every result.
MAX_ARITHMETIC_DIGITS = 18
ARITHMETIC_RANGE = 2**63

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Characters that stand for themselves: outside quotes, in double quotes, in single quotes.
_RUNS = {
    None: re.compile(r"[^'\"\\$`\s;|&()]+"),
    '"': re.compile(r'[^"\\$`]+'),
    "'": re.compile(r"[^']+"),
}
_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\]|:-([^}]*))?\}")
_PLAIN = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?])")
#: Words that may precede an assignment without making it a command.
_DECLARATIONS = ("export", "readonly", "declare", "local")
_OPERATORS: dict[type, Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
    ast.Mod: operator.mod,
}
_SIGNS: dict[type, Callable[[int], int]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


@dataclass(frozen=True)
class Word:
    text: str
    line: int
    column: int
    operator: bool = False


def source_error(
    key: str | None, message: str, position: tuple[int, int] | None
) -> ConversionError:
    return ConversionError([SourceProblem("", key, message, position)])


def _arithmetic(text: str, variables: dict[str, str | list[Word]]) -> str | None:
    """The value of ``$(( text ))``, or None when it is not arithmetic this reader does."""

    def value_of(match: re.Match[str]) -> str:
        value = variables.get(match[1])
        return value if isinstance(value, str) else match[0]

    expanded = re.sub(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", value_of, text).strip()
    if len(expanded) > MAX_ARITHMETIC_CHARS or re.search(
        rf"[0-9]{{{MAX_ARITHMETIC_DIGITS + 1}}}", expanded
    ):
        return None

    def evaluate(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            result = evaluate(node.body)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            result = node.value
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _SIGNS:
            result = _SIGNS[type(node.op)](evaluate(node.operand))
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            result = _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
        else:
            raise ValueError(text)
        if abs(result) >= ARITHMETIC_RANGE:
            raise ValueError(text)
        return result

    try:
        return str(evaluate(ast.parse(expanded, mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


class _Tokenizer:
    """Words of a shell text, with variables expanded as :func:`commands` assigns them."""

    def __init__(self, text: str, variables: dict[str, str | list[Word]]) -> None:
        if len(text) > MAX_SCRIPT_CHARS:
            raise source_error(
                None,
                f"{len(text):,} characters, more than the {MAX_SCRIPT_CHARS:,} a launch script "
                "may have",
                None,
            )
        self.text, self.variables = text, variables
        self.index, self.line, self.column = 0, 1, 1
        self.expanded_chars = self.expanded_words = 0
        self._closing = (-1, -1)  # (searched from, found at) of the last search for "))"

    def _advance(self, count: int = 1) -> None:
        end = self.index + count
        breaks = self.text.count("\n", self.index, end)
        if breaks:
            self.line += breaks
            self.column = end - self.text.rfind("\n", self.index, end)
        else:
            self.column += count
        self.index = end

    def _closing_parentheses(self) -> int:
        """Where the ``))`` after this ``$((`` is, or -1. Each character is searched once
        over the whole text: the last answer holds for every start before it."""
        searched_from, found = self._closing
        still_true = 0 <= searched_from <= self.index and (found < 0 or found >= self.index)
        if not still_true:
            found = self.text.find("))", self.index)
            self._closing = (self.index, found)
        return found

    def _charge(self, chars: int, words: int, at: tuple[int, int]) -> None:
        """Count what one expansion produced against the bounds of the whole script."""
        self.expanded_chars += chars
        self.expanded_words += words
        if self.expanded_chars > MAX_EXPANDED_CHARS:
            raise source_error(
                None,
                f"the expansions up to here make more than {MAX_EXPANDED_CHARS:,} characters; "
                "meshconf reads scripts whose variables expand to less",
                at,
            )
        if self.expanded_words > MAX_EXPANDED_WORDS:
            raise source_error(
                None,
                f"the expansions up to here make more than {MAX_EXPANDED_WORDS:,} words; "
                "meshconf reads scripts whose variables expand to fewer",
                at,
            )

    def _expand(self) -> tuple[str, list[Word] | None]:
        """The expansion at a ``$``: its text, or the words of a whole array."""
        at = (self.line, self.column)
        if self.text.startswith("$((", self.index):
            end = self._closing_parentheses()
            if end > 0:
                inner = self.text[self.index + 3 : end]
                self._advance(end + 2 - self.index)
                result = _arithmetic(inner, self.variables)
                return (f"$(({inner}))" if result is None else result), None
        match = _BRACED.match(self.text, self.index) or _PLAIN.match(self.text, self.index)
        if match is None:
            self._advance()
            return "$", None
        self._advance(len(match[0]))
        value = self.variables.get(match[1])
        if isinstance(value, list):
            self._charge(sum(len(word.text) + 1 for word in value), len(value), at)
            return " ".join(word.text for word in value), value
        if value is None:
            default = match.group(3) if match.re.groups >= 3 else None
            return (match[0] if default is None else default), None
        self._charge(len(value), 1, at)
        return value, None

    def words(self) -> Iterator[Word]:
        text = self.text
        while self.index < len(text):
            char = text[self.index]
            if char == "\\" and text[self.index + 1 : self.index + 2] == "\n":
                self._advance(2)
            elif char in " \t\r":
                self._advance()
            elif char == "#":
                end = text.find("\n", self.index)
                self._advance((len(text) if end < 0 else end) - self.index)
            elif char in "\n;|&()":
                yield Word("\n" if char in ";|&" else char, self.line, self.column, True)
                self._advance()
            else:
                yield from self._word()

    def _word(self) -> Iterator[Word]:
        line, column, parts, quote = self.line, self.column, [], None
        text = self.text
        while self.index < len(text):
            char = text[self.index]
            if quote is None and self._at_word_end():
                break
            run = _RUNS[quote].match(text, self.index)
            if run is not None:  # characters that stand for themselves, all at once
                parts.append(run[0])
                self._advance(len(run[0]))
            elif char in "'\"" and quote in (None, char):
                quote = None if quote else char
                self._advance()
            elif char == "\\" and quote != "'" and self.index + 1 < len(text):
                parts.append(text[self.index + 1])
                self._advance(2)
            elif char in "$`" and quote != "'" and (end := self._substitution()) > 0:
                # Command substitution stays as written, in one piece.
                parts.append(text[self.index : end])
                self._advance(end - self.index)
            elif char == "$" and quote != "'":
                expanded, array = self._expand()
                if array is not None and quote is None and not parts and self._at_word_end():
                    yield from array
                    return
                if quote is None and not parts and self._at_word_end() and " " in expanded:
                    for piece in expanded.split():
                        yield Word(piece, line, column)
                    return
                parts.append(expanded)
            else:
                parts.append(char)
                self._advance()
        yield Word("".join(parts), line, column)

    def _substitution(self) -> int:
        """The end of a command substitution ``$(...)`` or ```...``` starting here (its
        first closing character, on the same line), or -1."""
        text, start = self.text, self.index
        if text.startswith("$((", start):
            return -1
        if text.startswith("$(", start):
            closing = ")"
        elif text.startswith("`", start):
            closing = "`"
        else:
            return -1
        end = text.find(closing, start + 1, self._line_end())
        return -1 if end < 0 else end + 1

    def _line_end(self) -> int:
        end = self.text.find("\n", self.index)
        return len(self.text) if end < 0 else end

    def _at_word_end(self) -> bool:
        rest = self.text[self.index : self.index + 2]
        return not rest or rest[0] in " \t\r\n;|&()" or rest == "\\\n"


def commands(text: str, assignments: list[Word] | None = None) -> Iterator[list[Word]]:
    """The script's commands, each after the assignments before it took effect; each
    assignment's word (``NAME=value``, expanded) is added to ``assignments`` when given, for
    a source that reads the environment a script sets.

    Raises:
        ConversionError: the script or its expansions pass a bound of this module.
    """
    variables: dict[str, str | list[Word]] = {}
    tokens = _Tokenizer(text, variables).words()
    # the word read after an assignment, to be read again: another assignment, or the command
    pushed: list[Word] = []
    command: list[Word] = []
    while (word := pushed.pop() if pushed else next(tokens, None)) is not None:
        if word.operator and word.text == "\n":
            if command:
                yield command
            command = []
        elif not word.operator and not command and word.text in _DECLARATIONS:
            continue
        elif not word.operator and not command and _assignment(word):
            name, value = word.text.split("=", 1)
            if name not in variables and len(variables) >= MAX_VARIABLES:
                raise source_error(
                    None,
                    f"more than {MAX_VARIABLES:,} variables assigned; meshconf reads scripts "
                    "with fewer",
                    (word.line, word.column),
                )
            following = next(tokens, None)
            if value == "" and following is not None and following.text == "(":
                elements: list[Word] = []
                for element in tokens:
                    if element.operator and element.text == ")":
                        break
                    if not element.operator:
                        elements.append(element)
                variables[name] = elements
                continue
            variables[name] = value
            if assignments is not None:
                assignments.append(word)
            if following is not None:
                pushed.append(following)
        elif not word.operator:
            command.append(word)
    if command:
        yield command


def _assignment(word: Word) -> bool:
    name, equals, _ = word.text.partition("=")
    return bool(equals) and _NAME.fullmatch(name) is not None


def unexpanded(value: str) -> str | None:
    """What in a value the reader left as written, in words, or None if nothing."""
    if "$((" in value:
        return (
            f"arithmetic meshconf does not evaluate: it reads integers of at most "
            f"{MAX_ARITHMETIC_DIGITS} digits, + - * / % and parentheses, in at most "
            f"{MAX_ARITHMETIC_CHARS} characters, with results below 2**63"
        )
    if "$(" in value or "`" in value:
        return "command substitution, which meshconf does not run"
    if re.search(r"\$([0-9@*#?]|\{[0-9@*#?])", value):
        return "a positional parameter or special variable, which only running the script sets"
    if "${" in value:
        return (
            "a parameter expansion meshconf does not do: it expands ${NAME}, ${NAME:-default} "
            "and ${NAME[@]}"
        )
    if _PLAIN.search(value):
        return "a shell variable the script does not set"
    return None
