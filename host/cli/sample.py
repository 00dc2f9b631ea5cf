"""`coppelius sample CHECKPOINT --prompt TEXT [--max-new-tokens N] [--greedy | --temperature T
--top-k K --seed S] [--json]`: text from a checkpoint through its Hugging Face export.

The command: arguments and the printout; the export and `transformers`' generate are
`coppelius.export.generate`'s."""
from __future__ import annotations

from pathlib import Path

ORDER = 52


def register(sub) -> None:
    from coppelius.export.generate import DEFAULT_MAX_NEW_TOKENS, DEFAULT_TEMPERATURE, NO_TOP_K

    p = sub.add_parser("sample", help="generate text from a checkpoint (through its export and "
                                      "transformers)",
                       description="Export the checkpoint to the Hugging Face Llama layout in a "
                       "temporary directory, load it with transformers and continue the prompt "
                       "with its generate: greedy by default, or sampled with a temperature, a "
                       "top-k and a seed.")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--prompt", required=True, help="the text to continue ('' starts from "
                                                   "<|endoftext|>)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help=f"at most this many new tokens (default {DEFAULT_MAX_NEW_TOKENS}); "
                        "generation also stops at <|endoftext|>")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true",
                      help="the most likely token each step (the default without --temperature, "
                           "--top-k or --seed)")
    mode.add_argument("--temperature", type=float,
                      help=f"sample at this temperature (default {DEFAULT_TEMPERATURE} once "
                           "sampling)")
    p.add_argument("--top-k", type=int, help=f"sample among the K most likely tokens "
                                             f"({NO_TOP_K}: all; default {NO_TOP_K})")
    p.add_argument("--seed", type=int, help="the sampler's seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from coppelius import forensics
    from coppelius.export import generate

    sampling = any(v is not None for v in (args.temperature, args.top_k, args.seed))
    if args.greedy and sampling:
        raise generate.SampleRefused("--greedy takes no --top-k or --seed",
                                     "drop --greedy to sample, or the sampling options")
    temperature = generate.DEFAULT_TEMPERATURE if args.temperature is None else args.temperature
    top_k = generate.NO_TOP_K if args.top_k is None else args.top_k
    generate.check_options(args.max_new_tokens, temperature, top_k)   # before reading anything
    ck = forensics.read_checkpoint(args.checkpoint)
    rep = generate.sample(ck, args.prompt, args.max_new_tokens, greedy=not sampling,
                          temperature=temperature, top_k=top_k,
                          seed=0 if args.seed is None else args.seed)
    if args.json:
        print(forensics.dumps(rep))
        return 0
    how = ("greedy" if rep["mode"] == "greedy" else
           f"temperature {rep['temperature']:g}, top-k {rep['top_k'] or 'off'}, seed {rep['seed']}")
    print(f"{rep['prompt']}{rep['text']}")
    print(f"-- {len(rep['new_ids'])} new tokens ({how}; stopped at {rep['stopped']}), "
          f"{rep['profile']} update {rep['update_count']}, {rep['tokens_per_s']:.0f} tokens/s",
          flush=True)
    return 0
