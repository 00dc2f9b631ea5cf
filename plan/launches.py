"""The three submissions' launch lists as data (SPEC §6–§7): the model, stage by stage, layer by layer.

Every submission is release(pre-launch slot), its kernels, release(final slot).  Each stage names
the buffers it reads and writes (plan/launch_refs.py: `ly.resid_attn`, `g.dres16`) and calls one
builder per launch (plan/launch_matmul.py, plan/launch_builders.py) with them by keyword.
The argument kinds and `Launch` live in plan/launch_types.py, the meta-parameters in
plan/tuning.py; both are re-exported here, the module the host and the build tool import.
No Triton import here.
"""
from __future__ import annotations

from plan import launch_builders as B
from plan import launch_matmul as MM
from plan import profiles as _profiles
from plan.buffers import DTYPE_BYTES, buffers, norm_points
from plan.kernels import meta
from plan.launch_refs import Context, GradRefs, LayerRefs, grad_refs, layer_refs, loss_window, staging
from plan.launch_types import (INT_DIVISOR, POINTER_ALIGN, RELEASE, Arg, BufferRef, Launch,
                               RunScalar, Scalar, StagingRef, Submission, entry_name, specialization)
from plan.tuning import H200, INTERPRETER, TUNING, Tuning, tuning
from staging import layout as SL

EPI_F32, EPI_RESIDUAL, EPI_SWIGLU_BWD = meta.EPI_F32, meta.EPI_RESIDUAL, meta.EPI_SWIGLU_BWD


# ---------------------------------------------------------------- forward

def _layer_forward(ctx: Context, ly: LayerRefs) -> list[Launch]:
    T, D, F, Hd = ctx.T, ctx.D, ctx.F, ctx.p.q_width
    return [
        MM.matmul_rotary(ctx, x=ly.resid_attn, w=ly.wqkv, qkv=ly.qkv16, h16=ly.h16_attn,
                         rstd=ly.rstd_attn, label=ly.label("norm+qkv+rotary")),
        B.attention_fwd(ctx, qkv=ly.qkv16, o_part=ctx.buf("attn_o_part"),
                        ml_part=ctx.buf("attn_ml_part"), label=ly.label("attention")),
        B.attention_fwd_merge(ctx, o_part=ctx.buf("attn_o_part"), ml_part=ctx.buf("attn_ml_part"),
                              o16=ly.o16, o32=ly.o32, lse=ly.lse, label=ly.label("attention.merge")),
        MM.matmul(ctx, a=ly.o16, b=ly.wo, c=ly.resid_mlp, aux=ly.resid_attn, M=T, N=D, K=Hd,
                  b_transposed=True, epilogue=EPI_RESIDUAL, label=ly.label("out_proj")),
        MM.matmul_swiglu(ctx, x=ly.resid_mlp, wg=ly.wgate_up, wu=ly.wup, ab=ly.ab, z=ly.z16,
                         h16=ly.h16_mlp, rstd=ly.rstd_mlp, label=ly.label("mlp.norm+swiglu")),
        MM.matmul(ctx, a=ly.z16, b=ly.wdown, c=ly.resid_out, aux=ly.resid_mlp, M=T, N=D, K=F,
                  b_transposed=True, epilogue=EPI_RESIDUAL, label=ly.label("mlp.down")),
    ]


def forward(ctx: Context) -> list[Launch]:
    """embed, the layers, final norm + head: the logits of every row."""
    last = norm_points(ctx.p) - 1
    out = [B.embed_fwd(ctx, ids=staging("INPUTS", "u32"), table=ctx.param("embed"),
                       g=ctx.param("g_embed"), emb=ctx.buf("emb"), rstd=ctx.rstd(None),
                       x=ctx.slab("resid", 0), rope=ctx.buf("rope"), next_row=ctx.buf("next_row"),
                       label="embed")]
    for layer in range(ctx.p.layers):
        out += _layer_forward(ctx, layer_refs(ctx, layer))
    out.append(MM.matmul_norm(ctx, x=ctx.slab("resid", last), g=ctx.param("g_final"),
                              w=ctx.param("head", "w16"), c=ctx.buf("logits"),
                              h16=ctx.slab("h16", last), rstd=ctx.rstd(last), label="final_norm+head"))
    return out


# ---------------------------------------------------------------- backward

