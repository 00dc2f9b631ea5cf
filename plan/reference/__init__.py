"""The reference model (CONTRACT §3–§4, §11): numpy forward, backward and AdamW, the oracle for every
kernel.

Rounds to bf16 exactly where docs/NUMERICS.md says, nowhere else.  Never imports torch or triton.
Stage functions live in `reference_stages`, bf16 and the rotary tables in `reference_numerics`,
initialization and AdamW in `reference_learner`; all are re-exported here.  Trace keys are
`<stage>.<value>` with `layers.{i}.` in front inside a layer (llm.c style), e.g.
`layers.3.attention.p`, `head.logits`, `layers.0.mlp_backward.dx`.
"""
from __future__ import annotations

import numpy as np

from coppelius.plan.reference.learner import adamw, adamw_constants, decay_mask, init_parameters, unflatten
from coppelius.plan.reference.numerics import F32, attention_scale, bf16, rotary_tables
from coppelius.plan.reference.stages import (
    attention, attention_backward, cross_entropy, cross_entropy_backward, embed, embed_backward,
    final_norm, final_norm_backward, head, head_backward, mlp, mlp_backward, out_proj,
    out_proj_backward, qkv, qkv_backward, rmsnorm, rmsnorm_backward, rotary, rotary_backward,
)

__all__ = [
    "bf16", "rotary_tables", "attention_scale", "unflatten", "init_parameters", "decay_mask",
    "adamw", "adamw_constants", "forward", "forward_trace", "gradients", "update_submission",
    "embed", "rmsnorm", "qkv", "rotary", "attention", "out_proj", "mlp", "final_norm", "head",
    "cross_entropy", "cross_entropy_backward", "head_backward", "final_norm_backward",
    "rmsnorm_backward", "mlp_backward", "out_proj_backward", "attention_backward",
    "rotary_backward", "qkv_backward", "embed_backward",
]


def _tokens(profile, ids, what: str) -> np.ndarray:
    """Validate a (T,) id vector: shape, integer dtype, every id < V."""
    a = np.asarray(ids)
    if a.shape != (profile.context,):
        raise ValueError(f"{what} has shape {a.shape}, profile {profile.name!r} needs ({profile.context},)")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{what} must be integer token ids, got {a.dtype}")
    bad = np.flatnonzero((a < 0) | (a >= profile.vocab))
    if bad.size:
        raise ValueError(f"{what}[{bad[0]}] = {a[bad[0]]} is not a token id below V={profile.vocab}")
    return a.astype(np.int64)


def _plane(profile, plane, what: str) -> np.ndarray:
    if not isinstance(plane, np.ndarray) or plane.shape != (profile.parameter_count,) \
            or plane.dtype != F32:
        got = f"{plane.dtype}{plane.shape}" if isinstance(plane, np.ndarray) else type(plane).__name__
        raise ValueError(f"{what} plane is {got}, profile {profile.name!r} needs "
                         f"float32({profile.parameter_count},)")
    return plane


def forward_trace(profile, P: np.ndarray, inputs, targets=None) -> dict[str, np.ndarray]:
    """Every named forward intermediate of one context; `head.logits` (T, V) is the output.

    Keys: embed.{e,y,r,x}; layers.{i}.qkv.{h,r,q,k,v}, .rotary.{q,k}, .attention.{p,o},
    .out_proj.x, .mlp.{h,r,a,b,z,x}; final_norm.{y,r,hf}; head.logits; with targets also
    cross_entropy.ce (T,).
    """
    W = unflatten(profile, _plane(profile, P, "P"))
    ids = _tokens(profile, inputs, "inputs")
    cos, sin = rotary_tables(profile)
    d = profile.head_dim
    tr: dict[str, np.ndarray] = {}
    em = embed(W["embed"], W["g_embed"], ids)
    tr.update({"embed.e": em.e, "embed.y": em.y, "embed.r": em.r, "embed.x": em.x})
    x = em.x
    for i in range(profile.layers):
        L = f"layers.{i}."
        a = qkv(x, W[L + "wq"], W[L + "wk"], W[L + "wv"])
        q, k = rotary(a.q, cos, sin), rotary(a.k, cos, sin)
        at = attention(q, k, a.v, d)
        x = out_proj(x, at.o, W[L + "wo"])
        m = mlp(x, W[L + "wgate"], W[L + "wup"], W[L + "wdown"])
        tr.update({L + "qkv.h": a.h, L + "qkv.r": a.r, L + "qkv.q": a.q, L + "qkv.k": a.k,
                   L + "qkv.v": a.v, L + "rotary.q": q, L + "rotary.k": k,
                   L + "attention.p": at.p, L + "attention.o": at.o, L + "out_proj.x": x,
                   L + "mlp.h": m.h, L + "mlp.r": m.r, L + "mlp.a": m.a, L + "mlp.b": m.b,
                   L + "mlp.z": m.z, L + "mlp.x": m.x})
        x = m.x
    fn = final_norm(x, W["g_final"])
    tr.update({"final_norm.y": fn.y, "final_norm.r": fn.r, "final_norm.hf": fn.hf})
    tr["head.logits"] = head(fn.hf, W["head"])
    if targets is not None:
        tr["cross_entropy.ce"] = cross_entropy(tr["head.logits"], _tokens(profile, targets, "targets"))
    return tr


