"""Launch builders of the other kernel families: release, row norms, attention, cross-entropy,
predictions, embedding backward with its AdamW, the learner's constants, casts and copies.

One function per kernel; buffers by keyword (the kernel's `*_ptr` names without the suffix), flags
by keyword; grid, blocks and warps come from the profile's tuning.  A builder refuses a shape its
kernel cannot run.  Plain data: no Triton.
"""
from __future__ import annotations

import math

import numpy as np

from coppelius.plan import profiles as P
from coppelius.plan.attention_split import AttentionSplit, attention_split
from coppelius.plan.buffers import GAINS
from coppelius.plan.ints import cdiv, next_pow2
from coppelius.plan.launches.refs import Context, staging
from coppelius.plan.launches.types import RELEASE, STAGE_IN, BufferRef, Launch, RunScalar, StagingRef, i32, triton_launch
from coppelius.plan.tuning import ssq_parts
from coppelius.staging import layout as L


STAGE_IN_WARPS = 8          # release_stage_in.ptx: .reqntid 256, 32 bytes of the record each


def _slot(submission: int, which: int) -> StagingRef:
    part = "SLOT_PRELAUNCH_RELEASE" if which == L.SLOT_PRELAUNCH_RELEASE else "SLOT_FINAL_RELEASE"
    return StagingRef(f"semaphore_slot({submission}) + {part}",
                      L.semaphore_slot(submission) + which, "u32")


def release_stage_in(ctx: Context, submission: int) -> Launch:
    """A submission's first launch (hand-written PTX): copies the input record and the doorbell
    from staging into `staged`, and writes the pre-launch semaphore record."""
    args = (("doorbell_ptr", staging("DOORBELL", "u32")),
            ("slot_ptr", _slot(submission, L.SLOT_PRELAUNCH_RELEASE)),
            ("record_ptr", staging("INPUTS", "u32")),
            ("staged_ptr", ctx.buf("staged")))
    return Launch(STAGE_IN, "", STAGE_IN, (1, 1, 1), args, (), STAGE_IN_WARPS, 1,
                  "prelaunch_release+stage_in")


def release(ctx: Context, submission: int) -> Launch:
    """The hand-written release kernel as a submission's last launch: the final semaphore record
    of `submission`, its payload the staged doorbell."""
    args = (("doorbell_ptr", ctx.doorbell()),
            ("slot_ptr", _slot(submission, L.SLOT_FINAL_RELEASE)))
    return Launch(RELEASE, "", RELEASE, (1, 1, 1), args, (), 1, 1, "final_release")


# ---------------------------------------------------------------- row norms

def _row_programs(ctx: Context) -> int:
    return cdiv(ctx.T, ctx.tu.rows)


def embed_fwd(ctx: Context, *, ids, table, g, emb, rstd, x, h16, rstd0, rope, next_row,
              label: str) -> Launch:
    """emb = E[ids], rstd, x = rmsnorm(emb)·g, and the first attention norm of x (h16, rstd0);
    the rotary table and the next-row links."""
    tu = ctx.tu
    return triton_launch("coppelius.plan.kernels.norms", "embed_fwd", (_row_programs(ctx),),
                         {"ids_ptr": ids, "table_ptr": table, "g_ptr": g, "emb_ptr": emb,
                          "rstd_ptr": rstd, "x_ptr": x, "h16_ptr": h16, "rstd0_ptr": rstd0,
                          "rope_ptr": rope, "next_ptr": next_row, "T": i32(ctx.T)},
                         {"V": ctx.V, "D": ctx.D, "HEAD_DIM": ctx.p.head_dim, "BLOCK_R": tu.rows,
                          "BLOCK_D": next_pow2(ctx.D), "BLOCK_T": next_pow2(ctx.T)},
                         num_warps=tu.rows_warps, num_stages=1, label=label)


