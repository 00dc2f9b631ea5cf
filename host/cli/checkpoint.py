"""`coppelius checkpoint show|verify PATH`: envelope fields, identities, digests; full verification.

The command: arguments and the report; the verification (the profile inferred from the envelope)
is `coppelius.forensics.checkpoint`."""
from __future__ import annotations

ORDER = 40


def register(sub) -> None:
    p = sub.add_parser("checkpoint", help="show or verify a checkpoint file's envelope",
                       description="Inspect (show) or fully verify (verify) a checkpoint file.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="header fields, identities, update count, digests "
                                           "(checks the header, not the payload)")
    show.add_argument("path", metavar="PATH")
    show.add_argument("--profile", help="also check the header against this profile (its "
                                        "identities and sizes; default: show it as it is)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=run_show)
    verify = actions.add_parser("verify", help="verify header, identities, sizes and every "
                                               "chunk digest; exit 0 only if valid")
    verify.add_argument("path", metavar="PATH")
    verify.add_argument("--profile", help="check against this profile (default: the profile "
                                          "whose identities the file carries)")
    verify.set_defaults(func=run_verify)


def run_show(args) -> int:
    import json

    from coppelius.cli.console import report_console, styled
    from rich.table import Table

    from coppelius.checkpoints import read_header
    from coppelius.checkpoints.chunks import describe
    from coppelius.checkpoints.format import (HEADER_BYTES, IDENTITY_NAMES, SIZE_FIELDS,
                                              check_profile)
    from coppelius.plan import profiles

    profile = None if args.profile is None else profiles.get(args.profile)
    header, st = read_header(args.path)
    if header is not None and profile is not None:
        check_profile(header, profile, describe(args.path))      # refused: the field named
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
    from coppelius.checkpoints.chunks import describe
    from coppelius.forensics.checkpoint import verify_checkpoint

    v = verify_checkpoint(args.path, args.profile)
    mb = v["file_bytes"] / 1e6
    print(f"{describe(args.path)}: valid — profile {v['profile']}, update count "
          f"{v['update_count']:,}, {v['chunks']} chunks, payload sha256 {v['payload_sha256']}, "
          f"{mb:,.1f} MB in {v['seconds']:.2f} s ({mb / max(v['seconds'], 1e-9):,.0f} MB/s)")
    return 0
