"""`coppelius checkpoint show|verify PATH`: envelope fields, identities, digests; full verification."""
from __future__ import annotations

ORDER = 40


def register(sub) -> None:
    p = sub.add_parser("checkpoint", help="show or verify a checkpoint file's envelope",
                       description="Inspect (show) or fully verify (verify) a checkpoint file.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="header fields, identities, update count, digests "
                                           "(checks the header, not the payload)")
    show.add_argument("path", metavar="PATH")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=run_show)
    verify = actions.add_parser("verify", help="verify header, identities, sizes and every "
                                               "chunk digest; exit 0 only if valid")
    verify.add_argument("path", metavar="PATH")
    verify.add_argument("--profile", help="check against this profile (default: the profile "
                                          "whose identities the file carries)")
    verify.set_defaults(func=run_verify)


def _profile_for(header, name, where):
    from plan import profiles
    from .checkpoint_format import CheckpointRefused
    if name is not None:
        return profiles.get(name)
    owner = header.profile_name()
    if owner is None:
        raise CheckpointRefused(f"{where}: its identities match no known profile "
                                f"(initialization identity "
                                f"{header.identities['initialization'].decode('ascii', 'replace')!r})",
                                "pass --profile to see which identity differs")
    return profiles.get(owner)


def run_show(args) -> int:
    import json

    from .console import report_console, styled
    from rich.table import Table

    from .checkpoint import read_header
    from .checkpoint_format import HEADER_BYTES, IDENTITY_NAMES, SIZE_FIELDS

    header, st = read_header(args.path)
    if header is None:
        if args.json:
            print(json.dumps({"path": args.path, "bytes": 0, "fresh": True}))
        else:
            print(f"{args.path}: 0 bytes — selects fresh initialization; holds no checkpoint")
        return 0
    size_note = ("matches header + payload" if st.st_size == header.file_bytes else
                 f"DIFFERS from header + payload = {header.file_bytes}")
    fields = {"update_count": header.update_count,
              **{attr: getattr(header, attr) for attr, *_ in SIZE_FIELDS}}
    if args.json:
        print(json.dumps({
            "path": args.path, "bytes": st.st_size, "size_ok": st.st_size == header.file_bytes,
            "version": header.version, "header_bytes": HEADER_BYTES, **fields,
            "profile": header.profile_name(),
            "identities": {k: v.decode("ascii", "backslashreplace")
                           for k, v in header.identities.items()},
            "header_sha256": header.header_digest.hex(),
            "chunk_sha256": [d.hex() for d in header.digests]}, indent=1))
        return 0
    console = report_console()
    t = Table(title=f"checkpoint {args.path}", show_header=False)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    t.add_row("file bytes", f"{st.st_size:,} ({size_note})")
    t.add_row("envelope version", str(header.version))
    t.add_row("profile", header.profile_name() or styled(("none known", "red")))
    for attr, *_ in (("update_count",), *SIZE_FIELDS):
        t.add_row(attr.replace("_", " "), f"{getattr(header, attr):,}")
    for name in IDENTITY_NAMES:
        t.add_row(f"{name} identity", header.identities[name].decode("ascii", "backslashreplace"))
    t.add_row("header sha256", header.header_digest.hex())
    console.print(t)
    d = Table(title="chunk digests (SHA-256)")
    d.add_column("chunk", justify="right")
    d.add_column("payload bytes", justify="right")
    d.add_column("sha256", overflow="fold")
    for i, digest in enumerate(header.digests):
        start, nbytes = header.chunk_span(i)
        d.add_row(str(i + 1), f"[{start:,}, {start + nbytes:,})", digest.hex())
    console.print(d)
    return 0


def run_verify(args) -> int:
    from .checkpoint import load_chunks, read_header
    from .checkpoint_format import CheckpointRefused
    from .checkpoint_io import describe

    where = describe(args.path)
    header, st = read_header(args.path)
    if header is None:
        raise CheckpointRefused(f"{where}: 0 bytes — a zero-byte file selects fresh "
                                "initialization but holds no checkpoint",
                                "nothing to verify; a run will start fresh from it")
    profile = _profile_for(header, args.profile, where)
    loaded = load_chunks(args.path, profile, lambda offset, view: None)
    mb = loaded.header.file_bytes / 1e6
    print(f"{where}: valid — profile {profile.name}, update count {loaded.update_count:,}, "
          f"{loaded.header.chunk_count} chunks, payload sha256 {loaded.payload_sha256.hex()}, "
          f"{mb:,.1f} MB in {loaded.seconds:.2f} s ({mb / max(loaded.seconds, 1e-9):,.0f} MB/s)")
    return 0