def rmsnorm_rows(ctx: Context, *, x, ssq, h16, rstd, label: str) -> Launch:
    """h16 = bf(rmsnorm(x)) and rstd of T rows, r from the producer's partial sums of squares:
    the SwiGLU forward's bf16 operand (and the backward's), written once."""
    tu = ctx.tu
    return triton_launch("coppelius.plan.kernels.norms", "rmsnorm_rows", (_row_programs(ctx),),
                         {"x_ptr": x, "ssq_ptr": ssq, "h16_ptr": h16, "rstd_ptr": rstd,
                          "T": i32(ctx.T)},
                         {"D": ctx.D, "SSQ_PARTS": ssq_parts(tu, ctx.T, ctx.D), "BLOCK_R": tu.rows,
                          "BLOCK_D": next_pow2(ctx.D)},
                         num_warps=tu.rows_warps, num_stages=1, label=label)


def residual_norm(ctx: Context, *, x, parts, splits: int, g, out, h16, rstd, label: str) -> Launch:
    """out = x + Σ parts (the mlp down's split-K partials, in split order), then h16 =
    bf(rmsnorm(out)[·g]) and rstd of T rows: the next norm's bf16 output, written once (g None:
    no gain — the next layer's attention norm; g_final: the final norm, the head's input);
    `splits` partials, as the product wrote them (matmul_into_norm checked that they fit)."""
    tu = ctx.tu
    return triton_launch("coppelius.plan.kernels.norms", "residual_norm", (_row_programs(ctx),),
                         {"x_ptr": x, "part_ptr": parts, "g_ptr": parts if g is None else g,
                          "out_ptr": out, "h16_ptr": h16, "rstd_ptr": rstd, "T": i32(ctx.T)},
                         {"D": ctx.D, "PARTS": splits, "HAS_GAIN": g is not None,
                          "BLOCK_R": tu.rows, "BLOCK_D": next_pow2(ctx.D)},
                         num_warps=tu.rows_warps, num_stages=1, label=label)


def rmsnorm_bwd(ctx: Context, *, dy, x, rstd, g, dx, dx16, has_gain: bool, accumulate: bool,
                write_bf16: bool, label: str, dy_parts: int = 1) -> Launch:
    """dx [+]= rmsnorm_backward(dy [·g]); dx16 = bf(dx) when write_bf16 (g unread without gain);
    dy as `dy_parts` split-K partials, summed in order."""
    tu = ctx.tu
    return triton_launch("coppelius.plan.kernels.norms", "rmsnorm_bwd", (_row_programs(ctx),),
                         {"dy_ptr": dy, "x_ptr": x, "rstd_ptr": rstd, "g_ptr": g, "dx_ptr": dx,
                          "dx16_ptr": dx16, "T": i32(ctx.T)},
                         {"D": ctx.D, "HAS_GAIN": has_gain, "ACCUMULATE": accumulate,
                          "WRITE_BF16": write_bf16, "BLOCK_R": tu.rows, "BLOCK_D": next_pow2(ctx.D),
                          "DY_PARTS": dy_parts},
                         num_warps=tu.rows_warps, num_stages=1, label=label)


def rmsnorm_bwd_gain(ctx: Context, *, dy, x, rstd, g, dx, dx16, dg, write_bf16: bool,
                     label: str, dy_parts: int = 1) -> Launch:
    """A gained norm's backward: dx (and dx16) by row blocks and dg by column blocks, side by
    side in one grid (the two halves only read what they share)."""
    tu = ctx.tu
    cols = min(tu.gain_cols, next_pow2(ctx.D))
    return triton_launch("coppelius.plan.kernels.norms", "rmsnorm_bwd_gain",
                         (_row_programs(ctx) + cdiv(ctx.D, cols),),
                         {"dy_ptr": dy, "x_ptr": x, "rstd_ptr": rstd, "g_ptr": g, "dx_ptr": dx,
                          "dx16_ptr": dx16, "dg_ptr": dg, "T": i32(ctx.T)},
                         {"D": ctx.D, "WRITE_BF16": write_bf16, "BLOCK_R": tu.rows,
                          "BLOCK_D": next_pow2(ctx.D), "GAIN_ROWS": tu.gain_rows, "GAIN_COLS": cols,
                          "DY_PARTS": dy_parts},
                         num_warps=tu.rows_warps, num_stages=1, label=label)


