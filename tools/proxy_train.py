"""Train a proxy of the Coppelius model in PyTorch on the CPU on the embedded stream (docs/STREAM.md).

The contract's model (CONTRACT §3: rmsnorm, rotary rotate-half, GQA, SwiGLU, untied embedding and
head; init N(0, 0.02), gains 1) at a chosen size, in fp32, and its learner (CONTRACT §4:
torch.optim.AdamW: lr 3e-4, betas 0.9/0.95, eps 1e-8, bias-corrected, weight decay 0.1 on the
matrices E, W*, Whead only; no clipping), one context of T = 1024 tokens per step, step s on context s.  Every N steps it prints,
over the window of the last N steps: the mean loss, the mean per-context floor of the same contexts,
the mean no-copy level, the share of the gap closed (ln V − loss)/(ln V − floor) — L0 = ln V, the
loss of the uniform prediction, which a N(0, 0.02) initialization starts within 0.01 of — the
copy-block loss (mean loss on the content rows of copy blocks, floor 0) and the Markov-content loss
(floor ln K, or H(p) on the old stream).

  python -m tools.proxy_train --width 256 --layers 4 --heads 4 --kv-heads 2 --steps 3000
  python -m tools.proxy_train --stream old ...      # the earlier generator, frozen below
  python -m tools.proxy_train --design copy_reach=1,successors=8 ...   # explore other designs

Not part of `make test` (tests/staging/test_synthetic.py runs it for a few steps on a tiny model).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from coppelius.plan import profiles
from coppelius.staging import synthetic

INIT_STD = 0.02
RMS_EPS = 1e-6
ROPE_BASE = 10000.0


# ------------------------------------------------------------------ the earlier stream
class OldStream:
    """A frozen copy of the earlier generator (for the comparison): 9 markers, a chain over
    all V - 9 other ids with dyadic successor probabilities (1/2, 1/4, 1/8, 1/8), copy probability
    1/2 with a distance uniform in 1..min(b, 8).  Its bytes are those the old pinned sha256 named."""
    BLOCK, REACH, Q = 64, 8, 0.5
    P = (0.5, 0.25, 0.125, 0.125)
    _OF_3_BITS = np.array([0, 0, 0, 0, 1, 1, 2, 3], np.int64)
    SHA256 = {"coppelius": "c2203351737121ade88d81609a7c3e1673a450c026e8a09a22ff46160da67423",
              "tiny": "7bebc4e4ea8be931b6ecd1199ba69d3316b954b4e0edb7a0499ee84e37547012"}

    def __init__(self, profile):
        self.profile = profile
        self.n = profile.vocab - self.REACH - 1
        self.nb = profile.context // self.BLOCK

    def generate(self) -> np.ndarray:
        p, N, nb, J, B1 = self.profile, self.n, self.nb, self.REACH, self.BLOCK - 1
        T, C = p.context, synthetic.CONTEXTS
        bits = np.random.Philox(key=synthetic._key(p))
        perm = np.argsort(bits.random_raw(N), kind="stable").astype(np.int64)
        offsets: list[int] = []
        while len(offsets) < 4:
            d = 1 + int(bits.random_raw()) % (N - 1)
            if d not in offsets:
                offsets.append(d)
        d_k = np.array(offsets, np.int64)
        y_start = int(bits.random_raw()) % N
        block_words = bits.random_raw(C * (nb - 1)).reshape(C, nb - 1)
        reach = np.minimum(np.arange(1, nb, dtype=np.uint64), J)
        copy = (block_words & np.uint64(1)).astype(bool)
        dist = ((block_words >> np.uint64(1)) % reach + np.uint64(1)).astype(np.int64)
        kinds = np.zeros((C, nb), np.int64)
        kinds[:, 1:] = np.where(copy, dist, 0)
        out = np.empty(C * T + 1, np.uint32)
        out[0] = J + 1 + perm[y_start]
        y0 = y_start
        for a in range(0, C, 1000):
            c = min(1000, C - a)
            raw = bits.random_raw(c * (nb * B1 // 8)).astype("<u8").view(np.uint8)
            steps = d_k[self._OF_3_BITS[raw & 7]].reshape(c, nb, B1)
            tokens, y0 = synthetic.content_chunk(steps, kinds[a:a + c], perm, y0, N, J)
            out[1 + a * T:1 + (a + c) * T] = tokens.reshape(-1)
        return out

    def markers(self, tokens, c) -> np.ndarray:
        return np.asarray(tokens[1 + self.profile.context * c + self.BLOCK * np.arange(self.nb)],
                          np.int64)

    def levels(self, tokens, c) -> tuple[float, float, np.ndarray, np.ndarray]:
        """(floor, no-copy level, copy-content rows (T,), Markov-content rows (T,)) of context c."""
        m = self.markers(tokens, c)
        q, hp = self.Q, -sum(x * math.log(x) for x in self.P)
        hq = -q * math.log(q) - (1 - q) * math.log(1 - q)
        marker = sum(hq + q * math.log(min(b, self.REACH)) for b in range(1, self.nb))
        markov, copies = int((m == 0).sum()), int((m > 0).sum())
        T = self.profile.context
        floor = (marker + (self.BLOCK - 1) * hp * markov) / T
        no_copy = floor + copies * (math.log(self.n) + (self.BLOCK - 2) * hp) / T
        return floor, no_copy, *_content_rows(m, self.BLOCK)


def _content_rows(markers: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.zeros((len(markers), block), bool)
    rows[:, 1:] = True
    copy = (rows & (markers > 0)[:, None]).reshape(-1)
    return copy, (rows & (markers == 0)[:, None]).reshape(-1)


class NewStream:
    """The shipped generator (staging/synthetic.py), optionally with another Design to explore."""

    def __init__(self, profile, design: synthetic.Design):
        self.profile, self.design = profile, design

    def generate(self) -> np.ndarray:
        return synthetic.generate(self.profile, self.design)

    def levels(self, tokens, c):
        p, d = self.profile, self.design
        floor = float(synthetic.context_floor(p, c, tokens, d)[0])
        no_copy = float(synthetic.context_no_copy(p, c, tokens, d)[0])
        m = synthetic.context_markers(p, c, tokens, d)[0]
        return floor, no_copy, *_content_rows(m, d.block)


# ------------------------------------------------------------------------------- the model
def build(torch, profile, args):
    """Parameters (name → leaf tensor, the contract's order) and a forward returning the per-row ce (T,)."""
    import torch.nn.functional as F

    V, T, D, L = profile.vocab, profile.context, args.width, args.layers
    H, G, d, Fh = args.heads, args.kv_heads, args.head_dim, args.hidden
    gen = torch.Generator().manual_seed(args.init_seed)

    def mat(*shape):
        return torch.nn.Parameter(torch.empty(*shape).normal_(0.0, INIT_STD, generator=gen))

    params = {"embed": mat(V, D), "g_embed": torch.nn.Parameter(torch.ones(D))}
    for i in range(L):
        for name, shape in (("wq", (H * d, D)), ("wk", (G * d, D)), ("wv", (G * d, D)),
                            ("wo", (D, H * d)), ("wgate", (Fh, D)), ("wup", (Fh, D)),
                            ("wdown", (D, Fh))):
            params[f"layers.{i}.{name}"] = mat(*shape)
    params["g_final"] = torch.nn.Parameter(torch.ones(D))
    params["head"] = mat(V, D)

    freq = ROPE_BASE ** (-2.0 * np.arange(d // 2) / d)                 # float64, CONTRACT §3
    angle = np.arange(T)[:, None] * freq[None, :]                      # (T, d/2)
    cos = torch.from_numpy(np.tile(np.cos(angle), 2).astype(np.float32))   # (T, d)
    sin = torch.from_numpy(np.tile(np.sin(angle), 2).astype(np.float32))

    def rms(x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + RMS_EPS)

    def rot(x):                                                        # (heads, T, d)
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def forward(inputs, targets):
        x = rms(F.embedding(inputs, params["embed"])) * params["g_embed"]      # (T, D)
        for i in range(L):
            p = lambda n: params[f"layers.{i}.{n}"]  # noqa: E731
            h = rms(x)
            q = rot((h @ p("wq").t()).view(T, H, d).transpose(0, 1))        # (H, T, d)
            k = rot((h @ p("wk").t()).view(T, G, d).transpose(0, 1))        # (G, T, d)
            v = (h @ p("wv").t()).view(T, G, d).transpose(0, 1)
            k, v = k.repeat_interleave(H // G, 0), v.repeat_interleave(H // G, 0)
            o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
            x = x + o.transpose(0, 1).reshape(T, H * d) @ p("wo").t()
            h = rms(x)
            x = x + (F.silu(h @ p("wgate").t()) * (h @ p("wup").t())) @ p("wdown").t()
        logits = (rms(x) * params["g_final"]) @ params["head"].t()            # (T, V)
        return F.cross_entropy(logits, targets, reduction="none")

    return params, forward


def optimizer(torch, profile, params):
    lr = profile.learner
    decay = [t for n, t in params.items() if not n.startswith("g_")]      # E, W*, Whead
    plain = [t for n, t in params.items() if n.startswith("g_")]
    return torch.optim.AdamW([{"params": decay, "weight_decay": float(lr.decay)},
                              {"params": plain, "weight_decay": 0.0}],
                             lr=float(lr.lr), betas=(float(lr.beta1), float(lr.beta2)),
                             eps=float(lr.epsilon))


# ------------------------------------------------------------------------------- the loop
def parse_design(text: str) -> synthetic.Design:
    fields = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        fields[key.strip()] = int(value)
    return dataclasses.replace(synthetic.DESIGN, **fields)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="coppelius", choices=profiles.names())
    ap.add_argument("--stream", default="new", choices=["new", "old"])
    ap.add_argument("--design", default="", help="new stream only: e.g. copy_reach=1,successors=8")
    ap.add_argument("--width", type=int, default=256, help="D")
    ap.add_argument("--layers", type=int, default=4, help="L")
    ap.add_argument("--heads", type=int, default=4, help="H")
    ap.add_argument("--kv-heads", type=int, default=2, help="G")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, help="F (default 11·D/4, the tiny profile's ratio)")
    ap.add_argument("--vocab", type=int, help="the model's V, for cheap exploration (default: the "
                    "profile's; the stream is the profile's either way, so V must exceed its ids)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=100, help="print a window mean every N steps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: on a shared 2-core "
                    "machine at load 6-9, 2 threads cost 3.2 CPU-s/step against 0.9 for 1)")
    ap.add_argument("--init-seed", type=int, default=profiles.SEED)
    ap.add_argument("--json", type=Path, help="append one JSON object per printed window here")
    args = ap.parse_args(argv)
    args.hidden = args.hidden or 11 * args.width // 4

    import torch
    torch.set_num_threads(args.threads)
    profile = profiles.get(args.profile)
    stream = OldStream(profile) if args.stream == "old" else NewStream(profile, parse_design(args.design))
    t0 = time.perf_counter()
    tokens = stream.generate()
    if args.vocab:
        if args.vocab <= int(tokens.max()):
            ap.error(f"--vocab {args.vocab} does not cover the stream's ids (max {int(tokens.max())})")
        profile = dataclasses.replace(profile, vocab=args.vocab)
    print(f"# {args.stream} stream ({args.profile}, {'old design' if args.stream == 'old' else args.design or 'shipped design'}) generated in "
          f"{time.perf_counter() - t0:.2f} s; D={args.width} L={args.layers} H={args.heads} "
          f"G={args.kv_heads} d={args.head_dim} F={args.hidden} V={profile.vocab}; "
          f"L0 = ln V = {math.log(profile.vocab):.4f}",
          flush=True)
    params, forward = build(torch, profile, args)
    opt = optimizer(torch, profile, params)
    T, lnv = profile.context, math.log(profile.vocab)
    print(f"# {'step':>5} {'loss':>7} {'floor':>7} {'nocopy':>7} {'gap%':>6} {'copy':>7} "
          f"{'markov':>7} {'s/step':>7}", flush=True)
    window: list[tuple[float, float, float, float, int, float, int]] = []
    t_window = time.perf_counter()
    for s in range(args.steps):
        ids = torch.from_numpy(np.asarray(tokens[T * s:T * s + T + 1], np.int64))
        opt.zero_grad(set_to_none=False)
        ce = forward(ids[:-1], ids[1:])
        ce.mean().backward()
        opt.step()
        ce = ce.detach().numpy().astype(np.float64)
        floor, no_copy, copy, markov = stream.levels(tokens, s)
        window.append((float(ce.mean()), floor, no_copy, float(ce[copy].sum()), int(copy.sum()),
                       float(ce[markov].sum()), int(markov.sum())))
        if (s + 1) % args.every == 0 or s + 1 == args.steps:
            w = np.array(window)
            loss, floor, no_copy = w[:, 0].mean(), w[:, 1].mean(), w[:, 2].mean()
            copy_loss = w[:, 3].sum() / max(w[:, 4].sum(), 1)
            markov_loss = w[:, 5].sum() / max(w[:, 6].sum(), 1)
            rate = (time.perf_counter() - t_window) / len(window)
            gap = (lnv - loss) / (lnv - floor)
            print(f"  {s + 1:>5} {loss:7.4f} {floor:7.4f} {no_copy:7.4f} {100 * gap:6.2f} "
                  f"{copy_loss:7.4f} {markov_loss:7.4f} {rate:7.3f}", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"step": s + 1, "loss": loss, "floor": floor,
                                        "no_copy": no_copy, "gap_closed": gap,
                                        "copy_loss": copy_loss, "markov_loss": markov_loss,
                                        "s_per_step": rate}) + "\n")
            window.clear()
            t_window = time.perf_counter()
    print(f"# wall {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
