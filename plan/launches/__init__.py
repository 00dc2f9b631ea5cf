"""The three submissions' launch lists as data (CONTRACT §6–§7): the model, stage by stage, layer
by layer.

Every submission is release_stage_in (the issue's input record and doorbell copied from staging
into device memory, and the pre-launch semaphore record), its body, release (final slot); no
launch after the first reads staging (CONTRACT §7: mapped host memory is read once per issue).
The bodies are `forward_submission`, `update_submission` and `final_submission`, named as
staging/layout.py's SUBMISSIONS; the numpy reference's step is `update_submission` too
(plan/reference/__init__.py).  The update's weight-gradient launches run on a side lane of the same graph
(plan/launches/graph.py: forked after their last input, joined before the final release); the list
order is a valid order.  Each stage names the buffers it reads and writes (plan/launches/refs.py:
`ly.resid_attn`, `g.dres16`) and calls one builder per launch (plan/launches/matmul.py,
plan/launches/builders.py) with them by keyword.
The argument kinds and `Launch` live in plan/launches/types.py, the meta-parameters in
plan/tuning.py; both are re-exported here, the module the host and the build tool import.
No Triton import here.
"""
from __future__ import annotations

import dataclasses

from coppelius.plan.launches import builders as launch_builders
from coppelius.plan.launches import matmul as launch_matmul
from coppelius.plan import profiles as P
from coppelius.plan.buffers import DTYPE_BYTES, buffers, norm_points
from coppelius.plan.kernels import meta
from coppelius.plan.launches.graph import dependencies, forked
from coppelius.plan.launches.refs import Context, GradRefs, LayerRefs, grad_refs, layer_refs, loss_window, staging
from coppelius.plan.launches.types import (HAND_WRITTEN, INT_DIVISOR, LANES, MAIN_LANE, POINTER_ALIGN, RELEASE,
                               SIDE_LANE, STAGE_IN, Arg, BufferRef, Launch, RunScalar, Scalar,
                               StagingRef, Submission, entry_name, specialization)
from coppelius.plan.tuning import H200, INTERPRETER, TUNING, Tuning, tuning
from coppelius.staging import layout as L

EPI_SWIGLU_BWD = meta.EPI_SWIGLU_BWD


# ---------------------------------------------------------------- forward

def _layer_forward(ctx: Context, ly: LayerRefs) -> list[Launch]:
    T, D, F, Hd = ctx.T, ctx.D, ctx.F, ctx.p.q_width
    # the attention norm's rows: embed_fwd wrote layer 0's, the previous layer's residual_norm
    # the others'
    return [
        launch_matmul.matmul_rotary(ctx, h16=ly.h16_attn, w=ly.wqkv, qkv=ly.qkv16,
                         label=ly.label("qkv+rotary")),
        launch_builders.attention_fwd(ctx, qkv=ly.qkv16, o16=ly.o16, o32=ly.o32, lse=ly.lse,
                        label=ly.label("attention")),
        launch_matmul.matmul_residual(ctx, a=ly.o16, b=ly.wo, x=ly.resid_attn, out=ly.resid_mlp,
                           ssq=ly.ssq_mlp, M=T, N=D, K=Hd, label=ly.label("out_proj")),
    ] + _mlp_forward(ctx, ly)


def _mlp_forward(ctx: Context, ly: LayerRefs) -> list[Launch]:
    """The MLP's norm (a row launch: h16 and rstd), SwiGLU on h16, down in split-K partials
    (128×128 tiles where 64×64 ones would reach 120 programs: half the L2 bytes), and the row
    launch that adds them to the residual and writes the next norm: the next layer's attention
    norm, or the final norm (with g_final) that the head reads."""
    T, D, F = ctx.T, ctx.D, ctx.F
    site = ly.site_mlp + 1                                # the norm site above this layer
    final = site == norm_points(ctx.p) - 1
    parts = ctx.buf("down_part")
    down = launch_matmul.matmul_into_norm(ctx, a=ly.z16, b=ly.wdown, dn=parts, M=T, N=D, K=F,
                               b_transposed=True, label=ly.label("mlp.down"))
    return [
        launch_builders.rmsnorm_rows(ctx, x=ly.resid_mlp, ssq=ly.ssq_mlp, h16=ly.h16_mlp, rstd=ly.rstd_mlp,
                       label=ly.label("mlp.norm")),
        launch_matmul.matmul_swiglu(ctx, h16=ly.h16_mlp, wg=ly.wgate_up, wu=ly.wup, ab=ly.ab, z=ly.z16,
                         label=ly.label("mlp.swiglu")),
        down,
        launch_builders.residual_norm(ctx, x=ly.resid_mlp, parts=parts, splits=dict(down.constexprs)["SPLIT_K"],
                        g=ctx.param("g_final") if final else None,
                        out=ly.resid_out, h16=ctx.slab("h16", site), rstd=ctx.rstd(site),
                        label=ly.label("mlp.residual+final_norm" if final else "mlp.residual+norm")),
    ]