# ---------------------------------------------------------------- attention

def attention_scale(head_dim: int) -> float:
    """d^-½ rounded once to fp32 (the SCALE constexpr)."""
    return float(np.float32(1.0 / math.sqrt(head_dim)))


def attention_constexprs(ctx: Context) -> dict:
    """The attention backward kernels' constexprs; refuses blocks that do not tile T (the kernels
    have no row masks: every block is whole)."""
    tu, p = ctx.tu, ctx.p
    if ctx.T % tu.attn_m or ctx.T % tu.attn_n or tu.attn_m % tu.attn_n:
        raise ValueError(f"attention blocks {tu.attn_m}×{tu.attn_n} do not tile T={ctx.T}; hint: "
                         "T must be a multiple of both and BLOCK_M a multiple of BLOCK_N")
    return {"SCALE": attention_scale(p.head_dim), "HEADS": p.heads, "KV_HEADS": p.kv_heads,
            "HEAD_DIM": p.head_dim, "BLOCK_M": tu.attn_m, "BLOCK_N": tu.attn_n}


def _split(ctx: Context) -> AttentionSplit:
    """The attention split of the profile's tuning; refuses dK/dV chunks of no trips."""
    tu = ctx.tu
    if tu.attn_bwd_chunk < 1:
        raise ValueError(f"attention dK/dV chunk of {tu.attn_bwd_chunk} trips must be ≥ 1; hint: "
                         "(query head, query block) trips per program")
    return attention_split(ctx.p, tu)


def attention_fwd(ctx: Context, *, qkv, o16, o32, lse, label: str) -> Launch:
    """Causal flash attention forward in one launch: one program per (query block, head), the
    shortest rows first, over its whole causal range in key blocks of attn_fwd_n rows, normalized
    in its epilogue (o16, o32, lse; plan/attention_split.py).  Refuses blocks that do not tile T
    (the kernel has no row masks)."""
    tu, p = ctx.tu, ctx.p
    if tu.attn_fwd_n < 1 or ctx.T % tu.attn_m or ctx.T % tu.attn_fwd_n:
        raise ValueError(f"attention forward blocks {tu.attn_m}×{tu.attn_fwd_n} do not tile "
                         f"T={ctx.T}; hint: T must be a multiple of both (query rows, key rows)")
    split = attention_split(p, tu)
    return triton_launch("coppelius.plan.kernels.attention", "attention_fwd", (len(split.fwd_programs()),),
                         {"qkv_ptr": qkv, "o16_ptr": o16, "o32_ptr": o32, "lse_ptr": lse,
                          "T": i32(ctx.T)},
                         {"SCALE": attention_scale(p.head_dim), "HEADS": p.heads,
                          "KV_HEADS": p.kv_heads, "HEAD_DIM": p.head_dim, "BLOCK_M": tu.attn_m,
                          "BLOCK_N": tu.attn_fwd_n},
                         num_warps=tu.attn_warps, num_stages=tu.attn_fwd_stages, label=label)


def attention_bwd(ctx: Context, *, qkv, do, lse, delta, kv_part, ds, label: str) -> Launch:
    """dK/dV pass, split: one program per (kv block, trip chunk, kv head) writing partial dk′, dv
    and every trip's bf(ds)ᵀ tile."""
    tu = ctx.tu
    consts = attention_constexprs(ctx)
    split = _split(ctx)
    return triton_launch("coppelius.plan.kernels.attention", "attention_bwd", (len(split.dkdv_programs()),),
                         {"qkv_ptr": qkv, "do_ptr": do, "lse_ptr": lse, "delta_ptr": delta,
                          "kv_part_ptr": kv_part, "ds_ptr": ds, "T": i32(ctx.T)},
                         {**consts, "BWD_CHUNK": tu.attn_bwd_chunk},
                         num_warps=tu.attn_warps, num_stages=2, label=label)


