"""`coppelius export`: the Llama directory round-trips through `transformers` to the reference's
logits, and a wrong fold, transpose, head order or rotary convention does not.

Tolerance (docs/NUMERICS.md): the numpy reference rounds every matrix-product operand to bf16
(round to nearest even, relative error ≤ 2⁻⁹ each, two operands per product, eight products on the
way from the embedding to a logit) and accumulates in fp32; `transformers` in fp32 rounds nothing.
Their logits therefore differ by bf16 rounding, not by fp32 reassociation: measured 3.4e-3 of
max|logit| on the perturbed tiny checkpoint.  The budget is one bf16 ulp (2⁻⁷ = 7.8e-3) of the
largest logit — ONE_BF16_ULP of tests/support/tolerances.py, the rtol `diff --across-backends`
allows — about 2× the measured error, while every wrong mapping below is off by ≥ 5e-2 (≥ 6×).
"""
import json

import numpy as np
import pytest

from coppelius import forensics
from coppelius.cli import main
from coppelius.plan import profiles as P
from coppelius.plan import reference as ref
from coppelius.plan.reference.numerics import bf16
from tests.support.tolerances import ONE_BF16_ULP

torch = pytest.importorskip("torch", reason="the round trip loads the export with torch")
transformers = pytest.importorskip("transformers", reason="the `hf` extra (transformers) is not "
                                   "installed: pip install -e '.[hf]'")
pytest.importorskip("safetensors", reason="the `hf` extra (safetensors) is not installed")

from coppelius.export import llama, writer  # noqa: E402  (after the skips: needs safetensors)

LOGITS_REL = ONE_BF16_ULP       # |HF − reference| ≤ this · max|reference logit|
CONTEXT_SEED = 35


@pytest.fixture(scope="module")
def context():
    prof = P.get("tiny")
    return np.random.default_rng(CONTEXT_SEED).integers(0, prof.vocab, prof.context)


@pytest.fixture(scope="module")
def reference_logits(tiny_checkpoint, context):
    return ref.forward(P.get("tiny"), tiny_checkpoint[1], context)


def worst(got, want) -> tuple[float, tuple, float, float]:
    """(max |got − want| / max |want|, where, got there, want there), printed by every test."""
    d = np.abs(got - want)
    at = np.unravel_index(int(d.argmax()), d.shape)
    rel = float(d[at] / np.abs(want).max())
    print(f"worst element row {at[0]} token {at[1]}: transformers {got[at]:.6f}, reference "
          f"{want[at]:.6f}, |Δ| {d[at]:.2e} = {rel:.2e} of max|logit| {np.abs(want).max():.3f} "
          f"(tolerance {LOGITS_REL:.2e})")
    return rel, at, float(got[at]), float(want[at])


def hf_logits(model, ids) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(ids, np.int64))[None]).logits[0].float().numpy()


