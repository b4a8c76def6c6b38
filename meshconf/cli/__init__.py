"""The ``meshconf`` command line: argument parsing and dispatch to one module per verb.

The top layer: may import every layer below (``core``, ``model``, ``sources``, ``features``)
and, lazily, ``runtime``. Nothing in meshconf imports it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from meshconf._version import __version__

if TYPE_CHECKING:
    from meshconf.cli.common import Parser

#: Each verb, in the order ``meshconf --help`` lists them, is the module of the same name.
#: Its ``run`` returns the exit code, or raises what stops it, which ``main`` prints:
#: ``UsageError`` or ``SourceError`` (exit 2, on standard error), ``ConfigError`` (the
#: config's problems, one located line each, exit 1) or ``InvalidInput`` (exit 1); those two
#: on standard error where the verb's parser says it ``prints_data``, else on standard output.
#: ``main`` refuses an ``--out`` that is the verb's input ``path`` before ``run`` starts.
VERBS = ("validate", "show", "simulate", "measure", "schema", "render", "plan", "convert")


def build_parser(verbs: Sequence[str] = VERBS) -> Parser:
    """The parser of ``meshconf``, with a subparser for each of ``verbs``."""
    # Imported here, as the verbs are: after main's first line, since pydantic looks for its
    # plugins as the models are defined, and so that `import meshconf.cli` stays light.
    from meshconf.cli.common import Parser

    parser = Parser(
        prog="meshconf",
        description="Validate and inspect declarative N-D parallel device-mesh configs.",
    )
    parser.add_argument(
        "--version", action="version", version=f"meshconf {__version__}", help="print the version"
    )
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb in verbs:
        importlib.import_module(f"meshconf.cli.{verb}").add_parser(subparsers)
    parser.verbs = subparsers.choices
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # A command validates and exits: looking for pydantic plugins would first read the metadata
    # of every installed package, which costs more than checking a config.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    # Imported after it, as in build_parser.
    from meshconf.cli.common import (
        InvalidInput,
        UsageError,
        invalid,
        prints_data,
        refuse_overwrite,
        usage_error,
    )
    from meshconf.core.errors import ConfigError, SourceError
    from meshconf.core.messages import not_one_of

    arguments = list(sys.argv[1:] if argv is None else argv)
    verb = arguments[0] if arguments and arguments[0] in VERBS else None
    if verb is None and arguments and not arguments[0].startswith("-"):
        # argparse's own message gives no nearest verb
        return usage_error(f"VERB: {not_one_of(arguments[0], VERBS)}")
    # pre-commit hands `validate` one or two files, so start-up is most of its time: a named
    # verb imports its own module only (each verb's features cost tens of milliseconds).
    parser = build_parser(VERBS if verb is None else (verb,))
    try:
        args = parser.parse_command_line(arguments)
        refuse_overwrite(args)
        code: int = args.run(args)
    except (UsageError, SourceError) as error:
        return usage_error(str(error))
    except ConfigError as error:
        lines = [diagnostic.render() for diagnostic in error.diagnostics]
        return invalid(lines, to_stderr=prints_data(args))
    except InvalidInput as error:
        return invalid(error.lines, to_stderr=error.to_stderr or prints_data(args))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
