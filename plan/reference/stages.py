"""Reference stages: forward and backward of every named stage of docs/NUMERICS.md, numpy fp32.

Each function is plain arrays in, arrays out (a NamedTuple where a stage has several outputs) so a
kernel test can feed a kernel and its stage the same arrays.  Shapes: T rows, D width, H query
heads, G kv heads, d head dim, F hidden, V vocab.  Weights are 2-D `[out, in]` (PyTorch Linear
layout); activations are (T, …) float32.  Every matrix-product operand goes through `bf16`, every
product accumulates in fp32; everything else is fp32, in the op order NUMERICS.md writes.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from coppelius.plan.reference.numerics import F32, RMS_EPS, attention_scale, bf16

_ONE = F32(1.0)


# ---------------------------------------------------------------- forward

def rmsnorm(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (T, D) → (y (T, D), r (T,)): r = 1/sqrt(mean(x²) + 1e-6), y = x·r; r is kept for backward."""
    ms = np.mean(x * x, axis=-1, dtype=F32)
    r = _ONE / np.sqrt(ms + RMS_EPS)
    return x * r[:, None], r


class Embed(NamedTuple):
    x: np.ndarray   # (T, D) residual stream = y · g_embed
    e: np.ndarray   # (T, D) gathered rows E[inputs]
    y: np.ndarray   # (T, D) rmsnorm(e)
    r: np.ndarray   # (T,)   inverse rms of e


def embed(E: np.ndarray, g_embed: np.ndarray, inputs: np.ndarray) -> Embed:
    """E (V, D), g_embed (D,), inputs (T,) ids → Embed(x, e, y, r)."""
    e = E[np.asarray(inputs, dtype=np.int64)]
    y, r = rmsnorm(e)
    return Embed(y * g_embed, e, y, r)


class QKV(NamedTuple):
    q: np.ndarray   # (T, H·d) before rotary
    k: np.ndarray   # (T, G·d) before rotary
    v: np.ndarray   # (T, G·d)
    h: np.ndarray   # (T, D) rmsnorm(x)
    r: np.ndarray   # (T,)


def qkv(x: np.ndarray, Wq: np.ndarray, Wk: np.ndarray, Wv: np.ndarray) -> QKV:
    """x (T, D) residual; Wq (H·d, D), Wk, Wv (G·d, D) → QKV(q, k, v, h, r); h = rmsnorm(x)."""
    h, r = rmsnorm(x)
    hb = bf16(h)
    return QKV(hb @ bf16(Wq).T, hb @ bf16(Wk).T, hb @ bf16(Wv).T, h, r)