def test_export_round_trips_through_transformers(tiny_checkpoint, context, reference_logits,
                                                 tmp_path):
    path, plane = tiny_checkpoint
    out = tmp_path / "hf"
    assert main(["export", str(path), str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert names == {"config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"}, names
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # nothing left beside
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    rel, *_ = worst(hf_logits(model, context), reference_logits)
    assert rel <= LOGITS_REL


def test_bf16_export_holds_the_kernels_bf16_weights(tiny_checkpoint, context, reference_logits,
                                                    tmp_path):
    """bf16 weights are the reference's own bf(W): loaded in fp32 the logits stay within the
    tolerance (only the folded embedding and the final gain, fp32 in the reference, are rounded)."""
    path, plane = tiny_checkpoint
    out = tmp_path / "hf16"
    assert main(["export", str(path), str(out), "--dtype", "bf16"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    W = ref.unflatten(P.get("tiny"), plane)
    q = model.model.layers[1].self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(q, bf16(W["layers.1.wq"]))
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    rel, *_ = worst(hf_logits(model, context), reference_logits)
    assert rel <= LOGITS_REL


# ---------------------------------------------------------------- the comparison can fail

def _wrong_fold(t, prof, W):
    t["model.embed_tokens.weight"] = np.ascontiguousarray(W["embed"])      # E, not rmsnorm(E)·g


def _wrong_transpose(t, prof, W):
    k = "model.layers.0.self_attn.q_proj.weight"                          # D × H·d: square in tiny
    t[k] = np.ascontiguousarray(t[k].T)


def _wrong_head_order(t, prof, W):
    """Query head h reading kv head h % G instead of h // (H/G): the heads of q and o regrouped."""
    H, G, d = prof.heads, prof.kv_heads, prof.head_dim
    for i in range(prof.layers):
        q, o = f"model.layers.{i}.self_attn.q_proj.weight", f"model.layers.{i}.self_attn.o_proj.weight"
        t[q] = np.ascontiguousarray(t[q].reshape(G, H // G, d, -1).transpose(1, 0, 2, 3)
                                    .reshape(H * d, -1))
        t[o] = np.ascontiguousarray(t[o].reshape(-1, G, H // G, d).transpose(0, 2, 1, 3)
                                    .reshape(-1, H * d))


def _wrong_rotary(t, prof, W):
    """Meta's interleaved pairs (2i, 2i+1) instead of rotate-half (i, i + d/2): the permutation
    Llama's conversion script applies to q and k, here where none belongs."""
    d = prof.head_dim
    for i in range(prof.layers):
        for proj, n in (("q", prof.heads), ("k", prof.kv_heads)):
            k = f"model.layers.{i}.self_attn.{proj}_proj.weight"
            t[k] = np.ascontiguousarray(t[k].reshape(n, 2, d // 2, -1).transpose(0, 2, 1, 3)
                                        .reshape(n * d, -1))


@pytest.mark.parametrize("wrong", [_wrong_fold, _wrong_transpose, _wrong_head_order,
                                   _wrong_rotary], ids=lambda f: f.__name__[1:])
def test_a_wrong_mapping_fails_the_comparison(wrong, tiny_checkpoint, context, reference_logits):
    prof = P.get("tiny")
    plane = tiny_checkpoint[1]
    tensors = llama.hf_tensors(prof, plane)
    wrong(tensors, prof, ref.unflatten(prof, plane))
    cfg = {k: v for k, v in llama.hf_config(prof, "fp32").items()
           if k not in ("architectures", "model_type")}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in tensors.items()}, strict=True)
    rel, *_ = worst(hf_logits(model, context), reference_logits)
    assert rel > 4 * LOGITS_REL, f"{wrong.__name__} would pass the round trip"


# ---------------------------------------------------------------- the directory and refusals

def test_the_tokenizer_loads_and_emits_only_the_models_ids(tiny_checkpoint, tmp_path):
    out = tmp_path / "hf"
    writer.export(forensics.read_checkpoint(tiny_checkpoint[0]), out)
    tk = transformers.AutoTokenizer.from_pretrained(out)
    text = "def add(a, b):\n    return a + b  # sum\n"
    ids = tk(text)["input_ids"]
    assert len(tk) == P.get("tiny").vocab and max(ids) < P.get("tiny").vocab
    assert tk.decode(ids) == text
    assert tk.eos_token == "<|endoftext|>" and tk.eos_token_id == llama.END_OF_TEXT_ID


def test_existing_export_refused_unless_overwrite(tiny_checkpoint, tmp_path, capsys):
    """A previous export is replaced with --overwrite only; any other directory never is
    (tests/host/export/test_export_safety.py)."""
    out = tmp_path / "hf"
    assert main(["export", str(tiny_checkpoint[0]), str(out)]) == 0
    capsys.readouterr()
    assert main(["export", str(tiny_checkpoint[0]), str(out)]) == 2
    assert "exists (a previous export)" in capsys.readouterr().err
    assert main(["export", str(tiny_checkpoint[0]), str(out), "--overwrite", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["profile"] == "tiny" and rep["update_count"] == 3
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_damaged_checkpoint_refused_by_name_nothing_written(tiny_checkpoint, tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    data = bytearray(tiny_checkpoint[0].read_bytes())
    data[-1] ^= 1                                          # the last payload byte
    bad.write_bytes(bytes(data))
    assert main(["export", str(bad), str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "digest" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.ckpt"]


def test_a_tokenizer_cut_to_fewer_ids_is_the_bpe_stopped_there():
    """The default 12,288-id tokenizer cut to 512 ids (what a profile gets when no tokenizer of
    its size ships): it loads, emits only ids below 512, and decodes back to the text."""
    from tokenizers import Tokenizer

    from coppelius import tokenizer as tz
    from coppelius.export import tokenizer_files

    data = json.loads(tz.load(tz.DEFAULT_TOKENIZER).to_str())
    cut = Tokenizer.from_str(json.dumps(tokenizer_files.cut_to(data, 512)))
    text = "import os\nfor name in os.listdir('.'):\n    print(name)\n"
    ids = cut.encode(text).ids
    assert cut.get_vocab_size() == 512 and max(ids) < 512
    assert len(ids) < len(text.encode())                  # merges kept: not bytes alone
    assert cut.decode(ids) == text