def _linear_backward(ctx: Context, g: GradRefs, *, dy16, x16, w16, dw, out_features: int,
                     in_features: int, labels: tuple[str, str]) -> list[Launch]:
    """llm.c's matmul_backward of y = x @ Wᵀ, W (out, in): dW = dyᵀ @ x (the weight gradient),
    then dn = dy @ W (the gradient at the norm output x came from), both fp32."""
    T = ctx.T
    return [
        MM.matmul(ctx, a=dy16, b=x16, c=dw, aux=g.no_aux, M=out_features, N=in_features, K=T,
                  a_transposed=True, epilogue=EPI_F32, label=labels[0]),
        MM.matmul(ctx, a=dy16, b=w16, c=g.dn, aux=g.no_aux, M=T, N=in_features, K=out_features,
                  epilogue=EPI_F32, label=labels[1]),
    ]


def _norm_backward(ctx: Context, g: GradRefs, *, x, rstd, label: str) -> Launch:
    """dres += rmsnorm_backward(dn) of a gain-free norm site, and dres16 = bf(dres)."""
    return B.rmsnorm_bwd(ctx, dy=g.dn, x=x, rstd=rstd, g=g.no_gain, dx=g.dres, dx16=g.dres16,
                         has_gain=False, accumulate=True, write_bf16=True, label=label)


def _loss_and_head_backward(ctx: Context, g: GradRefs) -> list[Launch]:
    last = norm_points(ctx.p) - 1
    x_final, h16_final, rstd_final = ctx.slab("resid", last), ctx.slab("h16", last), ctx.rstd(last)
    return [
        B.cross_entropy(ctx, logits=ctx.buf("logits"), targets=staging("TARGETS", "u32"),
                        loss=staging("LOSS_RECORD"), w0=loss_window("W0_LAST_CE"),
                        dlogits=g.dlogits16, label="cross_entropy"),
        *_linear_backward(ctx, g, dy16=g.dlogits16, x16=h16_final, w16=ctx.param("head", "w16"),
                          dw=ctx.param("head", "grad"), out_features=ctx.V, in_features=ctx.D,
                          labels=("head_backward.dW", "head_backward.dx")),
        B.rmsnorm_bwd_gain(ctx, dy=g.dn, x=x_final, rstd=rstd_final, g=ctx.param("g_final"),
                           dx=g.dres, dx16=g.dres16, dg=ctx.param("g_final", "grad"),
                           write_bf16=True, label="final_norm_backward+dg"),
    ]


def _mlp_backward(ctx: Context, ly: LayerRefs, g: GradRefs) -> list[Launch]:
    T, D, F = ctx.T, ctx.D, ctx.F
    return [
        MM.matmul(ctx, a=g.dres16, b=ly.z16, c=ly.dwdown, aux=g.no_aux, M=D, N=F, K=T,
                  a_transposed=True, epilogue=EPI_F32, label=ly.label("mlp_backward.dWdown")),
        MM.matmul(ctx, a=g.dres16, b=ly.wdown, c=g.dab16, aux=ly.ab, M=T, N=F, K=D,
                  epilogue=EPI_SWIGLU_BWD, label=ly.label("mlp_backward.swiglu")),
        *_linear_backward(ctx, g, dy16=g.dab16, x16=ly.h16_mlp, w16=ly.wgate_up, dw=ly.dwgate_up,
                          out_features=2 * F, in_features=D,
                          labels=(ly.label("mlp_backward.dWgate_up"), ly.label("mlp_backward.dh"))),
        _norm_backward(ctx, g, x=ly.resid_mlp, rstd=ly.rstd_mlp, label=ly.label("mlp_backward.norm")),
    ]


def _attention_backward(ctx: Context, ly: LayerRefs, g: GradRefs) -> list[Launch]:
    T, D, Hd = ctx.T, ctx.D, ctx.p.q_width
    return [
        MM.matmul(ctx, a=g.dres16, b=ly.o16, c=ly.dwo, aux=g.no_aux, M=D, N=Hd, K=T,
                  a_transposed=True, epilogue=EPI_F32, label=ly.label("out_proj_backward.dWo")),
        MM.matmul_delta(ctx, dres16=g.dres16, wo=ly.wo, do=g.do32, o32=ly.o32, delta=g.delta,
                        label=ly.label("out_proj_backward.do+delta")),
        B.attention_bwd(ctx, qkv=ly.qkv16, do=g.do32, lse=ly.lse, delta=g.delta,
                        kv_part=g.kv_part, ds=g.ds16, label=ly.label("attention_backward")),
        B.attention_bwd_dq(ctx, qkv=ly.qkv16, ds=g.ds16, kv_part=g.kv_part, rope=ctx.buf("rope"),
                           dqkv=g.dqkv16, label=ly.label("attention_backward.dq+merge")),
        *_linear_backward(ctx, g, dy16=g.dqkv16, x16=ly.h16_attn, w16=ly.wqkv, dw=ly.dwqkv,
                          out_features=ctx.W, in_features=D,
                          labels=(ly.label("qkv_backward.dW"), ly.label("qkv_backward.dh"))),
        _norm_backward(ctx, g, x=ly.resid_attn, rstd=ly.rstd_attn, label=ly.label("qkv_backward.norm")),
    ]


