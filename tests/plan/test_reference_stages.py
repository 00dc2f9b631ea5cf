"""Stage functions at awkward sizes against naive per-head loops, adjoints, traces and refusals."""
from __future__ import annotations

import numpy as np
import pytest

from coppelius.plan import profiles
from coppelius.plan import reference as ref

TINY = profiles.get("tiny")
# batched vs per-head BLAS calls may sum in another order: bound relative to the tensor's max
LOOP_RTOL = 1e-5
# fp32 rotary vs its transpose, compared through float64 dot products of 10³ terms
ADJOINT_RTOL = 1e-5

# awkward attention shape: T not a power of two, 3 query heads per kv head, odd head count
T, H, G, D_HEAD = 37, 6, 2, 12


def _rel(a, b):
    diff = np.abs(a.astype(np.float64) - b)
    i = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return float(diff[i]) / (float(np.abs(b).max()) or 1.0), i


def _naive_attention(q, k, v, d):
    """Per head, per NUMERICS.md, in loops: → (o (T, H·d), p (H, T, T))."""
    n, heads, groups = q.shape[0], q.shape[1] // d, k.shape[1] // d
    o = np.zeros_like(q)
    p_all = np.zeros((heads, n, n), np.float32)
    for h in range(heads):
        g = h // (heads // groups)
        qh, kh, vh = (x[:, c * d:(c + 1) * d] for x, c in ((q, h), (k, g), (v, g)))
        s = (ref.bf16(qh) @ ref.bf16(kh).T) * ref.attention_scale(d)
        for r in range(n):
            row = s[r, :r + 1]
            e = np.exp(row - row.max())
            p_all[h, r, :r + 1] = e / e.sum()
        o[:, h * d:(h + 1) * d] = ref.bf16(p_all[h]) @ ref.bf16(vh)
    return o, p_all


def _naive_attention_backward(do, q, k, v, o, p, d):
    heads, groups = q.shape[1] // d, k.shape[1] // d
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    scale = ref.attention_scale(d)
    for h in range(heads):                                  # in head order, as NUMERICS says
        g = h // (heads // groups)
        sl, gl = slice(h * d, (h + 1) * d), slice(g * d, (g + 1) * d)
        dp = ref.bf16(do[:, sl]) @ ref.bf16(v[:, gl]).T
        dv[:, gl] += ref.bf16(p[h]).T @ ref.bf16(do[:, sl])
        delta = (do[:, sl] * o[:, sl]).sum(axis=1, keepdims=True)
        ds = p[h] * (dp - delta) * scale
        dq[:, sl] = ref.bf16(ds) @ ref.bf16(k[:, gl])
        dk[:, gl] += ref.bf16(ds).T @ ref.bf16(q[:, sl])
    return dq, dk, dv


