"""Committed PTX and its manifests (SPEC §12): find, check and load a profile's kernels for a target.

`kernels_ptx/<profile>/<target>/manifest.json` lists every entry: its PTX file, the `.entry` name,
the parameter list (Triton's hidden trailing scratch pointers included), threads per block, dynamic
shared memory, and the PTX ISA version.  The host loads PTX only; the driver JITs it.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError

ROOT = Path(__file__).resolve().parents[1] / "kernels_ptx"
MANIFEST = "manifest.json"

# manifest parameter types → the driver wrapper's ctypes names
_TYPES = {"ptr": "ptr", "pointer": "ptr", "i32": "i32", "u32": "u32", "i64": "i64", "u64": "u64",
          "fp32": "f32", "f32": "f32", "fp64": "f64", "f64": "f64", "i16": "i16", "u16": "u16",
          "i8": "i8", "u8": "u8", "i1": "i8"}


class PtxMissing(UserError):
    pass


def _param_type(p) -> str:
    t = p.get("type") if isinstance(p, dict) else p
    t = str(t)
    if t.startswith("*") or t.endswith("ptr") or t == "pointer":
        return "ptr"
    try:
        return _TYPES[t]
    except KeyError:
        raise PtxMissing(f"manifest parameter type {t!r} is unknown",
                         "rebuild kernels_ptx with tools/build_ptx.py") from None


@dataclass(frozen=True)
class Entry:
    key: str                    # the launch list's kernel name
    file: Path
    entry: str                  # the PTX `.entry` symbol
    param_types: tuple[str, ...]
    threads: int
    shared: int
    sha256: str | None
    hidden: tuple[str, ...] = ()        # names of Triton's trailing scratch parameters
    scratch: tuple[int, ...] = ()       # bytes per program for each hidden parameter (0: null)


class Manifest:
    def __init__(self, directory: Path, data: dict):
        self.directory = directory
        self.data = data
        self.ptx_version = str(data.get("ptx_version", data.get("ptx_isa", "")))
        raw = data.get("kernels", data.get("entries", {}))
        if isinstance(raw, list):
            raw = {k.get("key", k.get("name")): k for k in raw}
        self.entries: dict[str, Entry] = {}
        for key, k in raw.items():
            self.entries[key] = Entry(
                key=key, file=directory / k["file"], entry=k.get("entry", k.get("symbol", key)),
                param_types=tuple(_param_type(p) for p in k["params"]),
                threads=int(k.get("threads", k.get("threads_per_block", 32 * k.get("num_warps", 4)))),
                shared=int(k.get("shared", k.get("shared_bytes", 0))),
                sha256=k.get("sha256"),
                hidden=tuple(p["name"] for p in k["params"] if isinstance(p, dict) and p.get("hidden")),
                scratch=tuple(int(k.get(p["name"], {}).get("size", 0)) if isinstance(k.get(p["name"]), dict)
                              else 0 for p in k["params"] if isinstance(p, dict) and p.get("hidden")))

    @classmethod
    def load(cls, profile: str, target: str, root: Path | None = None) -> "Manifest":
        directory = (ROOT if root is None else root) / profile / target
        path = directory / MANIFEST
        if not path.is_file():
            raise PtxMissing(f"no PTX for profile {profile!r}, target {target}: {path} is missing",
                             "rebuild with tools/build_ptx.py, or use a complete checkout")
        try:
            data = json.loads(path.read_text())
        except ValueError as e:
            raise PtxMissing(f"{path}: not valid JSON ({e})", "rebuild with tools/build_ptx.py") from None
        return cls(directory, data)

    def verify(self) -> list[str]:
        """Problems with the committed files: missing PTX, digests that differ."""
        problems = []
        for e in self.entries.values():
            if not e.file.is_file():
                problems.append(f"{e.key}: {e.file.name} missing")
            elif e.sha256 and hashlib.sha256(e.file.read_bytes()).hexdigest() != e.sha256:
                problems.append(f"{e.key}: {e.file.name} differs from its manifest digest")
        return problems

    def kernels(self, closers: list) -> dict:
        """Load every PTX file once (module per file) and return launch-ready kernels by key."""
        from . import driver as drv
        modules: dict[Path, drv.Module] = {}
        out = {}
        for e in self.entries.values():
            if e.file not in modules:
                if not e.file.is_file():
                    raise PtxMissing(f"{e.file} is missing", "rebuild with tools/build_ptx.py")
                modules[e.file] = drv.Module(e.file.read_bytes(), e.file.name)
                closers.append(modules[e.file])
            fn = modules[e.file].function(e.entry)
            kernel = drv.Kernel(fn, e.key, list(e.param_types), e.threads, e.shared)
            kernel.scratch = e.scratch
            out[e.key] = kernel
        return out
