"""The checkpoint envelope (CONTRACT §10): every magic, version and header offset, named once, and
the 16 KiB header's encoder and profile-independent decoder.

`Header.decode(buf)` refuses anything that is not a structurally sound header with a
`CheckpointRefused` naming the field; comparing a header with a run's profile is `check_profile`.
Nothing here reads files: `host/checkpoints/__init__.py` does the I/O.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

from coppelius.plan import profiles
from coppelius.staging.errors import UserError

MAGIC = b"CPLSCKPT"
VERSION = 1
HEADER_BYTES = 16384

# ---- header offsets (CONTRACT §10 table) ----
OFF_MAGIC = 0
OFF_VERSION = 8                 # u32
OFF_HEADER_BYTES = 12           # u32
OFF_UPDATE_COUNT = 16           # u64, in band (seed)
OFF_PAYLOAD_BYTES = 24          # u64
OFF_CHUNK_BYTES = 32            # u64
OFF_RUN_STEPS = 40              # u64
OFF_PARAMETER_COUNT = 48        # u64
OFF_PLANES = 56                 # u32
OFF_BYTES_PER_SCALAR = 60       # u32
OFF_CHUNK_COUNT = 64            # u32
OFF_IDENTITY_BYTES = 68         # u32
FIXED_END = 72                  # zeros from here ...
IDENTITY_BLOCK = 128            # ... to here: four strings, each u32 length + bytes
DIGEST_TABLE = 4096             # SHA-256 of each payload chunk
HEADER_DIGEST = 16352           # SHA-256 of header bytes [0, HEADER_DIGEST)
DIGEST_BYTES = 32

IDENTITY_CAPACITY = DIGEST_TABLE - IDENTITY_BLOCK                 # 3968 bytes
DIGEST_CAPACITY = (HEADER_DIGEST - DIGEST_TABLE) // DIGEST_BYTES  # 383 chunks
IDENTITY_NAMES = ("state", "learner", "data", "initialization")   # block order
IDENTITY_LENGTH = struct.Struct("<I")

# fixed fields in header order: (attribute, offset, struct format, what a message calls it)
_FIELDS = (
    ("update_count", OFF_UPDATE_COUNT, "<Q", "update count"),
    ("payload_bytes", OFF_PAYLOAD_BYTES, "<Q", "payload bytes"),
    ("chunk_bytes", OFF_CHUNK_BYTES, "<Q", "chunk bytes"),
    ("run_steps", OFF_RUN_STEPS, "<Q", "run steps"),
    ("parameter_count", OFF_PARAMETER_COUNT, "<Q", "parameter count"),
    ("planes", OFF_PLANES, "<I", "planes"),
    ("bytes_per_scalar", OFF_BYTES_PER_SCALAR, "<I", "bytes per scalar"),
    ("chunk_count", OFF_CHUNK_COUNT, "<I", "chunk count"),
    ("identity_bytes", OFF_IDENTITY_BYTES, "<I", "identity block bytes"),
)
# the size fields a run's profile fixes, in the order they are compared
SIZE_FIELDS = tuple(f for f in _FIELDS if f[0] != "update_count")


class CheckpointRefused(UserError):
    """A checkpoint file that must not be used: the message names the field, identity or chunk."""


class CheckpointLocked(UserError):
    """Another run holds the checkpoint path's lock."""


def _sha256(data) -> bytes:
    return hashlib.sha256(data).digest()


def _show(value: bytes, limit: int = 160) -> str:
    r"""A one-line, quoted rendering of bytes read from a file, escaped once, as Python's repr
    of bytes escapes them: b"CPLSCK\xd0T" shows as 'CPLSCK\xd0T', never 'CPLSCK\\xd0T'."""
    text = repr(bytes(value))[1:]
    return text if len(text) <= limit else text[:limit - 4] + "…" + text[-3:]


def identity_block(identities: dict[str, bytes]) -> bytes:
    return b"".join(IDENTITY_LENGTH.pack(len(identities[n])) + identities[n]
                    for n in IDENTITY_NAMES)