def _embed_backward(ctx: Context, g: GradRefs) -> list[Launch]:
    return [
        B.rmsnorm_bwd_gain(ctx, dy=g.dres, x=ctx.buf("emb"), rstd=ctx.rstd(None),
                           g=ctx.param("g_embed"), dx=g.de, dx16=g.de, dg=ctx.param("g_embed", "grad"),
                           write_bf16=False, label="embed_backward.norm+dg"),
        # the next-row links were written by embed_fwd (forward, same submission)
        B.embed_grad(ctx, ids=staging("INPUTS", "u32"), next_row=ctx.buf("next_row"), de=g.de,
                     de_table=ctx.param("embed", "grad"), w1=loss_window("W1_EMBED_GRAD"),
                     label="embed_backward.dE+w1"),
    ]


def backward(ctx: Context) -> list[Launch]:
    """cross-entropy, head and final norm, the layers in reverse (MLP, then attention), embed."""
    g = grad_refs(ctx)
    out = _loss_and_head_backward(ctx, g)
    for layer in reversed(range(ctx.p.layers)):
        ly = layer_refs(ctx, layer)
        out += _mlp_backward(ctx, ly, g) + _attention_backward(ctx, ly, g)
    return out + _embed_backward(ctx, g)


# ---------------------------------------------------------------- the three submissions

def _records(ctx: Context, rows, dst_offset: int, field: str) -> list[Launch]:
    """Copy logits rows `rows` to consecutive fp32 rows of staging from `dst_offset`."""
    row_bytes = ctx.V * DTYPE_BYTES["fp32"]
    return [B.copy(ctx, src=ctx.buf("logits", r * ctx.V),
                   dst=StagingRef(f"{field} + {i}·V·4", dst_offset + i * row_bytes), n=ctx.V,
                   label=f"record.row{r}") for i, r in enumerate(rows)]


def _predictions(ctx: Context) -> Launch:
    return B.predictions(ctx, logits=ctx.buf("logits"), pred=staging("PREDICTIONS", "u32"),
                         label="predictions")


def _bodies(ctx: Context) -> tuple[list[Launch], list[Launch], list[Launch]]:
    p, rows = ctx.p, _profiles.PREDICTION_ROWS
    refresh = B.cast_bf16(ctx, src=ctx.buf("pmv"), dst=ctx.buf("w16"), label="refresh_w16")
    first = ([refresh] + forward(ctx)
             + _records(ctx, rows, SL.record_forward_offset(p), "record_forward_offset")
             + [_predictions(ctx)])
    update = forward(ctx) + backward(ctx) + [
        B.adamw(ctx, pmv=ctx.buf("pmv"), grad=ctx.buf("grad"), w16=ctx.buf("w16"),
                doorbell=staging("DOORBELL", "u32"), label="adamw")]
    final = (forward(ctx)
             + _records(ctx, rows[-1:], SL.record_final_offset(p), "record_final_offset")
             + [_predictions(ctx),
                B.copy(ctx, src=ctx.param("embed"), dst=loss_window("W2_EMBED_FINAL"),
                       n=SL.LOSS_WINDOW_WORDS, label="w2"),
                B.copy(ctx, src=ctx.param("embed", "pmv", 1), dst=loss_window("W3_EMBED_M_FINAL"),
                       n=SL.LOSS_WINDOW_WORDS, label="w3")])
    return first, update, final


def submissions(profile) -> tuple[Submission, Submission, Submission]:
    """(forward, update, final) for a profile (SPEC §7)."""
    SL.check_layout(profile)
    out = []
    for index, body in enumerate(_bodies(Context(profile))):
        launches = ([B.release(index, SL.SLOT_PRELAUNCH_RELEASE)] + body
                    + [B.release(index, SL.SLOT_FINAL_RELEASE)])
        out.append(Submission(index, SL.SUBMISSIONS[index], tuple(launches)))
    return tuple(out)


def kernels(profile) -> dict[str, Launch]:
    """One launch per distinct compiled specialization (manifest entry), first use first."""
    out: dict[str, Launch] = {}
    for sub in submissions(profile):
        for launch in sub.launches:
            out.setdefault(launch.kernel, launch)
    return out


__all__ = ["BufferRef", "StagingRef", "Scalar", "RunScalar", "Arg", "Launch", "Submission", "buffers",
           "submissions", "kernels", "specialization", "entry_name", "tuning", "Tuning", "H200",
           "INTERPRETER", "TUNING", "RELEASE", "POINTER_ALIGN", "INT_DIVISOR"]
