"""The ``kattn`` command: list, demo, bench, report, train, eval, generate, translate, convert,
study, data generate, pattern."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from .bench import add_bench_parser
from .convert import add_convert_parser
from .data import add_data_parser
from .demo import add_demo_parser
from .generate import add_generate_parser
from .listing import add_list_parser
from .pattern import add_pattern_parser
from .report import add_report_parser
from .study import add_study_parser
from .train import add_train_parsers
from .translate import add_translate_parser

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``kattn`` and all its subcommands; each sets ``func``, its handler."""
    parser = argparse.ArgumentParser(prog="kattn", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kattn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_list_parser(sub)
    add_demo_parser(sub)
    add_bench_parser(sub)
    add_report_parser(sub)
    add_train_parsers(sub)
    add_generate_parser(sub)
    add_translate_parser(sub)
    add_convert_parser(sub)
    add_study_parser(sub)
    add_data_parser(sub)
    add_pattern_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kattn argv`` (default: the process's arguments) and return its exit code; the
    library's errors, and a missing optional extra, are printed as one ``kattn: error:`` line
    with exit code 2."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ValueError, TypeError, NotImplementedError, FileNotFoundError) as err:
        return _user_error(err)
    except ImportError as err:
        if not _names_an_extra(err):  # not a missing extra: a fault, shown with its traceback
            raise
        return _user_error(err)


def _names_an_extra(error: ImportError) -> bool:
    """Whether ``error`` is kattn's refusal for a missing optional extra, which says what to
    install (``pip install kattn[hf]``)."""
    return "pip install" in str(error)


def _user_error(error: Exception) -> int:
    print(f"kattn: error: {error}", file=sys.stderr)
    return 2
