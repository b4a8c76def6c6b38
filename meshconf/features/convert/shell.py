"""A launch script's commands, each with the variables assigned before it expanded in its
words, and the environment it is started with (:mod:`.shell_words` reads the words).

As bash does, an assignment before a command (``TP=8 cmd``, ``env TP=8 cmd``) is that
command's alone: its words are expanded without it and later lines do not see it; a line of
assignments (``TP=8``, ``export TP=8``, arrays ``ARGS=(--a 1 --b 2)``) is the shell's from
then on, and reaches a command's environment only once exported. What the reader does not
model is refused where it would change what it reports: ``env``'s options that it does not
know (``-S`` splits a string into words), and, for a caller that reads the environment, those
that clear it or take a variable out (``-i``, ``-u``). The variables a script assigns are
bounded, as the words are.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from meshconf.features.convert.shell_words import Tokenizer, Word, source_error

#: Distinct variables a script assigns.
MAX_VARIABLES = 10_000

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Words that may precede an assignment without making it a command.
_DECLARATIONS = ("export", "readonly", "declare", "local")
#: env's options that change nothing meshconf reads: their number of arguments.
_ENV_HARMLESS = {"--": 0, "-C": 1, "--chdir": 1, "-0": 0, "--null": 0, "-v": 0, "--debug": 0}
#: env's options that change the environment: what each does, for the refusal.
_ENV_CHANGING = {
    "-": "starts the command with an empty environment",
    "-i": "starts the command with an empty environment",
    "--ignore-environment": "starts the command with an empty environment",
    "-u": "takes a variable out of the environment",
    "--unset": "takes a variable out of the environment",
}


def commands(text: str, environments: list[list[Word]] | None = None) -> Iterator[list[Word]]:
    """The script's commands, each after the assignments before it took effect. The
    environment each command starts with, as the assignment words that set it (the variables
    exported so far, then the command's own), goes to ``environments`` when given, before the
    command is yielded: that caller reads the environment.

    Raises:
        ConversionError: the script or its expansions pass a bound of this module, bash
            would not run it, or ``env`` is given an option that changes what is reported.
    """
    variables: dict[str, str | list[Word]] = {}
    tokenizer = Tokenizer(text, variables)
    tokens = tokenizer.words()
    pending = tokenizer.pending
    # the word read after an assignment, to be read again: another assignment, or the command
    pushed: list[Word] = []
    command: list[Word] = []
    declaring = False  # after export, declare, ...: names and options, not a command
    exporting = False  # after export or declare -x: the names it marks go to the environment
    env_options: bool | None = None  # after env: True while its options may follow
    environment = _Environment()
    while (word := pushed.pop() if pushed else next(tokens, None)) is not None:
        if word.operator and word.text == "\n":
            if command:
                if environments is not None:
                    environments.append(environment.of_command())
                yield command
            elif env_options is None:
                variables.update(pending)  # a line of assignments: the shell's from now on
                environment.assigned(exporting=exporting)
            command, declaring, exporting, env_options = [], False, False, None
            environment.prefix.clear()
            pending.clear()
            tokenizer.command_started = False
        elif word.operator:
            continue
        elif env_options is not None and not command:
            if _assignment(word):
                environment.prefix.append(word)
            elif env_options and word.text.startswith("-"):
                env_options = _env_option(word, tokens, reads_environment=environments is not None)
            else:
                command.append(word)
        elif command:
            command.append(word)
        elif word.text in _DECLARATIONS:
            declaring, exporting = True, word.text == "export"
        elif _assignment(word):
            name, value = word.text.split("=", 1)
            if name not in variables and len(variables) + len(pending) >= MAX_VARIABLES:
                raise source_error(
                    None,
                    f"more than {MAX_VARIABLES:,} variables assigned; meshconf reads scripts "
                    "with fewer",
                    (word.line, word.column),
                )
            pending[name] = value  # before the next word is read: it may use it
            following = next(tokens, None)
            if value == "" and following is not None and following.text == "(":
                elements: list[Word] = []
                for element in tokens:
                    if element.operator and element.text == ")":
                        break
                    if not element.operator:
                        elements.append(element)
                pending[name] = elements
                continue
            environment.prefix.append(word)
            if following is not None:
                pushed.append(following)
        elif declaring:
            # an option of export or declare, or a name it marks
            if word.text.startswith("-"):
                exporting = exporting or "x" in word.text[1:]
            elif exporting:
                environment.exported.add(word.text)  # now, or once it is assigned
            continue
        elif word.text == "env" or word.text.endswith("/env"):
            env_options = True
            tokenizer.command_started = True
        else:
            command.append(word)
            tokenizer.command_started = True
    if command:
        if environments is not None:
            environments.append(environment.of_command())
        yield command


class _Environment:
    """The variables a script exports, each as the assignment word that set it, and the
    assignments of the command being read."""

    def __init__(self) -> None:
        #: The names exported so far (``export NAME`` may come before ``NAME=value``).
        self.exported: set[str] = set()
        #: The last assignment of each variable of the shell's own.
        self.values: dict[str, Word] = {}
        #: The assignments before the command being read (or of a line of assignments).
        self.prefix: list[Word] = []

    def assigned(self, *, exporting: bool) -> None:
        """The prefix was a line of assignments: the shell's from now on."""
        for word in self.prefix:
            name = word.text.split("=", 1)[0]
            self.values[name] = word
            if exporting:
                self.exported.add(name)

    def of_command(self) -> list[Word]:
        words = {name: word for name, word in self.values.items() if name in self.exported}
        for word in self.prefix:
            words[word.text.split("=", 1)[0]] = word
        return list(words.values())


def _env_option(word: Word, tokens: Iterator[Word], *, reads_environment: bool) -> bool:
    """Read one of env's options (and its argument); whether options may still follow.

    Raises:
        ConversionError: an option the reader does not know, or, when the caller reads
            the environment, one that clears it or takes a variable out.
    """
    option = word.text.split("=", 1)[0]
    if option in _ENV_HARMLESS:
        if _ENV_HARMLESS[option] and "=" not in word.text:
            next(tokens, None)
        return option != "--"
    short_unset = option.startswith("-u") and option != "-u" and not option.startswith("--")
    effect = _ENV_CHANGING.get("-u" if short_unset else option)
    if effect is None:
        raise source_error(
            None,
            f"env's option {word.text} is one meshconf does not read: it may change the "
            "command's words or its environment; write the command and its NAME=value "
            "assignments without env",
            (word.line, word.column),
        )
    if reads_environment:
        raise source_error(
            None,
            f"env {word.text} {effect}, which meshconf does not follow when it reads the "
            "environment a script sets; set the variables the command needs with NAME=value "
            "before it instead",
            (word.line, word.column),
        )
    if effect.startswith("takes") and not short_unset and "=" not in word.text:
        next(tokens, None)
    return True


def _assignment(word: Word) -> bool:
    name, equals, _ = word.text.partition("=")
    return bool(equals) and _NAME.fullmatch(name) is not None
