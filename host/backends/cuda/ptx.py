"""Committed PTX and its manifests (CONTRACT §12): find, check, load a profile's kernels for a target.

`kernels_ptx/<profile>/<target>/manifest.json` is read exactly as tools/build_ptx.py writes it
(its docstring has the schema): per entry its PTX file and that file's sha256, the `.entry` name,
the parameter list (Triton's hidden trailing scratch pointers included, with their sizes under
`global_scratch` / `profile_scratch`), threads per block and dynamic shared memory; at the top the
PTX ISA version.  A missing key, an unknown parameter type or a PTX file whose digest differs is
refused with a hint to rebuild.  The host loads PTX only; the driver JITs it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from coppelius import kernels_ptx
from coppelius.driver.module import Kernel, Module
from coppelius.staging.errors import UserError


# kernels_ptx/ in a checkout, coppelius/kernels_ptx/ in a wheel
ROOT = Path(kernels_ptx.__file__).resolve().parent
MANIFEST = "manifest.json"
REBUILD_HINT = ("rebuild with `python -m tools.build_ptx`, or use a complete checkout or a wheel built from "
                "one (it ships kernels_ptx/)")

# manifest scalar parameter types (Triton signatures) → the driver wrapper's ctypes names;
# every pointer ("*fp32", "*bf16", "*i8", ...) is "ptr"
SCALAR_TYPES = {"i32": "i32", "i64": "i64", "fp32": "f32"}


class PtxMissing(UserError):
    pass


class PtxAltered(UserError):
    """A committed PTX file is not the one its manifest describes."""


def _field(record: dict, key: str, where: str):
    try:
        return record[key]
    except (KeyError, TypeError):
        raise PtxMissing(f"{where}: no {key!r} in the manifest", REBUILD_HINT) from None


def _param_type(t: str, where: str) -> str:
    if t.startswith("*"):
        return "ptr"
    try:
        return SCALAR_TYPES[t]
    except KeyError:
        raise PtxMissing(f"{where}: manifest parameter type {t!r} is unknown", REBUILD_HINT) from None


def _pdl(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise PtxMissing(f"{where}: manifest field 'pdl' is {value!r}, not true or false",
                         REBUILD_HINT)
    return value


@dataclass(frozen=True)
class Entry:
    key: str                    # the launch list's kernel name
    file: Path
    entry: str                  # the PTX `.entry` symbol
    param_types: tuple[str, ...]
    threads: int
    shared: int                 # dynamic shared memory bytes per block
    sha256: str                 # of the PTX file
    hidden: tuple[str, ...] = ()        # names of Triton's trailing scratch parameters
    scratch: tuple[int, ...] = ()       # bytes per program for each hidden parameter (0: null)
    pdl: bool = False                   # waits for the grids before it first (programmatic launch)

    @classmethod
    def from_record(cls, directory: Path, key: str, k: dict) -> "Entry":
        where = f"{directory / MANIFEST}: {key}"
        params = _field(k, "params", where)
        hidden = tuple(_field(p, "name", where) for p in params if _field(p, "hidden", where))
        return cls(key=key, file=directory / _field(k, "file", where),
                   entry=_field(k, "entry", where),
                   param_types=tuple(_param_type(_field(p, "type", where), where) for p in params),
                   threads=int(_field(k, "threads", where)), shared=int(_field(k, "shared", where)),
                   sha256=_field(k, "sha256", where), hidden=hidden,
                   scratch=tuple(int(_field(_field(k, h, where), "size", where)) for h in hidden),
                   pdl=_pdl(_field(k, "pdl", where), where))

    def read(self) -> bytes:
        """The PTX bytes, checked against the manifest's digest."""
        if not self.file.is_file():
            raise PtxMissing(f"{self.file} is missing", REBUILD_HINT)
        data = self.file.read_bytes()
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise PtxAltered(f"{self.file} differs from its manifest digest (sha256 "
                             f"{self.sha256[:12]}…)", REBUILD_HINT)
        return data


class Manifest:
    def __init__(self, directory: Path, data: dict):
        self.directory = directory
        self.data = data
        where = str(directory / MANIFEST)
        self.ptx_isa = str(_field(data, "ptx_isa", where))
        self.entries: dict[str, Entry] = {
            key: Entry.from_record(directory, key, k)
            for key, k in _field(data, "kernels", where).items()}

    @classmethod
    def load(cls, profile: str, target: str, root: Path | None = None) -> "Manifest":
        directory = (ROOT if root is None else root) / profile / target
        path = directory / MANIFEST
        if not path.is_file():
            raise PtxMissing(f"no PTX for profile {profile!r}, target {target}: {path} is missing",
                             REBUILD_HINT)
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise PtxMissing(f"{path}: not valid JSON ({e})", REBUILD_HINT) from None
        return cls(directory, data)

    def verify(self) -> list[str]:
        """Problems with the committed files: missing PTX, digests that differ."""
        problems = []
        for e in self.entries.values():
            try:
                e.read()
            except UserError as err:
                problems.append(f"{e.key}: {err.message}")
        return problems

    def kernels(self, closers) -> dict:
        """Load every PTX file once (module per file) and return launch-ready kernels by key,
        each with the attributes the driver reports for its function; each module is appended to
        `closers` (a list, or the backend's teardown.Closers) to be closed with the rest."""
        modules: dict[Path, Module] = {}
        out = {}
        for e in self.entries.values():
            if e.file not in modules:
                modules[e.file] = Module(e.read(), self.display_name(e))
                closers.append(modules[e.file])
            module = modules[e.file]
            out[e.key] = Kernel(module.function(e.entry), e.key, list(e.param_types),
                                    e.threads, e.shared, scratch=e.scratch,
                                    spills=module.spills(e.entry), pdl=e.pdl)
        return out

    def display_name(self, e: Entry) -> str:
        """`kernels_ptx/<profile>/<target>/<file>` (the path under the checkout or the
        installation, for messages)."""
        try:
            return str(e.file.relative_to(ROOT.parent))
        except ValueError:
            return str(e.file)