def forward(profile, P: np.ndarray, inputs) -> np.ndarray:
    """P (parameter_count,) float32, inputs (T,) ids → logits (T, V) float32."""
    return forward_trace(profile, P, inputs)["head.logits"]


def gradients(profile, P: np.ndarray, inputs, targets, trace: dict | None = None):
    """Forward and backward of one context → (ce (T,), G (parameter_count,) float32).

    G is the gradient of mean(ce) in the P plane's layout.  Pass a dict as `trace` to receive every
    forward intermediate plus the backward ones: cross_entropy_backward.dlogits, head_backward.dhf,
    final_norm_backward.dx, layers.{i}.mlp_backward.dx, .out_proj_backward.do,
    .attention_backward.{dq,dk,dv} (w.r.t. rotated q, k), .rotary_backward.{dq,dk},
    .qkv_backward.dx, embed_backward.dE.
    """
    tgt = _tokens(profile, targets, "targets")
    tr = forward_trace(profile, P, inputs, tgt)
    ids = _tokens(profile, inputs, "inputs")
    W = unflatten(profile, P)
    G = np.empty(profile.parameter_count, dtype=F32)
    dW = unflatten(profile, G)
    cos, sin = rotary_tables(profile)
    d = profile.head_dim
    bt: dict[str, np.ndarray] = {}

    dlogits = cross_entropy_backward(tr["head.logits"], tgt)
    dhf, dW["head"][:] = head_backward(dlogits, tr["final_norm.hf"], W["head"])
    dx, dW["g_final"][:] = final_norm_backward(dhf, tr["final_norm.y"], tr["final_norm.r"],
                                               W["g_final"])
    bt.update({"cross_entropy_backward.dlogits": dlogits, "head_backward.dhf": dhf,
               "final_norm_backward.dx": dx})
    for i in reversed(range(profile.layers)):
        L = f"layers.{i}."
        mg = mlp_backward(dx, tr[L + "mlp.h"], tr[L + "mlp.r"], tr[L + "mlp.a"], tr[L + "mlp.b"],
                          tr[L + "mlp.z"], W[L + "wgate"], W[L + "wup"], W[L + "wdown"])
        dW[L + "wgate"][:], dW[L + "wup"][:], dW[L + "wdown"][:] = mg.dWgate, mg.dWup, mg.dWdown
        dx = mg.dx
        do, dW[L + "wo"][:] = out_proj_backward(dx, tr[L + "attention.o"], W[L + "wo"])
        dqr, dkr, dv = attention_backward(do, tr[L + "rotary.q"], tr[L + "rotary.k"],
                                          tr[L + "qkv.v"], tr[L + "attention.o"],
                                          tr[L + "attention.p"], d)
        dq, dk = rotary_backward(dqr, cos, sin), rotary_backward(dkr, cos, sin)
        qg = qkv_backward(dx, dq, dk, dv, tr[L + "qkv.h"], tr[L + "qkv.r"],
                          W[L + "wq"], W[L + "wk"], W[L + "wv"])
        dW[L + "wq"][:], dW[L + "wk"][:], dW[L + "wv"][:] = qg.dWq, qg.dWk, qg.dWv
        bt.update({L + "mlp_backward.dx": mg.dx, L + "out_proj_backward.do": do,
                   L + "attention_backward.dq": dqr, L + "attention_backward.dk": dkr,
                   L + "attention_backward.dv": dv, L + "rotary_backward.dq": dq,
                   L + "rotary_backward.dk": dk, L + "qkv_backward.dx": qg.dx})
        dx = qg.dx
    dW["embed"][:], dW["g_embed"][:] = embed_backward(dx, tr["embed.y"], tr["embed.r"],
                                                      W["g_embed"], ids, profile.vocab)
    if trace is not None:
        trace.update(tr)
        trace.update(bt)
        trace["embed_backward.dE"] = dW["embed"]
    return tr["cross_entropy.ce"], G


def update_submission(profile, P, M, V, t: int, inputs, targets):
    """One training step on one context, as the launch lists' update submission computes it
    (plan/launches/__init__.py `update_submission`) → (ce_rows (T,), grad, P, M, V).

    ce_rows is the per-row cross-entropy before the update; grad the flat gradient of mean(ce);
    t the update count after this step (1 for the first step of a fresh run).  Inputs unchanged.
    """
    for name, plane in (("M", M), ("V", V)):
        _plane(profile, plane, name)
    ce, G = gradients(profile, P, inputs, targets)
    P2, M2, V2 = adamw(profile, P, M, V, G, t)
    return ce, G, P2, M2, V2
