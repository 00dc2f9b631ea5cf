"""`coppelius sample`: text from a checkpoint through its export and `transformers`' `generate`.

The checkpoint is exported (fp32) into a temporary directory and loaded with
`AutoModelForCausalLM` and `AutoTokenizer` exactly as a user of the export would: the sampler is
`transformers`' (greedy, or temperature and top-k with a seed), not a hand-written one, so what
this prints is what the exported model gives anywhere.  Generation stops at `<|endoftext|>` or
after `max_new_tokens`; the prompt and the new tokens together must fit the context (the model
was trained on positions below it, and the rotary tables stop there).
"""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from coppelius.extras import install_command
from coppelius.export import llama, writer

DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_TEMPERATURE = 1.0
NO_TOP_K = 0                    # transformers: top_k = 0 keeps every token


class SampleRefused(writer.ExportRefused):
    """A sampling request that cannot run (options, prompt length, libraries)."""


def _libraries():
    try:
        import torch
        import transformers
    except ImportError as e:
        extra = "hf" if e.name == "transformers" else "demo"      # demo brings torch and hf
        raise SampleRefused(f"sampling needs torch and transformers ({e})",
                            install_command(extra)) from None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return torch, transformers


def check_options(max_new_tokens: int, temperature: float, top_k: int) -> None:
    if max_new_tokens < 1:
        raise SampleRefused(f"--max-new-tokens {max_new_tokens} is below 1",
                            "ask for at least one new token")
    if not (math.isfinite(temperature) and temperature > 0):
        raise SampleRefused(f"--temperature {temperature} is not a positive number",
                            "use --greedy for the most likely token each step")
    if top_k < 0:
        raise SampleRefused(f"--top-k {top_k} is negative", f"{NO_TOP_K} keeps every token")


def _prompt_ids(tok, prompt: str, profile, max_new_tokens: int) -> list[int]:
    """The prompt's ids (an empty prompt starts from <|endoftext|>, where every file starts)."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"] or [llama.END_OF_TEXT_ID]
    if len(ids) + max_new_tokens > profile.context:
        raise SampleRefused(f"the prompt's {len(ids)} tokens and {max_new_tokens} new ones exceed "
                            f"the {profile.name} context of {profile.context} tokens",
                            "shorten the prompt or lower --max-new-tokens")
    return ids


def sample(checkpoint, prompt: str, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
           greedy: bool = True, temperature: float = DEFAULT_TEMPERATURE, top_k: int = NO_TOP_K,
           seed: int = 0) -> dict:
    """Generate from `checkpoint` (a verified `coppelius.forensics.Checkpoint`); returns the
    prompt, the new ids and text, why generation stopped, the settings and the seconds taken."""
    check_options(max_new_tokens, temperature, top_k)
    torch, transformers = _libraries()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coppelius-sample-") as tmp:
        where = Path(tmp) / "model"
        writer.export(checkpoint, where)
        tok = transformers.AutoTokenizer.from_pretrained(where)
        model = transformers.AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
    model.eval()
    ids = _prompt_ids(tok, prompt, checkpoint.profile, max_new_tokens)
    settings = ({"do_sample": False} if greedy else
                {"do_sample": True, "temperature": temperature, "top_k": top_k})
    t_gen = time.monotonic()
    with torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens,
                             eos_token_id=llama.END_OF_TEXT_ID, pad_token_id=llama.END_OF_TEXT_ID,
                             top_p=None, **settings)
    new = [int(i) for i in out[0, len(ids):]]
    stopped = "end of text" if new and new[-1] == llama.END_OF_TEXT_ID else "max new tokens"
    return {"checkpoint": str(checkpoint.path), "profile": checkpoint.profile.name,
            "update_count": checkpoint.update_count, "prompt": prompt, "prompt_ids": ids,
            "new_ids": new, "text": tok.decode(new), "stopped": stopped,
            "mode": "greedy" if greedy else "sample",
            "temperature": None if greedy else temperature, "top_k": None if greedy else top_k,
            "seed": None if greedy else seed, "tokens_per_s": len(new) / (time.monotonic() - t_gen),
            "seconds": time.monotonic() - t0}
