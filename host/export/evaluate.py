"""`coppelius eval`: the mean per-token loss of a checkpoint over contexts of a token cache.

Context c of a cache is its ids T·c .. T·c + T (inputs, then targets one further), as a run trains
on it; step s of a run from update count c0 trains on context c0 + s, so a checkpoint after a run
from 0 on the same cache has seen contexts 0 .. update_count − 1, and the default first context
is its update count: held-out contexts of the cache it trained on.

The logits come from one of:
- `reference`: the numpy reference model (plan/reference/) on the CPU;
- `cuda` / `interpret`: the backend's forward submission — the launches every training step
  starts with, the same kernels and bf16 weight copy — then the `logits` buffer (T, V) fp32 read
  back.  The parameters go up through the transfer window as a run's do, M and V as zeros (the
  forward reads neither);
- `auto`: cuda when it opens on this machine, else the reference.
Either way the cross-entropy of each row is the reference's (`cross_entropy`, fp32) on those
logits, so two backends differ only by their logits (NUMERICS.md's tolerances).  On the embedded
stream each context's floor (`coppelius.staging.synthetic.context_floor`) is known exactly and is
reported beside the loss.
"""
from __future__ import annotations

import math
import time

import numpy as np

from coppelius.plan import reference as ref
from coppelius.staging import layout as L
from coppelius.staging import synthetic as S
from coppelius.staging.tokens import TokenCache

from coppelius.errors import BackendUnavailable, DeviceError
from coppelius.extras import install_command
from coppelius.staging.errors import UserError

BACKENDS = ("auto", "reference", "interpret", "cuda")
DEFAULT_CONTEXTS = 8
FORWARD = L.SUBMISSIONS.index("forward")
LOGITS_BUFFER = "logits"
F32_BYTES = 4


class EvalRefused(UserError):
    """An evaluation request that cannot run (contexts, backend, cache)."""


def select_contexts(cache: TokenCache, first: int | None, count: int, update_count: int) -> range:
    """Contexts first .. first + count − 1 (first defaults to the checkpoint's update count),
    refused unless the cache holds them all and every id is below V."""
    start = update_count if first is None else first
    if count < 1:
        raise EvalRefused(f"--contexts {count} is below 1", "evaluate at least one context")
    if start < 0 or start + count > cache.context_count:
        default = " (the checkpoint's update count)" if first is None else ""
        raise EvalRefused(f"contexts {start}..{start + count - 1}{default} are outside the "
                          f"{cache.context_count} contexts of {cache.path}",
                          "pass --first C (0 for the first context) or fewer --contexts")
    cache.validate_run(start, count)                 # ids below V in every context used
    return range(start, start + count)


def is_embedded(cache: TokenCache) -> bool:
    """A generated embedded stream: the zero header (mtime 0, size 0) and its exact length."""
    return (cache.source_mtime_ns == 0 and cache.source_size == 0
            and cache.token_count == S.CONTEXTS * cache.profile.context + 1)


def floors(cache: TokenCache, contexts: range) -> np.ndarray | None:
    """(n,) f64: each context's floor on the embedded stream, None on any other cache.  The
    markers the floor is computed from are drawn from the seed, and must be the ids the cache holds
    at their positions (the first id of each block, one after the context's start)."""
    if not is_embedded(cache):
        return None
    prof = cache.profile
    markers = S.context_markers(prof, np.asarray(contexts))                # (n, n_b) from the seed
    where = 1 + S.BLOCK * np.arange(markers.shape[1])                       # (n_b,) in the window
    for i, c in enumerate(contexts):
        inputs, targets = cache.context(c)
        window = np.concatenate([inputs[:1], targets])                      # ids T·c .. T·c + T
        if not np.array_equal(window[where], markers[i]):
            return None
    return S.context_floor(prof, np.asarray(contexts))


def reference_logits(profile, plane: np.ndarray):
    """A logits function of one context, on the CPU."""
    return lambda inputs: ref.forward(profile, plane, np.asarray(inputs, np.int64))


def open_backend(name: str, profile):
    if name == "cuda":
        from coppelius.backends.cuda.backend import CudaBackend
        return CudaBackend(profile)
    try:        # here, not at the top: it imports Triton and torch and sets TRITON_INTERPRET
        from coppelius.backends.interpret import InterpretBackend
    except ImportError as e:
        raise EvalRefused(f"the interpret backend needs Triton and torch ({e})",
                          install_command("demo")) from None
    return InterpretBackend(profile)


