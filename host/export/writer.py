"""`coppelius export`: a verified checkpoint written as a Hugging Face Llama directory.

The checkpoint is read and verified before anything is written (`coppelius.forensics.
read_checkpoint` by the caller: a damaged one is refused by name).  The directory is written
whole beside DIR (`.DIR.export-XXXX` in DIR's parent), then renamed into place, so DIR is either
absent, the old export, or the complete new one; an existing DIR is refused unless `overwrite`,
and then the old one is renamed aside and removed only once the new one is in place.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from coppelius.export import llama
from coppelius.export import tokenizer_files
from coppelius.staging.errors import UserError

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
GENERATION_FILE = "generation_config.json"
SAFETENSORS_FORMAT = {"format": "pt"}           # what transformers expects in the header metadata
EXPORT_MODE = 0o755             # mkdtemp makes 0700, safetensors 0600: an export is for sharing
FILE_MODE = 0o644
HF_HINT = "pip install 'coppelius[hf]' (transformers and safetensors)"


class ExportRefused(UserError):
    """An export that cannot be written (the directory, the option, the library missing)."""


def _safetensors():
    try:
        import safetensors
    except ImportError:
        raise ExportRefused("the `safetensors` package is not installed", HF_HINT) from None
    if not hasattr(safetensors, "TensorSpec"):
        raise ExportRefused(f"safetensors {getattr(safetensors, '__version__', '?')} has no "
                            "TensorSpec (bf16 from numpy needs ≥ 0.8)", HF_HINT)
    return safetensors


def check_target(directory: Path, overwrite: bool) -> None:
    """Refuse, before reading anything large, a DIR that exists (unless `overwrite`), a DIR that
    exists but is not a directory, or a parent that does not exist."""
    if os.path.lexists(directory):
        if not overwrite:
            raise ExportRefused(f"export directory {directory} exists",
                                "pass --overwrite to replace it, or name another directory")
        if directory.is_symlink() or not directory.is_dir():
            raise ExportRefused(f"export directory {directory} exists and is not a directory",
                                "remove it or name another directory; --overwrite replaces only "
                                "an export directory")
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
    check_target(directory, overwrite)
    _safetensors()
    parent = directory.absolute().parent
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.export-", dir=parent))
    try:
        written = write_files(tmp, checkpoint, dtype)
        os.chmod(tmp, EXPORT_MODE)
        _into_place(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"directory": os.fspath(directory), "profile": checkpoint.profile.name,
            "update_count": checkpoint.update_count, "payload_sha256": checkpoint.payload_sha256,
            "dtype": dtype, "seconds": time.monotonic() - t0, **written}


def _into_place(tmp: Path, directory: Path) -> None:
    """Rename the finished export onto `directory`; an old one goes aside first, then away."""
    if not os.path.lexists(directory):
        os.rename(tmp, directory)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=tmp.parent))
    os.rename(directory, aside / directory.name)
    try:
        os.rename(tmp, directory)
    except BaseException:
        os.rename(aside / directory.name, directory)        # put the old export back
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)
