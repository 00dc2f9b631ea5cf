"""The optional dependency sets (pyproject's extras: `demo`, `text`, `hf`, `plot`, `nvml`) and
how to add one, as a command that works as printed where this `coppelius` runs.

A hint that says `pip install 'coppelius[text]'` fails as printed in two common places: typed
in a shell outside the virtual environment (`pip` is another Python's), and from a checkout or a
wheel that no package index holds (`coppelius` itself cannot be found).  So the hint names this
interpreter (`sys.executable -m pip`) and the extra's own requirements, read from the checkout's
pyproject.toml or the installed distribution's metadata: the command installs exactly them into
the environment that runs this `coppelius`.

At the bottom of the layers: nothing of coppelius is imported.
"""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

DISTRIBUTION = "coppelius"
_MARKER_EXTRA = re.compile(r"""extra\s*==\s*["']([\w.-]+)["']""")
_SELF = re.compile(rf"^{DISTRIBUTION}\[([\w,\s-]+)\]$")


def checkout_root() -> Path | None:
    """The checkout this `coppelius` is (an editable install, or `python3 -m tools.checkout`):
    host/ beside the Makefile and pyproject.toml; None in a wheel."""
    here = Path(__file__).resolve()
    root = here.parents[1]
    if here.parent.name == "host" and all((root / n).is_file()
                                          for n in ("pyproject.toml", "Makefile")):
        return root
    return None


def _declared() -> dict[str, list[str]]:
    """extra → its requirements as declared (self-references `coppelius[a,b]` unexpanded)."""
    root = checkout_root()
    if root is not None:
        import tomllib
        with open(root / "pyproject.toml", "rb") as f:
            return tomllib.load(f)["project"].get("optional-dependencies", {})
    from importlib import metadata
    out: dict[str, list[str]] = {}
    for req in metadata.requires(DISTRIBUTION) or []:
        spec, _, marker = req.partition(";")
        m = _MARKER_EXTRA.search(marker)
        if m:
            out.setdefault(m.group(1), []).append(spec.strip().replace(" ", ""))
    return out


def requirements(extra: str) -> list[str]:
    """The requirements an extra brings, self-references expanded, in declaration order."""
    declared = _declared()
    out: list[str] = []

    def add(name: str, seen: tuple) -> None:
        for spec in declared.get(name, []):
            m = _SELF.match(spec.replace(" ", ""))
            if m:
                for inner in m.group(1).split(","):
                    if inner not in seen:
                        add(inner, seen + (inner,))
            elif spec not in out:
                out.append(spec)
    add(extra, (extra,))
    return out


def install_command(extra: str) -> str:
    """`/path/to/python -m pip install 'tokenizers==0.23.3'`: this interpreter's pip, the extra's
    requirements quoted for a POSIX shell."""
    try:
        reqs = requirements(extra)
    except Exception:           # metadata or pyproject unreadable: the extra by name
        reqs = []
    if not reqs:
        reqs = [f"{DISTRIBUTION}[{extra}]"]
    return " ".join([shlex.quote(sys.executable), "-m", "pip", "install",
                     *map(shlex.quote, reqs)])