class DeviceForward:
    """The forward submission on an open backend, one context per issue; `logits(inputs)` after
    `write_input_record` staged it (the cache's own staging, as a run stages a context)."""

    def __init__(self, backend, plane: np.ndarray, update_count: int):
        self.backend = backend
        self.profile = backend.profile
        backend.upload_payload(np.ascontiguousarray(plane, "<f4").view(np.uint8))
        backend.instantiate(t_base=update_count - 1)        # as a run from this update count
        self.sequence = 0
        self.final = backend.staging.u32(L.semaphore_slot(FORWARD) + L.SLOT_FINAL_RELEASE, 1)

    def run(self, cache: TokenCache, c: int) -> np.ndarray:
        """(T, V) f32: the forward submission's logits of context c."""
        T, V = self.profile.context, self.profile.vocab
        cache.write_input_record(self.backend.staging, c)
        self.sequence += 1
        self.backend.staging.doorbell[0] = self.sequence
        self.backend.issue(FORWARD)
        self.backend.synchronize()
        self.backend.check()
        if int(self.final[0]) != self.sequence:
            raise DeviceError(f"forward issue {self.sequence} (context {c}): the final release "
                              f"holds {int(self.final[0])}")
        raw = self.backend.read_bytes(LOGITS_BUFFER, 0, T * V * F32_BYTES)
        return raw.view("<f4").reshape(T, V)


def _losses(logits_of, cache: TokenCache, contexts: range, progress) -> np.ndarray:
    """(n,) f64: each context's mean per-token cross-entropy."""
    out = np.empty(len(contexts), np.float64)
    for i, c in enumerate(contexts):
        inputs, targets = cache.context(c)
        ce = ref.cross_entropy(logits_of(c, inputs), np.asarray(targets, np.int64))    # (T,)
        out[i] = float(ce.mean(dtype=np.float64))
        progress(i + 1, len(contexts), out[:i + 1].mean())
    return out


def _run(backend: str, checkpoint, cache: TokenCache, contexts: range, progress):
    """(losses, backend used, device, note)."""
    prof, plane = checkpoint.profile, checkpoint.P
    note = ""
    if backend != "reference":
        try:
            dev = open_backend("cuda" if backend == "auto" else backend, prof)
        except BackendUnavailable as e:
            if backend != "auto":
                raise
            note = f"auto: no cuda backend here ({e.message})"
        else:
            with dev:
                fwd = DeviceForward(dev, plane, checkpoint.update_count)
                losses = _losses(lambda c, x: fwd.run(cache, c), cache, contexts, progress)
                return losses, dev.name, dev.device().name, note
    f = reference_logits(prof, plane)
    return _losses(lambda c, x: f(x), cache, contexts, progress), "reference", "cpu (numpy)", note


def evaluate(checkpoint, tokens, contexts: int = DEFAULT_CONTEXTS, first: int | None = None,
             backend: str = "auto", progress=None) -> dict:
    """Mean per-token loss of `checkpoint` (a verified `coppelius.forensics.Checkpoint`) over
    `contexts` contexts of the token cache `tokens`; `progress(done, total, mean so far)`."""
    if backend not in BACKENDS:
        raise EvalRefused(f"unknown backend {backend!r}", f"one of {', '.join(BACKENDS)}")
    prof = checkpoint.profile
    cache = TokenCache.open(tokens, prof)
    chosen = select_contexts(cache, first, contexts, checkpoint.update_count)
    t0 = time.monotonic()
    losses, used, device, note = _run(backend, checkpoint, cache, chosen,
                                      progress or (lambda done, total, mean: None))
    seconds = time.monotonic() - t0
    floor = floors(cache, chosen)
    mean = float(losses.mean())
    rep = {"checkpoint": str(checkpoint.path), "profile": prof.name,
           "update_count": checkpoint.update_count, "tokens": str(tokens),
           "first_context": chosen.start, "contexts": len(chosen),
           "tokens_scored": len(chosen) * prof.context, "backend": used, "device": device,
           "note": note, "mean_loss": mean, "perplexity": math.exp(mean),
           "per_context": [float(x) for x in losses], "embedded_stream": floor is not None,
           "seconds": seconds}
    if floor is not None:
        rep.update({"mean_floor": float(floor.mean()), "loss_minus_floor": mean - float(floor.mean()),
                    "no_copy": float(S.context_no_copy(prof, np.asarray(chosen)).mean()),
                    "per_context_floor": [float(x) for x in floor]})
    return rep