def attention_bwd_dq(ctx: Context, *, qkv, ds, kv_part, rope, dqkv, label: str) -> Launch:
    """dQ programs (query block, head) from bf(ds), then the dK/dV merges (kv block, kv head), in
    one grid; rotary_backward and bf16 into dqkv."""
    tu, p = ctx.tu, ctx.p
    consts = attention_constexprs(ctx)
    split = _split(ctx)
    return triton_launch("coppelius.plan.kernels.attention", "attention_bwd_dq", (len(split.dq_programs()),),
                         {"qkv_ptr": qkv, "ds_ptr": ds, "kv_part_ptr": kv_part, "rope_ptr": rope,
                          "dqkv_ptr": dqkv, "T": i32(ctx.T)},
                         {"HEADS": p.heads, "KV_HEADS": p.kv_heads, "HEAD_DIM": p.head_dim,
                          "BLOCK_M": consts["BLOCK_M"], "BLOCK_N": consts["BLOCK_N"],
                          "BWD_CHUNK": tu.attn_bwd_chunk},
                         num_warps=tu.attn_warps, num_stages=2, label=label)


# ---------------------------------------------------------------- loss, predictions, embedding

def cross_entropy(ctx: Context, *, logits, inputs, targets, loss, w0, dlogits,
                  label: str) -> Launch:
    """ce per row to the loss record and w0; dlogits = bf((softmax − onehot)/T); a row whose
    input or target id is outside [0, V) marked L.LOSS_BAD_ID for the host."""
    tu = ctx.tu
    return triton_launch("coppelius.plan.kernels.cross_entropy", "cross_entropy", (cdiv(ctx.T, tu.ce_rows),),
                         {"logits_ptr": logits, "inputs_ptr": inputs, "targets_ptr": targets,
                          "loss_ptr": loss, "w0_ptr": w0, "dlogits_ptr": dlogits, "T": i32(ctx.T)},
                         {"V": ctx.V, "ROWS": tu.ce_rows, "BLOCK_V": next_pow2(ctx.V),
                          "INV_T": inverse_power_of_two(ctx.T), "CE_BAD_ID": L.LOSS_BAD_ID},
                         num_warps=tu.ce_warps, num_stages=1, label=label)


def inverse_power_of_two(n: int) -> float:
    """1/n when n is a power of two (exact in fp32 for n ≤ 2^126), else 0.0: cross_entropy
    multiplies by it instead of dividing by n, with the same bits."""
    return 1.0 / n if n > 0 and n & (n - 1) == 0 else 0.0


def predictions(ctx: Context, *, logits, pred, label: str) -> Launch:
    """Argmax and validity of the PREDICTION_ROWS rows of the logits: one program per row."""
    r0, r1, r2 = P.PREDICTION_ROWS
    return triton_launch("coppelius.plan.kernels.cross_entropy", "predictions", (L.PREDICTION_COUNT,),
                         {"logits_ptr": logits, "pred_ptr": pred},
                         {"V": ctx.V, "ROW0": r0, "ROW1": r1, "ROW2": r2, "BLOCK_V": next_pow2(ctx.V)},
                         num_warps=ctx.tu.ce_warps, num_stages=1, label=label)


def _embed_learner(ctx: Context) -> dict:
    return {"D": ctx.D, "W1_WORDS": L.LOSS_WINDOW_WORDS, "BLOCK_V": ctx.tu.vocab_block,
            "BLOCK_T": next_pow2(ctx.T), "BLOCK_D": next_pow2(ctx.D), **learner_constexprs(ctx.p)}


def embed_decay(ctx: Context, *, ids, w1, label: str) -> Launch:
    """AdamW with g = 0 on E's rows that no id of the context holds (and their zeros to w1), by
    vocabulary blocks on at most `decay_programs` programs: the side lane's SM budget."""
    tu = ctx.tu
    if tu.decay_programs < 1:
        raise ValueError(f"{label}: decay_programs = {tu.decay_programs}; hint: at least one")
    return triton_launch("coppelius.plan.kernels.embed_grad", "embed_decay",
                         (min(cdiv(ctx.V, tu.vocab_block), tu.decay_programs),),
                         {"ids_ptr": ids, "e_ptr": ctx.param("embed"), "w1_ptr": w1,
                          "doorbell_ptr": ctx.doorbell(), "t_base": RunScalar("t_base", "i64"),
                          "T": i32(ctx.T), "V": i32(ctx.V), "NPARAM": i32(ctx.N)},
                         _embed_learner(ctx), num_warps=tu.vocab_warps, num_stages=1, label=label)


