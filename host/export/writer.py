"""`coppelius export`: a verified checkpoint written as a Hugging Face Llama directory.

The checkpoint is read and verified before anything is written (`coppelius.forensics.
read_checkpoint` by the caller: a damaged one is refused by name).  The directory is written
whole beside DIR (`.DIR.export-XXXX` in DIR's parent), then renamed into place, so DIR is either
absent, the old export, or the complete new one.

Nothing the export did not write is ever removed.  An existing DIR is replaced (with
`overwrite`) only when it is itself a previous export: its `config.json` holds the `coppelius`
block this writer puts there (the marker), and it holds nothing but the files an export writes.
Any other directory — one holding the checkpoint being read, a `.git`, a user's file, or no
marker — is refused with or without `overwrite`, naming what it holds.  The old export is renamed
aside once the new one is written, and then only its own files are removed, by name.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from coppelius.extras import install_command
from coppelius.export import llama
from coppelius.export import tokenizer_files
from coppelius.staging.errors import UserError

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
SAFETENSORS_FORMAT = {"format": "pt"}           # what transformers expects in the header metadata
EXPORT_MODE = 0o755             # mkdtemp makes 0700, safetensors 0600: an export is for sharing
FILE_MODE = 0o644


class ExportRefused(UserError):
    """An export that cannot be written (the directory, the option, the library missing)."""


def _safetensors():
    try:
        import safetensors
    except ImportError:
        raise ExportRefused("the `safetensors` package is not installed",
                            install_command("hf")) from None
    if not hasattr(safetensors, "TensorSpec"):
        raise ExportRefused(f"safetensors {getattr(safetensors, '__version__', '?')} has no "
                            "TensorSpec (bf16 from numpy needs ≥ 0.8)",
                            install_command("hf"))
    return safetensors


EXPORT_FILES = (CONFIG_FILE, GENERATION_FILE, WEIGHTS_FILE, tokenizer_files.TOKENIZER_FILE,
                tokenizer_files.TOKENIZER_CONFIG_FILE)
MARKER = "coppelius"            # config.json's block naming the checkpoint an export came from
SHOWN_ENTRIES = 4               # a refusal names this many of a directory's foreign entries


def foreign(directory: Path, checkpoint=None) -> str | None:
    """None when the existing `directory` is a previous export that holds nothing else (and not
    `checkpoint`); else what it is or holds instead, for the refusal."""
    if directory.is_symlink() or not directory.is_dir():
        return "it is not a directory"
    if checkpoint is not None:
        inside = Path(os.path.realpath(checkpoint))
        if Path(os.path.realpath(directory)) in inside.parents:
            return f"it holds the checkpoint being exported ({checkpoint})"
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as e:
        return f"it cannot be listed ({e.strerror})"
    other = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in entries
             if e.name not in EXPORT_FILES or not e.is_file(follow_symlinks=False)]
    if other:
        more = f" and {len(other) - SHOWN_ENTRIES} more" if len(other) > SHOWN_ENTRIES else ""
        return f"it holds {', '.join(other[:SHOWN_ENTRIES])}{more}, which no export writes"
    try:
        config = json.loads((directory / CONFIG_FILE).read_text())
    except FileNotFoundError:
        return f"it has no {CONFIG_FILE}, so it is no export"
    except (OSError, UnicodeDecodeError, ValueError):
        return f"its {CONFIG_FILE} is not readable JSON"
    if not (isinstance(config, dict) and isinstance(config.get(MARKER), dict)):
        return f"its {CONFIG_FILE} has no `{MARKER}` block, so no coppelius export wrote it"
    return None


def new_directory_hint(directory: Path, checkpoint=None) -> str:
    """A directory that does not exist, as a command that works as printed."""
    stem = Path(checkpoint).stem if checkpoint is not None else "export"
    base = directory / f"{stem}-hf"
    suggestion, k = base, 1
    while os.path.lexists(suggestion):
        k += 1
        suggestion = base.with_name(f"{base.name}-{k}")
    if checkpoint is None:
        return f"name a new directory, e.g. {shlex.quote(os.fspath(suggestion))}"
    return (f"name a new directory: coppelius export {shlex.quote(os.fspath(checkpoint))} "
            f"{shlex.quote(os.fspath(suggestion))}")


def check_target(directory: Path, overwrite: bool, checkpoint=None) -> None:
    """Refuse, before reading anything large, a DIR that exists and is not a previous export
    (with or without `overwrite`: never replaced), a previous export without `overwrite`, or a
    parent that does not exist.  `checkpoint`: the path being exported (never inside DIR)."""
    directory = Path(directory)
    if os.path.lexists(directory):
        found = foreign(directory, checkpoint)
        if found is not None:
            raise ExportRefused(f"export directory {directory} exists and is not a previous "
                                f"export: {found}; --overwrite replaces only a directory an "
                                "export wrote, holding nothing else",
                                new_directory_hint(directory, checkpoint))
        if not overwrite:
            raise ExportRefused(f"export directory {directory} exists (a previous export)",
                                "pass --overwrite to replace it, or name another directory")
    parent = directory.absolute().parent
    if not parent.is_dir():
        raise ExportRefused(f"export directory {directory}: {parent} is not a directory",
                            "create the parent directory first, or name another path")


def write_weights(path: Path, tensors: dict, dtype: str, metadata: dict) -> int:
    """model.safetensors through the safetensors library; returns its size in bytes."""
    st = _safetensors()
    arrays = llama.as_dtype(tensors, dtype)
    specs = {name: st.TensorSpec(dtype=llama.SAFETENSORS_DTYPES[dtype], shape=a.shape,
                                 data_ptr=a.ctypes.data, data_len=a.nbytes)
             for name, a in arrays.items()}
    st.serialize_file(specs, str(path), metadata={**SAFETENSORS_FORMAT, **metadata})
    del arrays                      # the specs point into them until serialize_file returned
    os.chmod(path, FILE_MODE)
    return path.stat().st_size


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def write_files(where: Path, checkpoint, dtype: str) -> dict:
    """Every file of the export into the (empty) directory `where`; returns what was written."""
    prof = checkpoint.profile
    meta = {"coppelius_profile": prof.name, "coppelius_update_count": str(checkpoint.update_count),
            "coppelius_payload_sha256": checkpoint.payload_sha256}
    size = write_weights(where / WEIGHTS_FILE, llama.hf_tensors(prof, checkpoint.P), dtype, meta)
    config = llama.hf_config(prof, dtype)
    config["coppelius"] = {"profile": prof.name, "update_count": checkpoint.update_count,
                           "payload_sha256": checkpoint.payload_sha256,
                           "checkpoint": os.fspath(checkpoint.path)}
    _write_json(where / CONFIG_FILE, config)
    _write_json(where / GENERATION_FILE, llama.generation_config())
    text, note = tokenizer_files.tokenizer_json(prof)
    (where / tokenizer_files.TOKENIZER_FILE).write_text(text)
    _write_json(where / tokenizer_files.TOKENIZER_CONFIG_FILE, tokenizer_files.tokenizer_config(prof))
    return {"weights_bytes": size, "tokenizer": note,
            "files": sorted(p.name for p in where.iterdir())}


def export(checkpoint, directory, dtype: str = "fp32", overwrite: bool = False) -> dict:
    """Write `checkpoint` (a verified `coppelius.forensics.Checkpoint`) as a Llama directory at
    `directory`; returns a report (profile, update count, dtype, files, sizes, seconds)."""
    t0 = time.monotonic()
    if dtype not in llama.DTYPES:
        raise ExportRefused(f"--dtype {dtype} is not one of {', '.join(llama.DTYPES)}",
                            "fp32 keeps the trained values; bf16 halves the size")
    directory = Path(directory)
    check_target(directory, overwrite, checkpoint.path)
    _safetensors()
    parent = directory.absolute().parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.export-", dir=parent))
    try:
        written = write_files(tmp, checkpoint, dtype)
        os.chmod(tmp, EXPORT_MODE)
        _into_place(tmp, directory, overwrite, checkpoint.path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)      # the temporary this call made, only
        raise
    return {"directory": os.fspath(directory), "profile": checkpoint.profile.name,
            "update_count": checkpoint.update_count, "payload_sha256": checkpoint.payload_sha256,
            "dtype": dtype, "seconds": time.monotonic() - t0, **written}


def _into_place(tmp: Path, directory: Path, overwrite: bool, checkpoint) -> None:
    """Rename the finished export onto `directory`.  An old export is checked again (the
    directory may have changed while the files were written), renamed aside, and once the new
    one is in place its own files are removed by name: anything else found there stays, aside."""
    if not os.path.lexists(directory):
        os.rename(tmp, directory)
        return
    check_target(directory, overwrite, checkpoint)
    aside = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=tmp.parent))
    old = aside / directory.name
    os.rename(directory, old)
    try:
        os.rename(tmp, directory)
    except BaseException:
        os.rename(old, directory)           # put the old export back
        os.rmdir(aside)
        raise
    for name in EXPORT_FILES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old / name)
    with contextlib.suppress(OSError):      # not empty: something appeared; it is kept aside
        os.rmdir(old)
        os.rmdir(aside)
