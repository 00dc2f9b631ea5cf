"""The `coppelius` command line: the subcommand frame and the error convention.

Subcommands live in `host/cmd_<name>.py`; each defines `ORDER` (position in --help) and
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.  They are discovered
here, so adding one never edits this file.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import __version__
from .errors import EXIT_USER_ERROR, UserError

DESCRIPTION = ("Coppelius trains one fixed 57.7M-parameter transformer for a fixed number of AdamW "
               "steps on an NVIDIA GPU, driving it like a push-buffer runner, and leaves a "
               "byte-exact result file and a resumable checkpoint.")


def _subcommand_modules():
    import host
    mods = []
    for info in pkgutil.iter_modules(host.__path__):
        if info.name.startswith("cmd_"):
            mods.append(importlib.import_module(f"host.{info.name}"))
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coppelius", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"coppelius {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _subcommand_modules():
        mod.register(sub)
    return parser




def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USER_ERROR if args.command is None and argv != [] else 0
    try:
        rc = args.func(args)
    except UserError as e:
        print(f"coppelius {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"coppelius {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