def embed_grad(ctx: Context, *, ids, next_row, de, w1, label: str) -> Launch:
    """dE by vocabulary blocks, rows summed in increasing order, applied at once by AdamW to E's
    present P/M/V rows (embed_decay has the absent ones); their dE words also to w1; one more
    program updates the two gains from dgain."""
    tu = ctx.tu
    g0, g1 = GAINS
    return triton_launch("coppelius.plan.kernels.embed_grad", "embed_grad",
                         (cdiv(ctx.V, tu.vocab_block) + 1,),
                         {"ids_ptr": ids, "next_ptr": next_row, "de_ptr": de,
                          "e_ptr": ctx.param("embed"), "gain0_ptr": ctx.param(g0),
                          "gain1_ptr": ctx.param(g1), "dgain_ptr": ctx.buf("dgain"), "w1_ptr": w1,
                          "doorbell_ptr": ctx.doorbell(), "t_base": RunScalar("t_base", "i64"),
                          "T": i32(ctx.T), "V": i32(ctx.V), "NPARAM": i32(ctx.N)},
                         _embed_learner(ctx), num_warps=tu.vocab_warps, num_stages=1, label=label)


# ---------------------------------------------------------------- learner, casts, copies

def learner_constexprs(profile) -> dict:
    """The learner's constants as the fused updates (weight_grad, embed_grad, embed_decay) bake
    them, in the kernels' parameter order: fp32-rounded where they compute in fp32, float64 where
    they form the bias corrections (NUMERICS.md §AdamW)."""
    lr = profile.learner

    def f32(x: float) -> float:
        return float(np.float32(x))

    def frac(r) -> float:
        return r.numerator / r.denominator

    def one_minus(r) -> float:
        return (r.denominator - r.numerator) / r.denominator

    lr_decay_den = lr.lr.denominator * lr.decay.denominator      # 1 − lr·decay as one division
    return {"LR": frac(lr.lr), "BETA1_F64": frac(lr.beta1), "BETA2_F64": frac(lr.beta2),
            "DECAY": f32((lr_decay_den - lr.lr.numerator * lr.decay.numerator) / lr_decay_den),
            "BETA1": f32(frac(lr.beta1)), "ONE_MINUS_BETA1": f32(one_minus(lr.beta1)),
            "BETA2": f32(frac(lr.beta2)), "ONE_MINUS_BETA2": f32(one_minus(lr.beta2)),
            "EPS": f32(frac(lr.epsilon))}


def cast_bf16(ctx: Context, *, src, dst, label: str) -> Launch:
    """dst = bf(src) over the N parameters (refreshes w16 from the P plane)."""
    tu = ctx.tu
    return triton_launch("coppelius.plan.kernels.adamw", "cast_bf16", (cdiv(ctx.N, tu.cast_block),),
                         {"src_ptr": src, "dst_ptr": dst, "N": i32(ctx.N)}, {"BLOCK": tu.cast_block},
                         num_warps=tu.cast_warps, num_stages=1, label=label)


def copy(ctx: Context, *, src: BufferRef, dst: StagingRef, n: int, label: str) -> Launch:
    """dst[0:n] = src[0:n], fp32 words (record rows, the w2/w3 windows)."""
    block = ctx.tu.copy_block
    return triton_launch("coppelius.plan.kernels.copy", "copy_f32", (cdiv(n, block),),
                         {"src_ptr": src, "dst_ptr": dst, "N": i32(n)}, {"BLOCK": block},
                         num_warps=4, num_stages=1, label=label)
