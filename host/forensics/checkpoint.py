"""A checkpoint file read and verified, its profile inferred from its envelope.

`profile_for` names the profile whose identities an envelope carries (or checks a given one);
`verify_checkpoint` verifies header, identities, sizes and every chunk digest without keeping the
planes (`coppelius checkpoint verify`); `read_checkpoint` does the same and returns the planes.
The envelope and the streaming load are `coppelius.checkpoints`'.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Checkpoint:
    """A verified checkpoint: its profile, update count and the P, M, V planes (float32)."""
    path: str
    profile: object                     # coppelius.plan.profiles.Profile
    update_count: int
    payload_sha256: str                 # hex; the stat record of a run that loads it names it
    file_bytes: int
    chunks: int
    P: np.ndarray = field(repr=False)   # (parameter_count,) f32: the parameters
    M: np.ndarray = field(repr=False)   # AdamW first moment
    V: np.ndarray = field(repr=False)   # AdamW second moment


def profile_for(header, profile=None, where: str = "checkpoint"):
    """The profile to check envelope `header` against: `profile` (a name or a Profile) when given,
    else the profile whose identities the header carries.  CheckpointRefused when none matches;
    `where` is how the message names the file."""
    from coppelius.checkpoints.format import CheckpointRefused
    from coppelius.plan import profiles
    if profile is not None:
        return profiles.get(profile) if isinstance(profile, str) else profile
    owner = header.profile_name()
    if owner is None:
        raise CheckpointRefused(f"{where}: its identities match no known profile "
                                f"(initialization identity "
                                f"{header.identities['initialization'].decode('ascii', 'replace')!r})",
                                "pass --profile to see which identity differs")
    return profiles.get(owner)


def checkpoint_profile(path, profile=None):
    """The profile of the checkpoint at `path` (see `profile_for`); a zero-byte file (it selects
    fresh initialization) holds no checkpoint and is refused."""
    from coppelius.checkpoints import read_header
    from coppelius.checkpoints.chunks import describe
    from coppelius.checkpoints.format import CheckpointRefused
    where = describe(path)
    header, _st = read_header(path)
    if header is None:
        raise CheckpointRefused(f"{where}: 0 bytes — a zero-byte file selects fresh "
                                "initialization but holds no checkpoint",
                                "nothing to verify; a run will start fresh from it")
    return profile_for(header, profile, where)


def verify_checkpoint(path, profile=None) -> dict:
    """Verify the checkpoint at `path`: header, identities, sizes and every chunk digest, against
    `profile` (a name or a Profile; default: the one its envelope names).  Returns {"path",
    "profile", "update_count", "chunks", "payload_sha256" (hex), "file_bytes", "seconds"};
    raises CheckpointRefused (a UserError) saying what is wrong."""
    from coppelius.checkpoints import load_chunks
    prof = checkpoint_profile(path, profile)
    loaded = load_chunks(path, prof, lambda offset, view: None)
    return {"path": os.fspath(path), "profile": prof.name, "update_count": loaded.update_count,
            "chunks": loaded.header.chunk_count, "payload_sha256": loaded.payload_sha256.hex(),
            "file_bytes": loaded.header.file_bytes, "seconds": loaded.seconds}


def read_checkpoint(path, profile=None) -> Checkpoint:
    """Read and verify the checkpoint at `path` (as `verify_checkpoint`) and return its planes."""
    from coppelius.checkpoints import open_input
    from coppelius.plan import profiles
    prof = checkpoint_profile(path, profile)
    payload = np.empty(profiles.PLANES * prof.parameter_count, "<f4")
    with open_input(path, prof) as inp:
        loaded = inp.load_into(payload.view(np.uint8))
    P, M, V = payload.reshape(profiles.PLANES, -1)
    return Checkpoint(path=os.fspath(path), profile=prof, update_count=loaded.update_count,
                      payload_sha256=loaded.payload_sha256.hex(),
                      file_bytes=loaded.header.file_bytes, chunks=loaded.header.chunk_count,
                      P=P, M=M, V=V)
