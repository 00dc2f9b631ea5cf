"""The `coppelius` command line: the subcommand frame and the error convention.

Each subcommand is a module of this package (`host/cli/<name>.py`) that defines `ORDER` (position
in --help) and `register(subparsers)`, which adds its parser and sets `func(args) -> int`.  They are
discovered here, so adding one never edits this file; the package's other modules (the console,
the renderers) define no `register`.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
import threading

from coppelius.staging import paths

from coppelius import __version__
from coppelius.staging.errors import EXIT_USER_ERROR, UserError

DESCRIPTION = ("Coppelius trains one fixed 57.7M-parameter transformer for a fixed number of AdamW "
               "steps on an NVIDIA GPU, driving it like a push-buffer runner, and leaves a "
               "byte-exact result file and a resumable checkpoint.")


def _subcommand_modules():
    mods = [importlib.import_module(f"{__name__}.{info.name}")
            for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_")]
    return sorted((m for m in mods if hasattr(m, "register")),
                  key=lambda m: (getattr(m, "ORDER", 100), m.__name__))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coppelius", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"coppelius {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _subcommand_modules():
        mod.register(sub)
    return parser


def os_error_line(e: OSError) -> str:
    """'cannot use PATH: Not a directory (ENOTDIR)' for an OSError that reached the frame."""
    names = [str(f) for f in (e.filename, e.filename2) if f is not None]
    where = f"cannot use {' → '.join(names)}: " if names else ""
    return f"{where}{paths.errno_text(e)} (hint: {paths.HINTS.get(e.errno, paths.DEFAULT_HINT)})"


class EarlySignals:
    """SIGINT/SIGTERM from the first line of `main` until a command starts: remembered, not fatal
    (a run interrupted while Python imports must still say so, and write nothing).  A command
    that handles signals itself (`set_defaults(handles_signals=True)`, `coppelius run`) takes
    them over: its handler reads `received` from the handler it replaces.  Every other command
    gets the previous handlers back before it starts, and one already signalled stops there."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None
        self._old: dict = {}

    def __call__(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum

    def __enter__(self) -> "EarlySignals":
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self) for sig in self.SIGNALS}
        return self

    def release(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def __exit__(self, *exc) -> None:
        self.release()


def main(argv: list[str] | None = None) -> int:
    with EarlySignals() as early:
        parser = build_parser()
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return EXIT_USER_ERROR if args.command is None and argv != [] else 0
        if not getattr(args, "handles_signals", False):
            early.release()
            if early.received:
                print(f"coppelius {args.command}: interrupted by "
                      f"{signal.Signals(early.received).name} before it started", file=sys.stderr)
                return 128 + early.received
        return _call(args)


def _call(args) -> int:
    """Run the command; every refusal (and any OSError that reaches here) is one line."""
    try:
        rc = args.func(args)
    except UserError as e:
        one_line = " ".join(str(e).splitlines())       # one line means one line
        print(f"coppelius {args.command}: {one_line}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"coppelius {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except OSError as e:
        # a path the command did not refuse itself: still one line naming it, never a traceback
        print(f"coppelius {args.command}: {os_error_line(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
