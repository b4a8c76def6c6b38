"""``meshconf validate PATH...``: check configs; one located line per problem."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from meshconf.cli.common import (
    EXIT_INVALID,
    EXIT_OK,
    EXIT_USAGE,
    add_source_options,
    emit,
    warnings_json,
)
from meshconf.cli.model_arguments import MODEL_OPTIONS, add_model_options
from meshconf.core.errors import (
    ConfigError,
    Diagnostic,
    Problem,
    SourceError,
    format_key,
    printable,
)
from meshconf.features.plan.topology import config_warnings
from meshconf.model.config import MeshConfig
from meshconf.sources.loading import load_located
from meshconf.sources.reading import Source


@dataclass
class FileResult:
    path: str
    config: MeshConfig | None = None
    diagnostics: tuple[Diagnostic, ...] = ()
    source_error: str | None = None
    world_size_given: bool = False
    #: What ``show`` warns of: the layout works, but its groups sit badly on the nodes.
    warnings: list[Problem] = field(default_factory=list)
    #: ``--strict``: a warning fails the file as an error does.
    strict: bool = False

    @property
    def exit_code(self) -> int:
        if self.source_error is not None:
            return EXIT_USAGE
        failed = self.diagnostics or (self.strict and self.warnings)
        return EXIT_INVALID if failed else EXIT_OK


def _exit_code(results: list[FileResult]) -> int:
    return max((result.exit_code for result in results), default=EXIT_OK)


def check(paths: list[str], args: argparse.Namespace) -> list[FileResult]:
    """Each file's problems and warnings; with a model, also each degree it cannot run.

    Raises:
        UsageError, InvalidInput: as the model options' ``model_request``.
    """
    results = []
    for path in paths:
        result = FileResult(path, world_size_given=args.world_size is not None, strict=args.strict)
        try:
            config, located = load_located(
                path, args.overrides, args.key, world_size=args.world_size
            )
        except ConfigError as error:
            result.diagnostics = error.diagnostics
        except SourceError as error:
            result.source_error = str(error)
        else:
            problems = _model_problems(args, config, located)
            result.config, result.diagnostics = config, tuple(problems)
            result.warnings = config_warnings(config)
        results.append(result)
    return results


def _model_problems(
    args: argparse.Namespace, config: MeshConfig, located: Source
) -> list[Diagnostic]:
    """The degrees of the config's layout that the model options' model cannot run, placed
    at each degree; none where no option is given and the config names no model."""
    block = config.training
    named = block is not None and (block.model is not None or block.model_file is not None)
    if not named and all(getattr(args, name) is None for name in MODEL_OPTIONS):
        return []
    # Imported only here: pre-commit runs validate on each file, and the estimator's modules
    # would add a third to its start-up.
    from meshconf.cli.model_options import unrunnable_degrees

    return unrunnable_degrees(args, config, located)


def _world_size_note(result: FileResult) -> str:
    config = result.config
    assert config is not None
    world_size = config.resolved_world_size
    if world_size is None:
        return "world size unknown"
    if config.world_size is None:
        return f"world_size {world_size}, the product of the degrees"
    if result.world_size_given:
        return f"world_size {world_size}, checked with --world-size"
    return f"world_size {world_size}"


def _warned(result: FileResult) -> str:
    count = len(result.warnings)
    if not count:
        return ""
    them = "it" if count == 1 else "them"
    return f", {count} warning{'s' if count > 1 else ''} (--strict fails on {them})"


def report_text(results: list[FileResult]) -> None:
    for result in results:
        if result.source_error is not None:
            print(f"meshconf: error: {printable(result.source_error)}", file=sys.stderr)
        elif result.diagnostics:
            for diagnostic in result.diagnostics:
                print(diagnostic.render())
        else:
            assert result.config is not None
            for warning in result.warnings:
                print(f"{result.path}: warning: {format_key(warning.path)}: {warning.message}")
            pending = result.config.pending_checks
            if result.exit_code != EXIT_OK:
                count = len(result.warnings)
                print(f"{result.path}: fails --strict: {count} warning{'s' if count > 1 else ''}")
                continue
            if not pending:
                print(f"{result.path}: ok ({_world_size_note(result)}){_warned(result)}")
                continue
            print(
                f"{result.path}: ok so far{_warned(result)}; {len(pending)} checks wait for "
                "the world size (set world_size or pass --world-size):"
            )
            for check in pending:
                print(f"  {check}")


def _diagnostic_json(diagnostic: Diagnostic) -> dict[str, Any]:
    return {
        "key": diagnostic.key,
        "message": diagnostic.message,
        "line": diagnostic.line,
        "column": diagnostic.column,
        "override": diagnostic.override,
        "text": diagnostic.render(),
    }


def report_json(results: list[FileResult]) -> None:
    files = []
    for result in results:
        entry: dict[str, Any] = {"path": result.path, "valid": result.exit_code == EXIT_OK}
        if result.source_error is not None:
            entry["error"] = result.source_error
        entry["errors"] = [_diagnostic_json(d) for d in result.diagnostics]
        if result.config is not None:
            entry["world_size"] = result.config.resolved_world_size
            entry["pending_checks"] = list(result.config.pending_checks)
            entry["warnings"] = warnings_json(result.warnings)
        files.append(entry)
    print(json.dumps({"valid": _exit_code(results) == EXIT_OK, "files": files}, indent=2))


def run(args: argparse.Namespace) -> int:
    results = check(args.paths, args)
    report = report_json if args.format == "json" else report_text
    emit(lambda: report(results))
    return _exit_code(results)


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="check configs against every rule",
        description="Check each config against every rule, and report what `meshconf show` "
        "warns of (groups of a high-traffic dim that leave a node, a world that does not fill "
        "whole nodes). Exit 0 if all are valid, 1 if any is invalid (or, with --strict, has "
        "a warning), 2 if one cannot be read.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="the config files to check")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 1) on a warning too, e.g. to forbid tp groups that leave a node",
    )
    add_source_options(parser)
    add_model_options(parser)
    parser.set_defaults(run=run)
