"""`coppelius eval CHECKPOINT --tokens CACHE [--contexts N] [--first C] [--backend B] [--json]`:
the mean per-token loss of a checkpoint over contexts of a token cache.

The command: arguments, the progress line and the report; the contexts, the backends and the
floor are `coppelius.export.evaluate`'s."""
from __future__ import annotations

import sys
from pathlib import Path

ORDER = 54


def register(sub) -> None:
    from coppelius.export.evaluate import BACKENDS, DEFAULT_CONTEXTS

    p = sub.add_parser("eval", help="mean per-token loss of a checkpoint over a token cache's "
                                    "contexts",
                       description="The mean per-token cross-entropy of the checkpoint over N "
                       "contexts of a token cache: on a GPU through the forward submission (the "
                       "training kernels), on the CPU through the numpy reference.  On the "
                       "embedded stream the contexts' floor is shown beside it.")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--tokens", type=Path, required=True, help="a token cache (`coppelius "
                   "tokenize`, or the embedded stream `<directory>/<profile>-stream.tokens`)")
    p.add_argument("--contexts", type=int, default=DEFAULT_CONTEXTS,
                   help=f"contexts to score (default {DEFAULT_CONTEXTS})")
    p.add_argument("--first", type=int, help="the first context (default: the checkpoint's "
                   "update count, the first context a run from 0 on this cache did not train on)")
    p.add_argument("--backend", choices=BACKENDS, default="auto",
                   help="cuda (the forward submission), interpret (the same on Triton's "
                        "interpreter: slow), reference (numpy), auto (default: cuda when it "
                        "opens here, else reference)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _progress(enabled: bool):
    def show(done: int, total: int, mean: float) -> None:
        if enabled:
            end = "\n" if done == total else ""
            print(f"\rcontext {done}/{total}: mean loss {mean:.4f}", end=end, file=sys.stderr,
                  flush=True)
    return show


def run(args) -> int:
    from coppelius import forensics
    from coppelius.export import evaluate

    ck = forensics.read_checkpoint(args.checkpoint)
    rep = evaluate.evaluate(ck, args.tokens, args.contexts, args.first, args.backend,
                            progress=_progress(sys.stderr.isatty()))
    if args.json:
        print(forensics.dumps(rep))
        return 0
    last = rep["first_context"] + rep["contexts"] - 1
    print(f"{rep['checkpoint']} ({rep['profile']}, update {rep['update_count']}) on "
          f"{rep['tokens']}, contexts {rep['first_context']}..{last} "
          f"({rep['tokens_scored']:,} tokens)")
    if rep["note"]:
        print(f"  {rep['note']}")
    line = (f"  mean loss {rep['mean_loss']:.4f} nats/token (perplexity {rep['perplexity']:.2f})"
            f" · {rep['backend']} on {rep['device']}, {rep['seconds']:.1f} s")
    print(line)
    if rep["embedded_stream"]:
        print(f"  floor {rep['mean_floor']:.4f} · {rep['loss_minus_floor']:+.4f} over floor · "
              f"no-copy {rep['no_copy']:.4f} (the embedded stream's exact levels of these "
              "contexts)")
    return 0