def forward_pass(ctx: Context) -> list[Launch]:
    """embed, the layers, final norm + head: the logits of every row (every submission runs it)."""
    last = norm_points(ctx.p) - 1
    out = [launch_builders.embed_fwd(ctx, ids=ctx.inputs(), table=ctx.param("embed"),
                       g=ctx.param("g_embed"), emb=ctx.buf("emb"), rstd=ctx.rstd(None),
                       x=ctx.slab("resid", 0), h16=ctx.slab("h16", 0), rstd0=ctx.rstd(0),
                       rope=ctx.buf("rope"),
                       next_row=ctx.buf("next_row"),
                       label="embed")]
    for layer in range(ctx.p.layers):
        out += _layer_forward(ctx, layer_refs(ctx, layer))
    # the last layer's residual_norm wrote the final norm's bf16 rows: the head reads them (its
    # 96 column tiles would each re-read the fp32 rows in a fused prologue)
    hf16 = ctx.slab("h16", last)
    out.append(launch_matmul.matmul(ctx, a=hf16, b=ctx.param("head", "w16"), c=ctx.buf("logits"),
                         aux=ctx.buf("logits"), M=ctx.T, N=ctx.V, K=ctx.D, b_transposed=True,
                         epilogue=meta.EPI_F32, tiles=ctx.tu.head_tiles,
                         block_k=ctx.tu.head_block_k, label="head"))
    return out


# ---------------------------------------------------------------- backward
#
# llm.c's matmul_backward pair per linear layer, split: the data gradient dn = dy @ W first (it
# reads the old bf16 weight) and the norm backward that sums dn's split-K partials on the main
# lane; one weight-gradient launch per layer half with AdamW in its epilogues
# (plan/kernels/weight_grad.py) on the side lane, forked after the dh product — the last reader
# of its old bf16 weights and the producer of its last input.  Nothing on the main lane reads what
# it writes (its parameters' P/M/V and w16), and what it reads has a slab of its own (dres16 per
# norm site, dab16 and dqkv16 per layer), so it may lag the main lane until the final release.

def _dw(launch: Launch, fork: Launch) -> Launch:
    """A weight-gradient launch on the side lane, forked after `fork`."""
    return forked(launch, fork, SIDE_LANE)


def _loss_and_head_backward(ctx: Context, g: GradRefs) -> list[Launch]:
    last = norm_points(ctx.p) - 1
    x_final, h16_final, rstd_final = ctx.slab("resid", last), ctx.slab("h16", last), ctx.rstd(last)
    dx = launch_matmul.matmul_into_norm(ctx, a=g.dlogits16, b=ctx.param("head", "w16"), dn=g.dn, M=ctx.T,
                             N=ctx.D, K=ctx.V, splits=ctx.tu.head_dx_splits,
                             tile=ctx.tu.head_dx_tile, block_k=ctx.tu.head_block_k,
                             label="head_backward.dx")
    return [
        launch_builders.cross_entropy(ctx, logits=ctx.buf("logits"), inputs=ctx.inputs(),
                        targets=ctx.targets(),
                        loss=staging("LOSS_RECORD"), w0=loss_window("W0_LAST_CE"),
                        dlogits=g.dlogits16, label="cross_entropy"),
        dx,
        _dw(launch_matmul.weight_grad(ctx, products=[(g.dlogits16, h16_final, "head", ctx.V, ctx.D)],
                           label="head_backward.dW+adamw"), dx),
        launch_builders.rmsnorm_bwd_gain(ctx, dy=g.dn, x=x_final, rstd=rstd_final, g=ctx.param("g_final"),
                           dx=g.dres, dx16=g.dres16[last], dg=ctx.gain_grad("g_final"),
                           write_bf16=True, dy_parts=dict(dx.constexprs)["SPLIT_K"],
                           label="final_norm_backward+dg"),
    ]


def _norm_backward(ctx: Context, g: GradRefs, dn: Launch, *, x, rstd, site: int,
                   label: str) -> Launch:
    """dres += rmsnorm_backward(Σ dn partials) at norm site `site`; dres16[site] = bf(dres); as
    many partials as the product `dn` wrote."""
    return launch_builders.rmsnorm_bwd(ctx, dy=g.dn, x=x, rstd=rstd, g=g.no_gain, dx=g.dres,
                         dx16=g.dres16[site], has_gain=False, accumulate=True, write_bf16=True,
                         dy_parts=dict(dn.constexprs)["SPLIT_K"], label=label)


