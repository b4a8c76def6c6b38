"""The words of a shell text as bash reads them, the text read and never run, within
bounds.

Quotes, backslashes, comments, line continuations and the separators ``; | & ( )`` are
understood. Expanded, from the variables the caller has assigned: ``$NAME``, ``${NAME}``,
``${NAME:-default}``, ``${NAME[@]}`` and ``$(( ... ))`` (:mod:`.shell_arithmetic`).
Redirections (``> log 2>&1``) are not words, and a here-document's body (``<<EOF`` to the
line ``EOF``, ``<<-``, quoted or not) is data, never a command. Anything else (command
substitution, positional parameters, other parameter expansions) stays as written, and
:func:`unexpanded` names it if a setting needs its value.

A text bash would not run is refused at the line bash names: a quote, a backtick or a ``$(``
never closed, a redirection without its word, a here-document no line ends. The text's size,
and the characters and words its expansions produce, are bounded as it is read, so that no
script makes the reader take more than a few seconds or a few MiB; past one, reading stops
with a located line naming the bound.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from meshconf.features.convert.draft import ConversionError, SourceProblem
from meshconf.features.convert.shell_arithmetic import (
    MAX_ARITHMETIC_CHARS,
    MAX_ARITHMETIC_DIGITS,
    arithmetic,
)

#: Characters of a script or command line; a launch script is a few KiB.
MAX_SCRIPT_CHARS = 1 << 18
#: Characters all expansions produce together.
MAX_EXPANDED_CHARS = 1 << 20
#: Words all expansions produce together, array elements included.
MAX_EXPANDED_WORDS = 100_000

#: Characters that stand for themselves: outside quotes, in double quotes, in single quotes.
_RUNS = {
    None: re.compile(r"[^'\"\\$`\s;|&()<>]+"),
    '"': re.compile(r'[^"\\$`]+'),
    "'": re.compile(r"[^']+"),
}
_BRACED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\]|:-([^}]*))?\}")
_PLAIN = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*|[0-9@*#?])")
#: The start of a word that assigns, when it comes before the command.
_ASSIGNING = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
#: A redirection operator, with the file descriptor written before it.
_REDIRECTION = re.compile(r"[0-9]*(?:<<<|<<-|<<|<>|<&|>&|>>|>\||<|>)|&>>|&>")
#: Characters that end an unquoted word.
_WORD_END = " \t\r\n;|&()<>"


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


class Tokenizer:
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
        #: Assignments before a command not yet known to follow: seen only by later
        #: assignments of the same command (bash expands the command's words without them).
        self.pending: dict[str, str | list[Word]] = {}
        #: Set by :func:`commands` once the command's first word is read.
        self.command_started = False
        self._assigning = False
        self.index, self.line, self.column = 0, 1, 1
        self.expanded_chars = self.expanded_words = 0
        self._closing = (-1, -1)  # (searched from, found at) of the last search for "))"
        self._last = {closing: text.rfind(closing) for closing in ")`"}
        #: Here-documents whose body starts after the current line: delimiter, whether
        #: leading tabs are stripped (``<<-``), and where the operator is.
        self._heredocs: list[tuple[str, bool, tuple[int, int]]] = []

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

    def _value(self, name: str) -> str | list[Word] | None:
        if self._assigning and name in self.pending:
            return self.pending[name]
        return self.variables.get(name)

    def _expand(self) -> tuple[str, list[Word] | None]:
        """The expansion at a ``$``: its text, or the words of a whole array."""
        at = (self.line, self.column)
        if self.text.startswith("$((", self.index):
            end = self._closing_parentheses()
            if end > 0:
                inner = self.text[self.index + 3 : end]
                self._advance(end + 2 - self.index)
                scope = self.variables
                if self._assigning and self.pending:
                    scope = {**self.variables, **self.pending}
                result = arithmetic(inner, scope)
                return (f"$(({inner}))" if result is None else result), None
        match = _BRACED.match(self.text, self.index) or _PLAIN.match(self.text, self.index)
        if match is None:
            self._advance()
            return "$", None
        self._advance(len(match[0]))
        value = self._value(match[1])
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
                self._advance(self._line_end() - self.index)
            elif (substituted := self._process_substitution()) > 0:
                yield Word(text[self.index : substituted], self.line, self.column)
                self._advance(substituted - self.index)
            elif (redirection := _REDIRECTION.match(text, self.index)) is not None:
                self._redirection(redirection[0])
            elif char in "\n;|&()":
                yield Word("\n" if char in ";|&" else char, self.line, self.column, True)
                self._advance()
                if char == "\n":
                    self._heredoc_bodies()
            else:
                yield from self._word()
        if self._heredocs:
            delimiter, _, at = self._heredocs[0]
            raise _unended_heredoc(delimiter, at)

    def _process_substitution(self) -> int:
        """The end of ``<(...)`` or ``>(...)`` starting here (its first ``)``, on the same
        line), or -1: a word bash replaces with a file name, kept as written."""
        if self.text[self.index : self.index + 2] not in ("<(", ">("):
            return -1
        end = self.text.find(")", self.index, self._line_end())
        return -1 if end < 0 else end + 1

    def _redirection(self, operator: str) -> None:
        """Read a redirection and its word, which are no words of the command; a
        here-document's delimiter is kept for the body after this line."""
        at = (self.line, self.column)
        self._advance(len(operator))
        while self.index < len(self.text) and self.text[self.index] in " \t":
            self._advance()
        if self._at_word_end():
            following = self.text[self.index : self.index + 1]
            if following in ("", "\r", "\n"):
                following = "newline"
            raise source_error(
                None,
                f"syntax error near unexpected token `{following}': the redirection "
                f"`{operator}` needs a word after it; write the file (or here-document "
                "delimiter) after it, or remove it",
                at,
            )
        kind = operator.lstrip("0123456789")
        if kind in ("<<", "<<-"):
            self._heredocs.append((self._delimiter(), kind == "<<-", at))
        else:
            for _ in self._word():
                pass

    def _delimiter(self) -> str:
        """A here-document's delimiter, its quotes removed; its text is never expanded."""
        text, parts, quote, quote_at = self.text, [], None, (self.line, self.column)
        while self.index < len(text):
            char = text[self.index]
            if quote is None and char in _WORD_END:
                break
            if char in "'\"" and quote in (None, char):
                quote, quote_at = (None if quote else char), (self.line, self.column)
                self._advance()
            elif char == "\\" and quote != "'" and self.index + 1 < len(text):
                parts.append(text[self.index + 1])
                self._advance(2)
            else:
                parts.append(char)
                self._advance()
        if quote is not None:
            raise _unclosed(quote, quote_at)
        return "".join(parts)

    def _heredoc_bodies(self) -> None:
        """Skip the bodies of the here-documents of the line just ended, in order: bash
        reads them as data for their commands, never as commands."""
        text = self.text
        for delimiter, strip_tabs, at in self._heredocs:
            while True:
                if self.index >= len(text):
                    raise _unended_heredoc(delimiter, at)
                end = self._line_end()
                line = text[self.index : end]
                self._advance(min(end + 1, len(text)) - self.index)
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    break
        self._heredocs = []

    def _word(self) -> Iterator[Word]:
        line, column, parts, quote = self.line, self.column, [], None
        quote_at = (line, column)
        text = self.text
        self._assigning = (
            not self.command_started and _ASSIGNING.match(text, self.index) is not None
        )
        while self.index < len(text):
            char = text[self.index]
            if quote is None and self._at_word_end():
                break
            run = _RUNS[quote].match(text, self.index)
            if run is not None:  # characters that stand for themselves, all at once
                parts.append(run[0])
                self._advance(len(run[0]))
            elif char in "'\"" and quote in (None, char):
                quote, quote_at = (None if quote else char), (self.line, self.column)
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
        if quote is not None:
            raise _unclosed(quote, quote_at)
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
        if self._last[closing] <= start:
            raise _unclosed("$(" if closing == ")" else "`", (self.line, self.column))
        end = text.find(closing, start + 1, self._line_end())
        return -1 if end < 0 else end + 1

    def _line_end(self) -> int:
        end = self.text.find("\n", self.index)
        return len(self.text) if end < 0 else end

    def _at_word_end(self) -> bool:
        rest = self.text[self.index : self.index + 2]
        return not rest or rest[0] in _WORD_END or rest == "\\\n"


def _unended_heredoc(delimiter: str, at: tuple[int, int]) -> ConversionError:
    return source_error(
        None,
        f"here-document at line {at[0]} delimited by end-of-file (wanted `{delimiter}'): "
        "bash would read the rest of the script as its text; end it with a line that is "
        f"exactly {delimiter}",
        at,
    )


def _unclosed(opening: str, at: tuple[int, int]) -> ConversionError:
    closing = ")" if opening == "$(" else opening
    return source_error(
        None,
        f"unexpected EOF while looking for matching `{closing}': the {opening} here is never "
        f"closed, so bash would not run the script; close it",
        at,
    )


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
