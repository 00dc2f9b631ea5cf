"""The device check's $OUT: what comes back from a GPU machine, at most MAX_OUT_FILES files.

The check always writes report.json, report.md and logs.tar.gz; the phases' own files (OUT_FILES
after those three, in priority order) take the slots left.  A file in $OUT the check did not
write (a `tee $OUT/check.log` of its output, say) is never an error: it counts against the
limit, a phase file that no longer fits goes into logs.tar.gz instead (logs/held-back/), and the
report names both.  Each log goes into the archive whole up to LOG_FILE_CAP bytes (beyond that,
its head and tail), so the archive stays under the per-file limit of what comes back.
"""
from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

from tools.gpu_check.report import report_markdown

MAX_OUT_FILES = 8                    # what a GPU machine's $OUT brings back
OUT_FILE_LIMIT = 16 * 2**20          # bytes per file it brings back
CORE_FILES = ("report.json", "report.md", "logs.tar.gz")
OUT_FILES = CORE_FILES + ("per_launch.json", "bench.json", "tiny-result.bin",
                          "production-result.bin")
LOG_FILE_CAP = 2 * 2**20             # bytes of one log kept in the archive
HELD_BACK = "held-back"              # logs/<this>/: phase files $OUT had no slot for
PARTIAL = ".logs.tar.gz.partial"


class OutDir:
    def __init__(self, path: Path, logs: Path):
        self.path, self.logs = path, logs
        self.held_back: list[str] = []

    def files(self) -> list[Path]:
        return sorted(p for p in self.path.rglob("*") if p.is_file() and p.name != PARTIAL)

    def foreign(self) -> list[str]:
        """Files under $OUT the check does not write."""
        return [str(p.relative_to(self.path)) for p in self.files()
                if p.parent != self.path or p.name not in OUT_FILES]

    def slots(self) -> int:
        """Phase files that may still go into $OUT (the core files' slots kept)."""
        present = {p.name for p in self.files() if p.parent == self.path}
        used = len(self.foreign()) + len(present & set(OUT_FILES)) + len(set(CORE_FILES) - present)
        return MAX_OUT_FILES - used

    def place(self, name: str, data: bytes | Path) -> Path:
        """A phase file into $OUT if it is there already or a slot is left, else into the logs
        (logs/held-back/NAME, inside logs.tar.gz); returns where it went."""
        if name not in OUT_FILES or name in CORE_FILES:
            raise ValueError(f"{name}: not one of the phase files {OUT_FILES[len(CORE_FILES):]}")
        target = self.path / name
        if not target.exists() and self.slots() <= 0:
            target = self.logs / HELD_BACK / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if name not in self.held_back:
                self.held_back.append(name)
        if isinstance(data, Path):
            shutil.copyfile(data, target)
        else:
            target.write_bytes(data)
        return target

    def write_report(self, report: dict) -> None:
        report["out"] = {"foreign": self.foreign(), "held_back": list(self.held_back),
                         "limit": MAX_OUT_FILES}
        (self.path / "report.json").write_text(json.dumps(report, indent=1, default=str,
                                                          ensure_ascii=False))
        (self.path / "report.md").write_text(report_markdown(report))
        tmp = self.path / PARTIAL
        write_logs(tmp, self.logs)
        tmp.replace(self.path / "logs.tar.gz")

    @staticmethod
    def clean_work(work: Path) -> None:
        shutil.rmtree(work, ignore_errors=True)


def _capped(data: bytes, cap: int) -> bytes:
    if len(data) <= cap:
        return data
    note = f"\n[... {len(data) - cap:,} bytes left out of the archive ...]\n".encode()
    half = (cap - len(note)) // 2
    return data[:half] + note + data[-half:]


def write_logs(path: Path, logs: Path, cap: int = LOG_FILE_CAP) -> None:
    """logs/ as a gzipped tar, each file at most `cap` bytes (its head and tail beyond)."""
    with tarfile.open(path, "w:gz") as tar:
        for p in sorted(logs.rglob("*")):
            if not p.is_file():
                continue
            try:
                data = _capped(p.read_bytes(), cap)
            except OSError:                     # a log a command is still replacing
                continue
            info = tarfile.TarInfo("logs/" + str(p.relative_to(logs)))
            info.size, info.mtime, info.mode = len(data), int(p.stat().st_mtime), 0o644
            tar.addfile(info, io.BytesIO(data))