def _mlp_backward(ctx: Context, ly: LayerRefs, g: GradRefs) -> list[Launch]:
    T, D, F = ctx.T, ctx.D, ctx.F
    dy16 = g.dres16[ly.site_mlp + 1]                 # the gradient at the MLP's output
    dh = launch_matmul.matmul_into_norm(ctx, a=ly.dab16, b=ly.wgate_up, dn=g.dn, M=T, N=D, K=2 * F,
                             label=ly.label("mlp_backward.dh"))
    return [
        launch_matmul.matmul(ctx, a=dy16, b=ly.wdown, c=ly.dab16, aux=ly.ab, M=T, N=F, K=D,
                  epilogue=EPI_SWIGLU_BWD, label=ly.label("mlp_backward.swiglu")),
        dh,
        _dw(launch_matmul.weight_grad(ctx, products=[(dy16, ly.z16, ly.param("wdown"), D, F),
                                          (ly.dab16, ly.h16_mlp, ly.param("wgate"), 2 * F, D)],
                           tile=ctx.tu.mlp_dw_tile, label=ly.label("mlp_backward.dW+adamw")),
            dh),
        _norm_backward(ctx, g, dh, x=ly.resid_mlp, rstd=ly.rstd_mlp, site=ly.site_mlp,
                       label=ly.label("mlp_backward.norm")),
    ]


def _attention_backward(ctx: Context, ly: LayerRefs, g: GradRefs) -> list[Launch]:
    D, W = ctx.D, ctx.W
    dy16 = g.dres16[ly.site_mlp]                     # the gradient at out_proj's output
    dh = launch_matmul.matmul_into_norm(ctx, a=ly.dqkv16, b=ly.wqkv, dn=g.dn, M=ctx.T, N=D, K=W,
                             splits=ctx.tu.qkv_dh_splits, label=ly.label("qkv_backward.dh"))
    return [
        launch_matmul.matmul_delta(ctx, dres16=dy16, wo=ly.wo, do=g.do32, o32=ly.o32, delta=g.delta,
                        label=ly.label("out_proj_backward.do+delta")),
        launch_builders.attention_bwd(ctx, qkv=ly.qkv16, do=g.do32, lse=ly.lse, delta=g.delta,
                        kv_part=g.kv_part, ds=g.ds16, label=ly.label("attention_backward")),
        launch_builders.attention_bwd_dq(ctx, qkv=ly.qkv16, ds=g.ds16, kv_part=g.kv_part, rope=ctx.buf("rope"),
                           dqkv=ly.dqkv16, label=ly.label("attention_backward.dq+merge")),
        dh,
        _dw(launch_matmul.weight_grad(ctx, products=[(dy16, ly.o16, ly.param("wo"), D, ctx.p.q_width),
                                          (ly.dqkv16, ly.h16_attn, ly.param("wq"), W, D)],
                           label=ly.label("attention_backward.dW+adamw")), dh),
        _norm_backward(ctx, g, dh, x=ly.resid_attn, rstd=ly.rstd_attn, site=ly.site_attn,
                       label=ly.label("attention_backward.norm")),
    ]


def _embed_backward(ctx: Context, g: GradRefs) -> list[Launch]:
    return [
        launch_builders.rmsnorm_bwd_gain(ctx, dy=g.dres, x=ctx.buf("emb"), rstd=ctx.rstd(None),
                           g=ctx.param("g_embed"), dx=g.de, dx16=g.de, dg=ctx.gain_grad("g_embed"),
                           write_bf16=False, label="embed_backward.norm+dg"),
        # the next-row links were written by embed_fwd (forward, same submission); E's and the
        # gains' AdamW run here, after the last launch that reads them (embed_fwd, the norms)
        launch_builders.embed_grad(ctx, ids=ctx.inputs(), next_row=ctx.buf("next_row"), de=g.de,
                     w1=loss_window("W1_EMBED_GRAD"), label="embed_backward.dE+adamw+w1"),
    ]


def backward_pass(ctx: Context) -> list[Launch]:
    """cross-entropy, head and final norm, the layers in reverse (MLP, then attention), embed;
    AdamW inside the weight-gradient launches (the side lane) and embed_grad."""
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
    return [launch_builders.copy(ctx, src=ctx.buf("logits", r * ctx.V),
                   dst=StagingRef(f"{field} + {i}·V·4", dst_offset + i * row_bytes), n=ctx.V,
                   label=f"record.row{r}") for i, r in enumerate(rows)]