def _halves(x: np.ndarray, half: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    xh = x.reshape(x.shape[0], -1, 2 * half)        # (T, heads, d)
    return xh, xh[..., :half], xh[..., half:]


def rotary(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (T, n·d), cos/sin (T, d/2) → (T, n·d): per head x' = x·cos + rot(x)·sin, rot = [-x₂, x₁]."""
    half = cos.shape[1]
    xh, x1, x2 = _halves(x, half)
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(xh)
    out[..., :half] = x1 * c - x2 * s
    out[..., half:] = x2 * c + x1 * s
    return out.reshape(x.shape)


def _heads(x: np.ndarray, groups: int, head_dim: int) -> np.ndarray:
    """(T, n·d) → (G, n/G, T, d): query head h = g·(n/G) + j sits at [g, j]."""
    T = x.shape[0]
    return x.reshape(T, groups, -1, head_dim).transpose(1, 2, 0, 3)


def _unheads(x: np.ndarray) -> np.ndarray:
    """(G, R, T, d) → (T, G·R·d)."""
    G, R, T, d = x.shape
    return np.ascontiguousarray(x.transpose(2, 0, 1, 3)).reshape(T, G * R * d)


def _causal_bias(T: int) -> np.ndarray:
    """(T, T): 0 on and below the diagonal, -inf above (adding it is exact)."""
    return np.triu(np.full((T, T), -np.inf, dtype=F32), 1)


class Attention(NamedTuple):
    o: np.ndarray   # (T, H·d)
    p: np.ndarray   # (H, T, T) fp32 softmax probabilities (0 above the diagonal)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, head_dim: int) -> Attention:
    """q (T, H·d) and k (T, G·d) after rotary, v (T, G·d) → Attention(o, p).

    s = (bf(q)·bf(k)ᵀ)·d^-½ causal, p = softmax(s) fp32, o = bf(p)·bf(v); query head h reads
    kv head h // (H/G).
    """
    T = q.shape[0]
    G = k.shape[1] // head_dim
    qh = _heads(bf16(q), G, head_dim)                       # (G, R, T, d)
    kh = _heads(bf16(k), G, head_dim)                       # (G, 1, T, d)
    vh = _heads(bf16(v), G, head_dim)
    s = qh @ kh.swapaxes(-1, -2)                            # (G, R, T, T)
    s *= attention_scale(head_dim)
    s += _causal_bias(T)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    o = bf16(p) @ vh                                        # (G, R, T, d)
    return Attention(_unheads(o), p.reshape(-1, T, T))


def out_proj(x: np.ndarray, o: np.ndarray, Wo: np.ndarray) -> np.ndarray:
    """x (T, D) residual, o (T, H·d), Wo (D, H·d) → x + bf(o)·bf(Wo)ᵀ (T, D)."""
    return x + bf16(o) @ bf16(Wo).T


def _silu(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):                        # exp(-a) = inf gives silu = -0
        return a / (_ONE + np.exp(-a))


class MLP(NamedTuple):
    x: np.ndarray   # (T, D) residual after the MLP
    h: np.ndarray   # (T, D) rmsnorm(x_in)
    r: np.ndarray   # (T,)
    a: np.ndarray   # (T, F) gate pre-activation, bf-rounded (what the forward stores)
    b: np.ndarray   # (T, F) up projection, bf-rounded
    z: np.ndarray   # (T, F) silu(a)·b


def mlp(x: np.ndarray, Wgate: np.ndarray, Wup: np.ndarray, Wdown: np.ndarray) -> MLP:
    """x (T, D); Wgate, Wup (F, D); Wdown (D, F) → MLP(x + bf(z)·bf(Wdown)ᵀ, h, r, a, b, z)."""
    h, r = rmsnorm(x)
    hb = bf16(h)
    a = bf16(hb @ bf16(Wgate).T)                           # stored bf16: the backward's a, b
    b = bf16(hb @ bf16(Wup).T)
    z = _silu(a) * b
    return MLP(x + bf16(z) @ bf16(Wdown).T, h, r, a, b, z)


class FinalNorm(NamedTuple):
    hf: np.ndarray  # (T, D) rmsnorm(x)·g_final
    y: np.ndarray   # (T, D) rmsnorm(x)
    r: np.ndarray   # (T,)


def final_norm(x: np.ndarray, g_final: np.ndarray) -> FinalNorm:
    """x (T, D), g_final (D,) → FinalNorm(hf, y, r)."""
    y, r = rmsnorm(x)
    return FinalNorm(y * g_final, y, r)


def head(hf: np.ndarray, Whead: np.ndarray) -> np.ndarray:
    """hf (T, D), Whead (V, D) → logits = bf(hf)·bf(Whead)ᵀ (T, V)."""
    return bf16(hf) @ bf16(Whead).T


def _row_max_exp(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = logits.max(axis=-1, keepdims=True)
    return m, np.exp(logits - m)


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits (T, V), targets (T,) → ce (T,) = logsumexp(logits[r]) − logits[r, target[r]]."""
    m, e = _row_max_exp(logits)
    lse = m[:, 0] + np.log(e.sum(axis=-1))
    return lse - logits[np.arange(logits.shape[0]), np.asarray(targets, dtype=np.int64)]


# ---------------------------------------------------------------- backward

def cross_entropy_backward(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """logits (T, V), targets (T,) → dlogits (T, V) = (softmax(logits) − onehot(target)) / T."""
    T = logits.shape[0]
    _, e = _row_max_exp(logits)
    e /= e.sum(axis=-1, keepdims=True)
    e[np.arange(T), np.asarray(targets, dtype=np.int64)] -= _ONE
    e /= F32(T)
    return e


def head_backward(dlogits: np.ndarray, hf: np.ndarray, Whead: np.ndarray):
    """dlogits (T, V), hf (T, D), Whead (V, D) → (dhf (T, D), dWhead (V, D))."""
    gb = bf16(dlogits)
    return gb @ bf16(Whead), gb.T @ bf16(hf)


def rmsnorm_backward(dy: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """dy, y (T, D), r (T,) → dx (T, D) = r·(dy − y·mean(dy·y)) per row."""
    mean = np.mean(dy * y, axis=-1, dtype=F32)
    return r[:, None] * (dy - y * mean[:, None])


def final_norm_backward(dhf: np.ndarray, y: np.ndarray, r: np.ndarray, g_final: np.ndarray):
    """dhf, y (T, D), r (T,), g_final (D,) → (dx (T, D), dg_final (D,) = Σ_rows dhf·y)."""
    dg = (dhf * y).sum(axis=0, dtype=F32)
    return rmsnorm_backward(dhf * g_final, y, r), dg


class MLPGrad(NamedTuple):
    dx: np.ndarray      # (T, D) residual gradient entering the MLP's input (dx + norm path)
    dWgate: np.ndarray  # (F, D)
    dWup: np.ndarray    # (F, D)
    dWdown: np.ndarray  # (D, F)


def mlp_backward(dx, h, r, a, b, z, Wgate, Wup, Wdown) -> MLPGrad:
    """dx (T, D) residual gradient after the MLP; h (T, D), r (T,), a, b, z (T, F) from `mlp`."""
    dxb = bf16(dx)
    dWdown = dxb.T @ bf16(z)
    dz = dxb @ bf16(Wdown)
    with np.errstate(over="ignore"):
        ea = _ONE + np.exp(-a)
    sig = _ONE / ea
    silu = a / ea
    dsilu = sig * (_ONE + a * (_ONE - sig))
    da = dz * b * dsilu
    db = dz * silu
    dab, dbb, hb = bf16(da), bf16(db), bf16(h)
    dh = dab @ bf16(Wgate) + dbb @ bf16(Wup)
    return MLPGrad(dx + rmsnorm_backward(dh, h, r), dab.T @ hb, dbb.T @ hb, dWdown)


def out_proj_backward(dx: np.ndarray, o: np.ndarray, Wo: np.ndarray):
    """dx (T, D), o (T, H·d), Wo (D, H·d) → (do (T, H·d), dWo (D, H·d))."""
    dxb = bf16(dx)
    return dxb @ bf16(Wo), dxb.T @ bf16(o)


def _sum_shared(x: np.ndarray) -> np.ndarray:
    """(G, R, T, d) → (G, 1, T, d): sum over the query heads sharing a kv head, in head order."""
    acc = x[:, :1].copy()
    for j in range(1, x.shape[1]):
        acc += x[:, j:j + 1]
    return acc


def attention_backward(do, q, k, v, o, p, head_dim: int):
    """do, o (T, H·d); q (T, H·d) and k (T, G·d) after rotary; v (T, G·d); p (H, T, T).

    → (dq (T, H·d), dk (T, G·d), dv (T, G·d)), dq and dk with respect to the rotated q and k.
    """
    T = q.shape[0]
    G = k.shape[1] // head_dim
    doh = _heads(bf16(do), G, head_dim)                     # (G, R, T, d)
    qh = _heads(bf16(q), G, head_dim)
    kh = _heads(bf16(k), G, head_dim)                       # (G, 1, T, d)
    vh = _heads(bf16(v), G, head_dim)
    R = doh.shape[1]
    ph = p.reshape(G, R, T, T)
    dp = doh @ vh.swapaxes(-1, -2)                          # (G, R, T, T)
    dv = _sum_shared(bf16(ph).swapaxes(-1, -2) @ doh)
    delta = (do * o).reshape(T, G, R, head_dim).sum(axis=-1, dtype=F32)   # (T, G, R)
    dp -= delta.transpose(1, 2, 0)[..., None]
    ds = ph * dp
    ds *= attention_scale(head_dim)
    dsb = bf16(ds)
    dq = dsb @ kh
    dk = _sum_shared(dsb.swapaxes(-1, -2) @ qh)
    return _unheads(dq), _unheads(dk), _unheads(dv)


def rotary_backward(dx: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """dx' (T, n·d) → dx (T, n·d): the transpose of the rotation, the rotation by the opposite
    angle (dx₁ = dx'₁cos + dx'₂sin, …; negating sin is exact, so the bits are those of that sum)."""
    return rotary(dx, cos, -sin)


class QKVGrad(NamedTuple):
    dx: np.ndarray      # (T, D) residual gradient entering the layer (dx + norm path)
    dWq: np.ndarray     # (H·d, D)
    dWk: np.ndarray     # (G·d, D)
    dWv: np.ndarray     # (G·d, D)


def qkv_backward(dx, dq, dk, dv, h, r, Wq, Wk, Wv) -> QKVGrad:
    """dx (T, D) residual gradient; dq (T, H·d), dk, dv (T, G·d) before rotary; h, r from `qkv`."""
    dqb, dkb, dvb, hb = bf16(dq), bf16(dk), bf16(dv), bf16(h)
    dh = dqb @ bf16(Wq) + dkb @ bf16(Wk) + dvb @ bf16(Wv)
    return QKVGrad(dx + rmsnorm_backward(dh, h, r), dqb.T @ hb, dkb.T @ hb, dvb.T @ hb)


def embed_backward(dx, y, r, g_embed, inputs, vocab: int):
    """dx, y (T, D), r (T,), g_embed (D,), inputs (T,) → (dE (V, D), dg_embed (D,)).

    dE[id] sums the rows r with inputs[r] = id in increasing row order (np.add.at is sequential).
    """
    dg = (dx * y).sum(axis=0, dtype=F32)
    de = rmsnorm_backward(dx * g_embed, y, r)
    dE = np.zeros((vocab, dx.shape[1]), dtype=F32)
    np.add.at(dE, np.asarray(inputs, dtype=np.int64), de)
    return dE, dg