def _rand(rng, *shape, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(np.float32)


def test_attention_matches_naive_loops_at_awkward_sizes():
    rng = np.random.default_rng(11)
    q, k, v = _rand(rng, T, H * D_HEAD, scale=2), _rand(rng, T, G * D_HEAD, scale=2), _rand(rng, T, G * D_HEAD)
    o, p = ref.attention(q, k, v, D_HEAD)
    no, np_ = _naive_attention(q, k, v, D_HEAD)
    assert p.shape == (H, T, T) and o.shape == (T, H * D_HEAD)
    assert (np.triu(p, 1) == 0).all(), "probability above the diagonal"
    for name, ours, theirs in (("o", o, no), ("p", p, np_)):
        rel, i = _rel(ours, theirs)
        assert rel <= LOOP_RTOL, f"{name}{i}: {ours[i]!r} vs naive {theirs[i]!r}"
    do = _rand(rng, T, H * D_HEAD)
    got = ref.attention_backward(do, q, k, v, o, p, D_HEAD)
    want = _naive_attention_backward(do, q, k, v, o, p, D_HEAD)
    for name, ours, theirs in zip(("dq", "dk", "dv"), got, want):
        rel, i = _rel(ours, theirs)
        assert rel <= LOOP_RTOL, f"{name}{i}: {ours[i]!r} vs naive {theirs[i]!r}"


def test_rotary_is_a_rotation_and_its_backward_is_the_transpose():
    rng = np.random.default_rng(12)
    half = 5                                               # d = 10, three heads
    ang = rng.uniform(0, 7, (T, half))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    x, y = _rand(rng, T, 3 * 2 * half), _rand(rng, T, 3 * 2 * half)
    rx = ref.rotary(x, cos, sin)
    xh = x.reshape(T, 3, 2 * half)
    want = np.concatenate([xh[..., :half] * cos[:, None] - xh[..., half:] * sin[:, None],
                           xh[..., half:] * cos[:, None] + xh[..., :half] * sin[:, None]], -1)
    assert np.array_equal(rx, want.reshape(T, -1))
    lhs = float(np.dot(rx.ravel().astype(np.float64), y.ravel()))
    rhs = float(np.dot(x.ravel().astype(np.float64), ref.rotary_backward(y, cos, sin).ravel()))
    assert abs(lhs - rhs) <= ADJOINT_RTOL * np.abs(x).sum() * np.abs(y).max(), (lhs, rhs)


def test_embed_backward_sums_repeated_ids_in_row_order():
    rng = np.random.default_rng(13)
    V, n, D = 9, 23, 7
    ids = rng.integers(0, 4, n)                            # many repeats, most ids unused
    dx, y = _rand(rng, n, D), _rand(rng, n, D)
    r, g = _rand(rng, n) ** 2 + 0.5, _rand(rng, D)
    dE, dg = ref.embed_backward(dx, y, r, g, ids, V)
    de = ref.rmsnorm_backward(dx * g, y, r)
    want = np.zeros((V, D), np.float32)
    for row in range(n):
        want[ids[row]] += de[row]
    assert dE.tobytes() == want.tobytes()
    assert not dE[4:].any()
    assert np.allclose(dg, (dx * y).sum(0), rtol=1e-6)


def test_forward_trace_names_and_determinism():
    P = ref.init_parameters(TINY)
    toks = np.random.default_rng(14).integers(0, TINY.vocab, TINY.context + 1)
    trace: dict = {}
    ce, G = ref.gradients(TINY, P, toks[:-1], toks[1:], trace)
    stages = ["qkv.h", "qkv.q", "qkv.k", "qkv.v", "rotary.q", "rotary.k", "attention.p",
              "attention.o", "out_proj.x", "mlp.a", "mlp.b", "mlp.z", "mlp.x", "mlp_backward.dx",
              "out_proj_backward.do", "attention_backward.dq", "attention_backward.dk",
              "attention_backward.dv", "rotary_backward.dq", "rotary_backward.dk", "qkv_backward.dx"]
    want = {f"layers.{i}.{s}" for i in range(TINY.layers) for s in stages}
    want |= {"embed.x", "final_norm.hf", "head.logits", "cross_entropy.ce",
             "cross_entropy_backward.dlogits", "head_backward.dhf", "final_norm_backward.dx",
             "embed_backward.dE"}
    assert want <= trace.keys(), sorted(want - trace.keys())
    d = TINY.head_dim
    assert trace["layers.1.attention.p"].shape == (TINY.heads, TINY.context, TINY.context)
    assert trace["layers.0.qkv.k"].shape == (TINY.context, TINY.kv_heads * d)
    assert trace["head.logits"].shape == (TINY.context, TINY.vocab)
    assert all(a.dtype == np.float32 for a in trace.values())
    logits = ref.forward(TINY, P, toks[:-1])
    assert logits.tobytes() == trace["head.logits"].tobytes()
    ce2, G2 = ref.gradients(TINY, P, toks[:-1], toks[1:])
    assert ce.tobytes() == ce2.tobytes() and G.tobytes() == G2.tobytes()
    assert ce.tobytes() == ref.cross_entropy(logits, toks[1:]).tobytes()


def test_update_submission_does_not_read_uninitialized_memory(monkeypatch):
    """Every np.empty buffer is fully written: poison them with NaN and get the same bytes."""
    P = ref.init_parameters(TINY)
    toks = np.random.default_rng(15).integers(0, TINY.vocab, TINY.context + 1)
    z = np.zeros_like(P)
    clean = ref.update_submission(TINY, P, z, z, 1, toks[:-1], toks[1:])
    empty, empty_like = np.empty, np.empty_like
    poisoned = []

    def poison(a):
        if a.dtype.kind == "f":
            a.fill(np.nan)
            poisoned.append(a.size)
        return a

    monkeypatch.setattr(np, "empty", lambda *a, **k: poison(empty(*a, **k)))
    monkeypatch.setattr(np, "empty_like", lambda *a, **k: poison(empty_like(*a, **k)))
    dirty = ref.update_submission(TINY, P, z, z, 1, toks[:-1], toks[1:])
    assert max(poisoned) >= TINY.parameter_count, "the gradient plane was not poisoned"
    for name, a, b in zip(("ce", "grad", "P", "M", "V"), clean, dirty):
        bad = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
        assert bad.size == 0, f"{name}[{bad[0]}]: {b[bad[0]]!r} with poisoned buffers, {a[bad[0]]!r} without"
    assert np.isfinite(clean[1]).all()


def test_nan_parameters_give_nan_loss_without_raising():
    P = ref.init_parameters(TINY)
    P[TINY.parameter("head").offset + 5] = np.nan
    toks = np.arange(TINY.context + 1) % TINY.vocab
    ce, G = ref.gradients(TINY, P, toks[:-1], toks[1:])
    assert np.isnan(ce).all()                              # loss is telemetry: no exception


def test_refusals_name_the_field():
    P = ref.init_parameters(TINY)
    ok = np.zeros(TINY.context, np.int64)
    bad = ok.copy()
    bad[700] = TINY.vocab
    with pytest.raises(ValueError, match=r"inputs\[700\] = 512"):
        ref.forward(TINY, P, bad)
    with pytest.raises(ValueError, match=r"targets\[700\]"):
        ref.gradients(TINY, P, ok, bad)
    with pytest.raises(ValueError, match="inputs has shape"):
        ref.forward(TINY, P, ok[:-1])
    with pytest.raises(ValueError, match="integer"):
        ref.forward(TINY, P, ok.astype(np.float32))
    with pytest.raises(ValueError, match="P plane"):
        ref.forward(TINY, P[:-1], ok)
    with pytest.raises(ValueError, match="M plane"):
        ref.update_submission(TINY, P, P[:-1], P, 1, ok, ok)