def _predictions(ctx: Context) -> Launch:
    return launch_builders.predictions(ctx, logits=ctx.buf("logits"), pred=staging("PREDICTIONS", "u32"),
                         label="predictions")


def _embed_decay(ctx: Context) -> Launch:
    """E's absent rows (g = 0) at the very start of the update, on the side lane beside the
    forward: forked after the stage-in (the ids and the doorbell it reads are staged there).
    embed_fwd and embed_grad touch only present rows, so nothing orders them with it."""
    stage_in = launch_builders.release_stage_in(ctx, L.SUBMISSIONS.index("update"))
    return forked(launch_builders.embed_decay(ctx, ids=ctx.inputs(), w1=loss_window("W1_EMBED_GRAD"),
                                label="embed_backward.absent+adamw+w1"), stage_in, SIDE_LANE)


def forward_submission(ctx: Context) -> list[Launch]:
    """The forward submission's body: w16 refreshed from the P plane (after a load or a fresh
    init), the forward pass, the PREDICTION_ROWS rows' logits to the record's forward part, and
    their predictions.  No parameter changes."""
    rows = P.PREDICTION_ROWS
    refresh = launch_builders.cast_bf16(ctx, src=ctx.buf("pmv"), dst=ctx.buf("w16"), label="refresh_w16")
    return ([refresh] + forward_pass(ctx)
            + _records(ctx, rows, L.record_forward_offset(ctx.p), "record_forward_offset")
            + [_predictions(ctx)])


def update_submission(ctx: Context) -> list[Launch]:
    """One training step's body: the forward and backward passes, with AdamW fused into the
    launches that produce each gradient — the weight-gradient launches (`weight_grad`, on the
    side lane) update the matrices and their w16 rows, `embed_grad` (main lane, last) E's present
    rows and the two gains, and `embed_decay` (side lane, from the start) E's absent rows.  No
    launch applies AdamW to a whole plane: that form is only the tests' oracle of the fused ones
    (tests/support/adamw_oracle.py)."""
    return [_embed_decay(ctx)] + forward_pass(ctx) + backward_pass(ctx)


def final_submission(ctx: Context) -> list[Launch]:
    """The final submission's body: the forward pass after the last step, the last prediction
    row's logits to the record's final part, the predictions, and E's first P and M words to the
    w2 and w3 windows."""
    last_row = P.PREDICTION_ROWS[-1:]
    return (forward_pass(ctx)
            + _records(ctx, last_row, L.record_final_offset(ctx.p), "record_final_offset")
            + [_predictions(ctx),
               launch_builders.copy(ctx, src=ctx.param("embed"), dst=loss_window("W2_EMBED_FINAL"),
                      n=L.LOSS_WINDOW_WORDS, label="w2"),
               launch_builders.copy(ctx, src=ctx.param("embed", "pmv", 1), dst=loss_window("W3_EMBED_M_FINAL"),
                      n=L.LOSS_WINDOW_WORDS, label="w3")])


# a submission's body by its staging/layout.py name
BODIES = {"forward": forward_submission, "update": update_submission, "final": final_submission}


def submissions(profile) -> tuple[Submission, Submission, Submission]:
    """(forward, update, final) for a profile (CONTRACT §7)."""
    L.check_layout(profile)
    out = []
    ctx = Context(profile)
    for index, name in enumerate(L.SUBMISSIONS):
        body = BODIES[name](ctx)
        side = [x for x in body if x.lane == SIDE_LANE]
        final = launch_builders.release(ctx, index)
        if side:                     # the fence means the whole issue is done: join the side lane
            final = dataclasses.replace(final, after=(side[-1].label,))
        launches = (launch_builders.release_stage_in(ctx, index),) + tuple(body) + (final,)
        out.append(Submission(index, name, launches, dependencies(launches)))
    return tuple(out)


def kernels(profile) -> dict[str, Launch]:
    """One launch per distinct compiled specialization (manifest entry), first use first."""
    out: dict[str, Launch] = {}
    for sub in submissions(profile):
        for launch in sub.launches:
            out.setdefault(launch.kernel, launch)
    return out


__all__ = ["BufferRef", "StagingRef", "Scalar", "RunScalar", "Arg", "Launch", "Submission", "buffers",
           "submissions", "kernels", "forward_submission", "update_submission", "final_submission",
           "specialization", "entry_name", "tuning", "Tuning", "H200",
           "INTERPRETER", "TUNING", "RELEASE", "STAGE_IN", "HAND_WRITTEN", "POINTER_ALIGN",
           "INT_DIVISOR", "MAIN_LANE", "SIDE_LANE", "LANES"]
