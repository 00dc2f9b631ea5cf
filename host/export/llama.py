"""A Coppelius P plane as a Hugging Face Llama model: the tensor names, the two folds, config.json.

The model (docs/NUMERICS.md, plan/reference/) is a Llama decoder as `transformers` computes it:
RMSNorm (eps 1e-6, fp32), rotary in rotate-half form over the whole head with
angle = pos · 10000^(-2i/d) applied to both halves (`LlamaRotaryEmbedding`'s `cat(freqs, freqs)`
and `rotate_half`, so q and k need no row permutation), grouped-query attention in which query
head h reads kv head h // (H/G) (`repeat_kv`: each kv head repeated H/G times in place), scale
d^-½, SwiGLU `down(silu(gate(h)) · up(h))`, no biases, an untied head.  Every matrix is stored
[out, in], the layout of `torch.nn.Linear.weight`, so no weight is transposed.

Two differences fold exactly:
- the embedding: Coppelius's residual stream starts at `rmsnorm(E[i]) · g_embed`, which depends on
  the token id alone, so the exported `embed_tokens` row i is that value (fp32, the reference's own
  `rmsnorm`, so the row is bit-identical to the reference's residual stream at row 0);
- the per-layer norms have no gain: `input_layernorm` and `post_attention_layernorm` are ones.
`g_final` is `model.norm.weight` and the head is `lm_head.weight` as they are.
"""
from __future__ import annotations

import numpy as np

from coppelius.plan import profiles as P
from coppelius.plan import reference as ref
from coppelius.plan.reference.numerics import bf16_bits

MODEL_TYPE = "llama"
ARCHITECTURE = "LlamaForCausalLM"
ACTIVATION = "silu"
DTYPES = ("fp32", "bf16")                       # --dtype choices
TORCH_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16"}     # config.json's "dtype"
SAFETENSORS_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}    # safetensors TensorSpec dtypes
END_OF_TEXT_ID = 0                              # <|endoftext|> (host/tokenizer.py): the eos

# per layer: the HF name of each Coppelius matrix (both [out, in])
LAYER_MATRICES = (("wq", "self_attn.q_proj"), ("wk", "self_attn.k_proj"),
                  ("wv", "self_attn.v_proj"), ("wo", "self_attn.o_proj"),
                  ("wgate", "mlp.gate_proj"), ("wup", "mlp.up_proj"),
                  ("wdown", "mlp.down_proj"))
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")   # gainless: weight 1


def folded_embedding(E: np.ndarray, g_embed: np.ndarray) -> np.ndarray:
    """(V, D) fp32: row i = rmsnorm(E[i]) · g_embed, the residual stream a token i starts as."""
    y, _ = ref.rmsnorm(E)
    return (y * g_embed).astype(np.float32)


def hf_tensors(profile, plane: np.ndarray) -> dict[str, np.ndarray]:
    """The Llama state dict of a P plane: {HF name: fp32 array}, in the model's order."""
    W = ref.unflatten(profile, plane)
    D = profile.width
    out = {"model.embed_tokens.weight": folded_embedding(W["embed"], W["g_embed"])}
    for i in range(profile.layers):
        pre = f"model.layers.{i}."
        for norm in LAYER_NORMS:
            out[pre + norm + ".weight"] = np.ones(D, np.float32)
        for ours, theirs in LAYER_MATRICES:
            out[pre + theirs + ".weight"] = W[f"layers.{i}.{ours}"]
    out["model.norm.weight"] = W["g_final"]
    out["lm_head.weight"] = W["head"]
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def as_dtype(tensors: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """fp32 arrays as they are, or their bf16 bit patterns (uint16, round to nearest even: the
    same rounding as the kernels' bf16 weight copy)."""
    if dtype == "fp32":
        return tensors
    return {k: np.ascontiguousarray(bf16_bits(v)) for k, v in tensors.items()}


def hf_config(profile, dtype: str) -> dict:
    """config.json for `LlamaForCausalLM` (transformers ≥ 5 reads `rope_parameters`; `rope_theta`
    is kept beside it for older readers)."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": profile.vocab,
        "hidden_size": profile.width,
        "intermediate_size": profile.hidden,
        "num_hidden_layers": profile.layers,
        "num_attention_heads": profile.heads,
        "num_key_value_heads": profile.kv_heads,
        "head_dim": profile.head_dim,
        "hidden_act": ACTIVATION,
        "max_position_embeddings": profile.context,
        "rms_norm_eps": P.RMS_EPS,
        "rope_theta": P.ROPE_BASE,
        "rope_parameters": {"rope_type": "default", "rope_theta": P.ROPE_BASE},
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": P.INIT_STD,
        "bos_token_id": END_OF_TEXT_ID,
        "eos_token_id": END_OF_TEXT_ID,
        "pad_token_id": END_OF_TEXT_ID,
        "use_cache": True,
        "dtype": TORCH_DTYPE_NAMES[dtype],
    }


def generation_config() -> dict:
    """generation_config.json: stop at <|endoftext|>, which `coppelius tokenize` puts after every
    file; greedy unless the caller asks to sample."""
    return {"bos_token_id": END_OF_TEXT_ID, "eos_token_id": END_OF_TEXT_ID,
            "pad_token_id": END_OF_TEXT_ID, "do_sample": False}
