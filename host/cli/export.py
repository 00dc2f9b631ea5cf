"""`coppelius export CHECKPOINT DIR [--dtype fp32|bf16] [--overwrite] [--json]`: a checkpoint as a
Hugging Face Llama directory that `transformers` loads with no custom code.

The command: arguments and the report; the checkpoint is read and verified by
`coppelius.forensics.read_checkpoint` (a damaged one is refused, nothing written), the mapping and
the directory are `coppelius.export`'s."""
from __future__ import annotations

from pathlib import Path

ORDER = 50


def register(sub) -> None:
    from coppelius.export.llama import DTYPES

    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face Llama model directory",
                       description="Write the checkpoint's parameters in the Hugging Face Llama "
                       "layout (config.json, model.safetensors, the tokenizer files): "
                       "AutoModelForCausalLM.from_pretrained(DIR) and "
                       "AutoTokenizer.from_pretrained(DIR) load it.")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("directory", type=Path, metavar="DIR")
    p.add_argument("--dtype", choices=DTYPES, default="fp32",
                   help="weights as trained (fp32, default) or rounded to bf16 (half the size)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing DIR that a previous export wrote (and holds nothing "
                   "else); any other directory is refused")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from coppelius import forensics
    from coppelius.export import writer

    # before reading the checkpoint; a directory that is not a previous export is never replaced
    writer.check_target(args.directory, args.overwrite, args.checkpoint)
    ck = forensics.read_checkpoint(args.checkpoint)
    rep = writer.export(ck, args.directory, args.dtype, args.overwrite)
    if args.json:
        print(forensics.dumps(rep))
        return 0
    tk = rep["tokenizer"]
    cut = (f", cut from {tk['source_ids']:,} ids" if tk["ids"] != tk["source_ids"] else "")
    print(f"exported {args.checkpoint} ({rep['profile']}, update {rep['update_count']}) to "
          f"{rep['directory']}: {', '.join(rep['files'])}")
    print(f"  weights {rep['dtype']}, {rep['weights_bytes']:,} bytes; tokenizer {tk['ids']:,} ids"
          f"{cut}; {rep['seconds']:.1f} s")
    return 0