@dataclass(frozen=True)
class Header:
    """A decoded header.  `encode()` writes it back, sealed with a fresh header digest."""
    update_count: int
    payload_bytes: int
    chunk_bytes: int
    run_steps: int
    parameter_count: int
    planes: int
    bytes_per_scalar: int
    chunk_count: int
    identity_bytes: int
    identities: dict[str, bytes]
    digests: tuple[bytes, ...]                  # (chunk_count,) SHA-256 per payload chunk
    version: int = VERSION
    header_digest: bytes = field(default=b"", compare=False)

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.payload_bytes

    def chunk_span(self, index: int) -> tuple[int, int]:
        """(payload offset, bytes) of chunk `index`; the last chunk may be short."""
        start = index * self.chunk_bytes
        return start, min(self.chunk_bytes, self.payload_bytes - start)

    def profile_name(self) -> str | None:
        """The known profile whose identities this header carries, if any."""
        for name in profiles.names():
            if profiles.get(name).identities == self.identities:
                return name
        return None

    @classmethod
    def for_profile(cls, profile, update_count: int, digests) -> "Header":
        ids = profile.identities
        return cls(update_count=update_count, payload_bytes=profile.payload_bytes,
                   chunk_bytes=profile.chunk_bytes, run_steps=profile.steps,
                   parameter_count=profile.parameter_count, planes=profiles.PLANES,
                   bytes_per_scalar=profiles.BYTES_PER_SCALAR,
                   chunk_count=profile.chunk_count, identity_bytes=len(identity_block(ids)),
                   identities=ids, digests=tuple(digests))

    def encode(self) -> bytes:
        """The 16,384 header bytes, digest included.  Raises ValueError if it cannot fit."""
        block = identity_block(self.identities)
        if len(block) > IDENTITY_CAPACITY or len(self.digests) > DIGEST_CAPACITY:
            raise ValueError("identity block or digest table does not fit the header")
        buf = bytearray(HEADER_BYTES)
        buf[OFF_MAGIC:OFF_MAGIC + len(MAGIC)] = MAGIC
        struct.pack_into("<II", buf, OFF_VERSION, self.version, HEADER_BYTES)
        for attr, off, fmt, _ in _FIELDS:
            struct.pack_into(fmt, buf, off, getattr(self, attr))
        buf[IDENTITY_BLOCK:IDENTITY_BLOCK + len(block)] = block
        table = b"".join(self.digests)
        buf[DIGEST_TABLE:DIGEST_TABLE + len(table)] = table
        buf[HEADER_DIGEST:] = _sha256(memoryview(buf)[:HEADER_DIGEST])
        return bytes(buf)

    @classmethod
    def decode(cls, buf, where: str = "checkpoint") -> "Header":
        """Decode and check a header on its own terms (no profile).  `buf` is the file's first
        bytes (up to HEADER_BYTES of them); anything wrong raises CheckpointRefused."""
        buf = bytes(buf[:HEADER_BYTES])

        def refuse(what: str, hint: str) -> CheckpointRefused:
            return CheckpointRefused(f"{where}: {what}", hint)

        not_ckpt = "this is not a Coppelius checkpoint, or it is damaged; pass the right path"
        if len(buf) < HEADER_BYTES:
            raise refuse(f"file too short: {len(buf)} bytes, the header alone is {HEADER_BYTES}",
                         "the file is truncated or not a checkpoint; restore it from a copy")
        if buf[:len(MAGIC)] != MAGIC:
            raise refuse(f"magic differs: file {_show(buf[:len(MAGIC)])} expected "
                         f"{_show(MAGIC)}", not_ckpt)
        version, header_bytes = struct.unpack_from("<II", buf, OFF_VERSION)
        if version != VERSION:
            raise refuse(f"envelope version differs: file {version} expected {VERSION}",
                         "written by another Coppelius version; use that version to continue")
        if header_bytes != HEADER_BYTES:
            raise refuse(f"header bytes differs: file {header_bytes} expected {HEADER_BYTES}",
                         not_ckpt)
        stored = buf[HEADER_DIGEST:HEADER_BYTES]
        actual = _sha256(buf[:HEADER_DIGEST])
        if stored != actual:
            raise refuse(f"header digest differs: file {stored.hex()[:16]}… computed "
                         f"{actual.hex()[:16]}… (the header is damaged)",
                         "restore the checkpoint from a copy, or start fresh with `: > PATH`")
        values = {attr: struct.unpack_from(fmt, buf, off)[0] for attr, off, fmt, _ in _FIELDS}
        if any(buf[FIXED_END:IDENTITY_BLOCK]):
            raise refuse(f"reserved header bytes [{FIXED_END}, {IDENTITY_BLOCK}) are not zero",
                         not_ckpt)
        n_id = values["identity_bytes"]
        if n_id > IDENTITY_CAPACITY:
            raise refuse(f"identity block bytes {n_id} exceed the room of {IDENTITY_CAPACITY}",
                         not_ckpt)
        identities: dict[str, bytes] = {}
        pos, end = IDENTITY_BLOCK, IDENTITY_BLOCK + n_id
        for name in IDENTITY_NAMES:
            if pos + IDENTITY_LENGTH.size > end:
                raise refuse(f"identity block ends before the {name} identity's length",
                             not_ckpt)
            (n,) = IDENTITY_LENGTH.unpack_from(buf, pos)
            pos += IDENTITY_LENGTH.size
            if pos + n > end:
                raise refuse(f"{name} identity length {n} runs past the identity block "
                             f"({end - pos} bytes left)", not_ckpt)
            identities[name] = buf[pos:pos + n]
            pos += n
        if pos != end:
            raise refuse(f"identity block has {end - pos} bytes after the four identities",
                         not_ckpt)
        if any(buf[end:DIGEST_TABLE]):
            raise refuse(f"reserved header bytes [{end}, {DIGEST_TABLE}) are not zero", not_ckpt)
        if values["chunk_bytes"] == 0:
            raise refuse("chunk bytes is 0", not_ckpt)
        expected_chunks = -(-values["payload_bytes"] // values["chunk_bytes"])
        if values["chunk_count"] != expected_chunks:
            raise refuse(f"chunk count {values['chunk_count']} differs from payload bytes / "
                         f"chunk bytes = {expected_chunks}", not_ckpt)
        if values["chunk_count"] > DIGEST_CAPACITY:
            raise refuse(f"chunk count {values['chunk_count']} exceeds the digest table's room "
                         f"of {DIGEST_CAPACITY}", not_ckpt)
        table_end = DIGEST_TABLE + DIGEST_BYTES * values["chunk_count"]
        if any(buf[table_end:HEADER_DIGEST]):
            raise refuse(f"reserved header bytes [{table_end}, {HEADER_DIGEST}) are not zero",
                         not_ckpt)
        digests = tuple(buf[o:o + DIGEST_BYTES] for o in range(DIGEST_TABLE, table_end,
                                                                DIGEST_BYTES))
        return cls(**values, identities=identities, digests=digests, version=version,
                   header_digest=stored)


def check_profile(header: Header, profile, where: str = "checkpoint") -> None:
    """Refuse a header whose identities or size fields differ from `profile`'s, naming the first
    difference (file value vs run value) and, when the file belongs to another known profile,
    which one."""
    owner = header.profile_name()
    if owner is not None and owner != profile.name:
        other = f"; the file is a {owner!r} checkpoint, this run uses profile {profile.name!r}"
        hint = f"pass --profile {owner}, or the checkpoint path of a {profile.name} run"
    else:
        other, hint = "", "this checkpoint belongs to another model or run; pass the right path"
    expected = Header.for_profile(profile, header.update_count, ())
    for name in IDENTITY_NAMES:
        mine, theirs = header.identities[name], expected.identities[name]
        if mine != theirs:
            raise CheckpointRefused(f"{where}: {name} identity differs: "
                                    f"{_identity_difference(mine, theirs)}{other}", hint)
    for attr, _, _, label in SIZE_FIELDS:
        mine, theirs = getattr(header, attr), getattr(expected, attr)
        if mine != theirs:
            raise CheckpointRefused(f"{where}: {label} differs: file {mine} run {theirs}{other}",
                                    hint)


def _identity_difference(file_value: bytes, run_value: bytes) -> str:
    """'file …|part|… run …|part|…' showing the first `|` part that differs."""
    a, b = file_value.split(b"|"), run_value.split(b"|")
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))

    def around(parts: list[bytes]) -> str:
        part = parts[i] if i < len(parts) else b"<end>"
        return (("…|" if i > 0 else "") + _show(part, 100)
                + ("|…" if i + 1 < len(parts) else ""))
    return f"file {around(a)} run {around(b)}"
