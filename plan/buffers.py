"""Device buffers of the plan: names, element types and shapes, all derived from the profile.

`pmv` and `w16` are fixed by the design (P/M/V planes in one fp32 buffer, the bf16 weight copy in
the P plane's layout); the rest hold the activations the backward pass reads and its scratch.
There is no gradient plane: the weight-gradient launches and embed_grad apply AdamW to each
gradient tile in registers; only the two gains' gradients wait in `dgain` for their update.
Backends allocate each buffer separately (so every base is 256-byte aligned on cuda) and resolve
launch arguments `BufferRef(name, element offset)` against them.
Plain data: no Triton, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from coppelius.plan.attention_split import attention_split
from coppelius.plan.tuning import dn_partials, ssq_parts, tuning
from coppelius.staging import layout

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "i32": 4, "u32": 4}
GAINS = ("g_embed", "g_final")      # the rows of `dgain`, in parameter order

# `staged`: the input record and doorbell, copied from staging by the submission's first
# launch (plan/kernels/release_stage_in.ptx; CONTRACT §7: no later kernel reads staging).  Word
# offsets: the record keeps its staging layout (inputs, then targets), the doorbell follows it.
STAGED_INPUTS = layout.INPUTS // 4
STAGED_TARGETS = layout.TARGETS // 4
STAGED_DOORBELL = layout.INPUT_RECORD_BYTES // 4
STAGED_WORDS = STAGED_DOORBELL + 4              # padded to 16 bytes


@dataclass(frozen=True)
class BufferSpec:
    name: str
    dtype: str                  # "fp32" | "bf16" | "i32"
    shape: tuple[int, ...]
    role: str

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.elements * DTYPE_BYTES[self.dtype]


def qkv_width(profile) -> int:
    """Columns of the fused q|k|v rows: (H + 2G)·d (Wq, Wk, Wv are adjacent in the P plane)."""
    return (profile.heads + 2 * profile.kv_heads) * profile.head_dim


def norm_points(profile) -> int:
    """rmsnorm sites that feed a matmul: two per layer (attention, MLP) and the final norm."""
    return 2 * profile.layers + 1


def buffers(profile) -> dict[str, BufferSpec]:
    """Every device buffer of the three submissions, in allocation order."""
    T, D, V, F, L = profile.context, profile.width, profile.vocab, profile.hidden, profile.layers
    N, W, Hd, H = profile.parameter_count, qkv_width(profile), profile.q_width, profile.heads
    S = norm_points(profile)
    G, d = profile.kv_heads, profile.head_dim
    tu = tuning(profile)
    split = attention_split(profile, tu)
    specs = [
        BufferSpec("pmv", "fp32", (3, N), "P plane at 0, M at N, V at 2N (the checkpoint payload)"),
        BufferSpec("w16", "bf16", (N,), "bf16 copy of P (the matmuls' weights; AdamW leaves E and "
                   "the gains stale: nothing reads them as bf16)"),
        BufferSpec("dgain", "fp32", (len(GAINS), D), "gradients of g_embed and g_final, until "
                   "embed_grad applies AdamW to them"),
        BufferSpec("emb", "fp32", (T, D), "gathered embedding rows E[inputs]"),
        BufferSpec("resid", "fp32", (S, T, D), "residual stream entering each norm site"),
        BufferSpec("rstd", "fp32", (S + 1, T), "1/rms per row: embed norm, then each norm site"),
        BufferSpec("ssq", "fp32", (L, ssq_parts(tu, T, D), T), "per-row partial sums of squares "
                   "of each layer's residual after attention, one per out_proj column tile, for "
                   "the MLP norm (the other norms form r from whole rows)"),
        BufferSpec("h16", "bf16", (S, T, D), "bf16 norm outputs (hf with g_final at the last)"),
        BufferSpec("rope", "fp32", (T, profile.head_dim), "rotary table [cos | sin] per row (embed_fwd)"),
        BufferSpec("qkv16", "bf16", (L, T, W), "q'|k'|v after rotary, per layer (matmul_rotary)"),
        BufferSpec("o16", "bf16", (L, T, Hd), "attention output, matmul operand"),
        BufferSpec("o32", "fp32", (L, T, Hd), "attention output, for delta = rowsum(do·o)"),
        BufferSpec("lse", "fp32", (L, H, T), "attention log-sum-exp per head and row"),
        BufferSpec("ab", "bf16", (L, T, 2 * F), "gate | up pre-activations per layer, bf(a) | bf(b)"),
        BufferSpec("z16", "bf16", (L, T, F), "bf(silu(a)·b) per layer"),
        BufferSpec("down_part", "fp32", (tu.dn_splits, T, D), "the mlp down's split-K partials, "
                   "summed in order by residual_norm (every layer reuses them)"),
        BufferSpec("logits", "fp32", (T, V), "head output"),
        BufferSpec("dlogits16", "bf16", (T, V), "bf((softmax − onehot)/T)"),
        BufferSpec("dn", "fp32", (dn_partials(tu), T, D),
                   "gradient at a norm output (dhf, dh): "
                   "split-K partials, summed in order by the norm backward"),
        BufferSpec("dres", "fp32", (T, D), "residual-stream gradient"),
        # the weight-gradient launches run on the side lane, after later backward launches of the
        # main lane: what they read has a slab of its own (per norm site, per layer), never
        # rewritten within an issue (tests/plan/test_lane_hazards.py)
        BufferSpec("dres16", "bf16", (S, T, D), "bf(residual-stream gradient) below each norm "
                   "site, written by that site's norm backward"),
        BufferSpec("dab16", "bf16", (L, T, 2 * F), "bf(da) | bf(db) per layer"),
        BufferSpec("do32", "fp32", (T, Hd), "gradient at the attention output"),
        BufferSpec("delta", "fp32", (H, T), "rowsum(do·o) per head"),
        BufferSpec("dqkv16", "bf16", (L, T, W), "bf(dq|dk|dv) per layer, inverse rotary applied "
                   "by the attention backward"),
        BufferSpec("de", "fp32", (T, D), "gradient at the gathered embedding rows"),
        BufferSpec("next_row", "i32", (T,), "next row with the same input token (T if none), embed_fwd"),
        BufferSpec("staged", "u32", (STAGED_WORDS,), "the issue's input record and doorbell, "
                   "copied from staging by the first launch"),
        # the dK/dV split (plan/attention_split.py): slot c holds chunk c's partial; every layer
        # reuses them (written by attention_bwd, read by attention_bwd_dq)
        BufferSpec("attn_kv_part", "fp32", (split.bwd_slots, T, 2 * G * d),
                   "attention_bwd chunks: dk' | dv partial sums per kv head (before rotary_backward)"),
        BufferSpec("ds16", "bf16", (H, T, T),
                   "bf(ds)ᵀ per head, [kv row, query row] (attention_bwd → attention_bwd_dq)"),
    ]
    return {s.name: s for s in specs}
