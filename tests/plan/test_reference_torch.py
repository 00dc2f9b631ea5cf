"""The numpy reference against an outside implementation: torch autograd with the same bf16 points.

The torch model below is written from CONTRACT §3 alone: autograd derives every backward formula;
only the matrix products are custom functions, because NUMERICS.md rounds the *operands* of the
backward products to bf16 as well (a plain `.bfloat16()` cast would round their results instead).
Profile `tiny`; tolerances are per tensor, relative to the tensor's largest magnitude.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coppelius.plan import profiles
from coppelius.plan import reference

PROFILE = profiles.get("tiny")

# max |ref − torch| / max |torch| per tensor, per case.  Both sides round the same operands to
# bf16, but their fp32 accumulation orders differ, which flips an occasional bf16 rounding (2⁻⁹
# relative) and the flips travel through later products (on "fresh" most logits rows come out
# bit-identical; a float64-accumulating torch is as far from torch as from the reference).
# wq/wk carry one more, systematic, difference: NUMERICS computes the softmax-backward Σ as
# rowsum(do·o) (flash style), autograd as Σ p·dp; with the exact Σ their error drops 3–7×.
# Observed worst over three token seeds (2026-11-29), bounds ≈ 3× that:
#   fresh:     logits 1.2e-3, ce 3.6e-4, embed 1.8e-5, g_embed 1.1e-5, wq/wk 2.6e-3, wv 4.9e-4,
#              wo 2.5e-4, wgate/wup 5.8e-4, wdown 6.1e-4, g_final 6.4e-6, head 1.2e-3
#   perturbed: logits 1.3e-3, ce 1.1e-3, embed 2.0e-4, g_embed 9.7e-5, wq/wk 2.5e-3, wv 1.1e-3,
#              wo 5.7e-4, wgate/wup 1.4e-3, wdown 9.4e-4, g_final 2.2e-5, head 7.2e-4
GRAD_TOL = {
    "fresh": {"embed": 6e-5, "g_embed": 4e-5, "wq": 8e-3, "wk": 8e-3, "wv": 1.5e-3, "wo": 8e-4,
              "wgate": 2e-3, "wup": 2e-3, "wdown": 2e-3, "g_final": 2e-5, "head": 4e-3},
    "perturbed": {"embed": 6e-4, "g_embed": 3e-4, "wq": 8e-3, "wk": 8e-3, "wv": 4e-3, "wo": 2e-3,
                  "wgate": 4e-3, "wup": 4e-3, "wdown": 3e-3, "g_final": 7e-5, "head": 2.5e-3},
}
LOGITS_TOL = {"fresh": 4e-3, "perturbed": 4e-3}     # relative to max |logits|
CE_TOL = {"fresh": 1.2e-3, "perturbed": 3.5e-3}     # absolute, nats per row
# An fp32 torch model (no bf16 anywhere) must be this many times farther from the reference,
# norm-wise, than the bf16-emulating one (fresh case, 2026-11-29: logits 80×; gradients 3× for
# wq/wk, whose gap is mostly the Σ convention above, 11–1400× for the rest).
FP32_SEPARATION_LOGITS = 10.0
FP32_SEPARATION_GRAD_MIN = 1.5
FP32_SEPARATION_GRAD_MEDIAN = 10.0


def _kind(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float32)


class _BfMatmul(torch.autograd.Function):
    """a @ b with bf16 operands, fp32 result; backward rounds its operands too (NUMERICS.md)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _bf(a) @ _bf(b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        gb = _bf(g)
        return gb @ _bf(b).transpose(-1, -2), _bf(a).transpose(-1, -2) @ gb


class _BfStored(torch.autograd.Function):
    """A value the forward stores in bf16 (NUMERICS mlp: the pre-activations a and b): rounded
    forward, the gradient passed straight through (the backward differentiates at the stored
    value)."""

    @staticmethod
    def forward(ctx, x):
        return _bf(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _rms(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rope(x, cos, sin):              # x (T, n, d)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def torch_model(profile, params: dict, inputs, targets, bf16: bool = True):
    """CONTRACT §3 in torch → (logits (T, V), ce (T,)); params name → tensor (requires_grad)."""
    T, d, H, G = profile.context, profile.head_dim, profile.heads, profile.kv_heads
    mm = _BfMatmul.apply if bf16 else torch.matmul
    stored = _BfStored.apply if bf16 else (lambda x: x)
    lin = (lambda x, w: mm(x, w.t()))
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    freq = torch.tensor([10000.0 ** (-2.0 * i / d) for i in range(d // 2)],
                        dtype=torch.float64)
    ang = pos * freq
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = _rms(F.embedding(inputs, params["embed"])) * params["g_embed"]
    for i in range(profile.layers):
        L = f"layers.{i}."
        h = _rms(x)
        q = _rope(lin(h, params[L + "wq"]).view(T, H, d), cos, sin).transpose(0, 1)   # (H, T, d)
        k = _rope(lin(h, params[L + "wk"]).view(T, G, d), cos, sin).transpose(0, 1)   # (G, T, d)
        v = lin(h, params[L + "wv"]).view(T, G, d).transpose(0, 1)
        k, v = k.repeat_interleave(H // G, 0), v.repeat_interleave(H // G, 0)
        s = mm(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
        o = mm(p, v).transpose(0, 1).reshape(T, H * d)
        x = x + lin(o, params[L + "wo"])
        h = _rms(x)
        z = F.silu(stored(lin(h, params[L + "wgate"]))) * stored(lin(h, params[L + "wup"]))
        x = x + lin(z, params[L + "wdown"])
    logits = lin(_rms(x) * params["g_final"], params["head"])
    return logits, F.cross_entropy(logits, targets, reduction="none")


def _case(kind: str):
    """(P, inputs, targets): fresh init, or init with matrices ×2 and gains 1 ± 0.3 so that
    attention is far from uniform and the gain gradients matter."""
    P = reference.init_parameters(PROFILE)
    rng = np.random.default_rng(4)
    if kind == "perturbed":
        for p in PROFILE.parameters:
            view = P[p.offset:p.end]
            if len(p.shape) == 1:
                view[:] = 1 + 0.3 * rng.standard_normal(p.size).astype(np.float32)
            else:
                view *= 2
    # a stream with repeats, so dE rows sum several positions and attention has something to find
    toks = rng.integers(0, PROFILE.vocab // 4, PROFILE.context + 1)
    return P, toks[:-1], toks[1:]


def _torch_grads(P, inputs, targets, bf16=True):
    params = {name: torch.tensor(v.copy(), requires_grad=True)
              for name, v in reference.unflatten(PROFILE, P).items()}
    logits, ce = torch_model(PROFILE, params, torch.tensor(inputs), torch.tensor(targets), bf16)
    ce.mean().backward()
    return logits.detach().numpy(), ce.detach().numpy(), {n: t.grad.numpy() for n, t in params.items()}


def _worst(ref: np.ndarray, other: np.ndarray):
    """(relative error vs max |other|, index of the worst element, ref there, other there)."""
    diff = np.abs(ref.astype(np.float64) - other)
    i = np.unravel_index(int(np.argmax(diff)), diff.shape)
    scale = float(np.abs(other).max()) or 1.0
    return float(diff[i]) / scale, i, float(ref[i]), float(other[i])


@functools.lru_cache(maxsize=None)
def _computed(kind: str):
    P, inputs, targets = _case(kind)
    ce, G = reference.gradients(PROFILE, P, inputs, targets)
    return kind, P, inputs, targets, ce, G, _torch_grads(P, inputs, targets)


@pytest.fixture(scope="module", params=["fresh", "perturbed"])
def both(request):
    return _computed(request.param)


def test_logits_and_rows_match_torch(both):
    kind, P, inputs, _, ce, _, (t_logits, t_ce, _) = both
    rel, i, a, b = _worst(reference.forward(PROFILE, P, inputs), t_logits)
    print(f"{kind} logits: worst rel {rel:.2e} at {i}: ref {a!r} torch {b!r}")
    assert rel <= LOGITS_TOL[kind], f"logits differ: rel {rel:.2e} at {i}: ref {a!r} torch {b!r}"
    err = np.abs(ce.astype(np.float64) - t_ce)
    r = int(np.argmax(err))
    print(f"{kind} ce: worst {err[r]:.2e} at row {r}: ref {ce[r]!r} torch {t_ce[r]!r}")
    assert err[r] <= CE_TOL[kind], f"ce row {r}: ref {ce[r]!r} torch {t_ce[r]!r}"


def test_every_gradient_matches_torch(both):
    kind, _, _, _, _, G, (_, _, t_grads) = both
    failures = []
    for name, g in reference.unflatten(PROFILE, G).items():
        tol = GRAD_TOL[kind][_kind(name)]
        assert np.isfinite(g).all(), f"{name}: non-finite gradient"
        rel, i, a, b = _worst(g, t_grads[name])
        line = f"{kind} d{name}: worst rel {rel:.2e} (tol {tol:.0e}) at {i}: ref {a!r} torch {b!r}"
        print(line)
        if rel > tol:
            failures.append(line)
    assert not failures, "\n".join(failures)


def _norm_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm((a.astype(np.float64) - b).ravel()) / np.linalg.norm(b.ravel()))


def test_bf16_emulation_is_visible():
    """The comparison can tell a bf16 model from an fp32 one: it would catch a missing rounding."""
    _, P, inputs, targets, _, G, (t_logits, _, t_grads) = _computed("fresh")
    logits32, _, g32 = _torch_grads(P, inputs, targets, bf16=False)
    logits = reference.forward(PROFILE, P, inputs)
    sep = _norm_rel(logits, logits32) / _norm_rel(logits, t_logits)
    print(f"logits: fp32 model {sep:.0f}× farther than the bf16 one")
    assert sep >= FP32_SEPARATION_LOGITS, f"logits: fp32 torch only {sep:.1f}× farther"
    seps = {n: _norm_rel(g, g32[n]) / max(_norm_rel(g, t_grads[n]), 1e-30)
            for n, g in reference.unflatten(PROFILE, G).items()}
    print("gradients:", {n: round(v, 1) for n, v in seps.items()})
    worst = min(seps, key=seps.get)
    assert seps[worst] >= FP32_SEPARATION_GRAD_MIN, f"d{worst}: fp32 torch only {seps[worst]:.1f}× farther"
    median = float(np.median(list(seps.values())))
    assert median >= FP32_SEPARATION_GRAD_MEDIAN, f"median separation only {median:.1f}×"
