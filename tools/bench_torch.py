"""Side-by-side benchmark: Coppelius against the same model and learner in PyTorch, same GPU, same run.

PyTorch variants: eager, torch.compile, and torch.compile with CUDA graphs ("reduce-overhead").
All start from the same initial weights (the fresh initialization of SPEC §4, or a checkpoint), train
on the same contexts with the same AdamW, and report ms/step p50, tokens/s, ratio to Coppelius and the
agreement of the first steps' losses.

  python tools/bench_torch.py --profile coppelius --steps 200               # on a GPU machine
  python tools/bench_torch.py --profile tiny --steps 3 --backend interpret \
      --device cpu --variants eager                                         # CPU dry run of the logic
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plan import profiles, reference  # noqa: E402


def build_torch_model(torch, profile, P: np.ndarray, device: str):
    """Parameters as leaf tensors named like the P plane; a functional forward returning ce rows."""
    import torch.nn.functional as F

    planes = reference.unflatten(profile, P)
    params = {name: torch.nn.Parameter(torch.from_numpy(np.array(planes[name])).to(device))
              for name, _shape, _off in profile.parameters}
    cos, sin = reference.rotary_tables(profile)
    cos = torch.from_numpy(np.concatenate([cos, cos], 1)).to(device)      # (T, d)
    sin = torch.from_numpy(np.concatenate([sin, sin], 1)).to(device)      # (T, d)
    H, G, d, T = profile.heads, profile.kv_heads, profile.head_dim, profile.context
    use_bf16 = device != "cpu"

    def rms(x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def rot(x):                                                          # (heads, T, d)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def mm(a, w):
        if use_bf16:
            return (a.to(torch.bfloat16) @ w.to(torch.bfloat16).t()).float()
        return a @ w.t()

    def forward(inputs, targets):
        x = rms(F.embedding(inputs, params["embed"])) * params["g_embed"]
        for i in range(profile.layers):
            p = lambda n: params[f"layers.{i}.{n}"]  # noqa: E731
            h = rms(x)
            q = mm(h, p("wq")).view(T, H, d).transpose(0, 1)
            k = mm(h, p("wk")).view(T, G, d).transpose(0, 1)
            v = mm(h, p("wv")).view(T, G, d).transpose(0, 1)
            q, k = rot(q), rot(k)
            k = k.repeat_interleave(H // G, 0)
            v = v.repeat_interleave(H // G, 0)
            dt = torch.bfloat16 if use_bf16 else torch.float32
            o = F.scaled_dot_product_attention(q.to(dt)[None], k.to(dt)[None], v.to(dt)[None],
                                               is_causal=True)[0].float()
            x = x + mm(o.transpose(0, 1).reshape(T, H * d), p("wo"))
            h = rms(x)
            x = x + mm(F.silu(mm(h, p("wgate"))) * mm(h, p("wup")), p("wdown"))
        logits = mm(rms(x) * params["g_final"], params["head"])
        return F.cross_entropy(logits, targets, reduction="none")

    return params, forward


def make_optimizer(torch, profile, params, device):
    lr = profile.learner
    decay = [params[p.name] for p in profile.parameters if p.decay]
    plain = [params[p.name] for p in profile.parameters if not p.decay]
    kw = dict(lr=float(lr.lr), betas=(float(lr.beta1), float(lr.beta2)), eps=float(lr.epsilon))
    if device != "cpu":
        kw["fused"] = True
    return torch.optim.AdamW([{"params": decay, "weight_decay": float(lr.decay)},
                              {"params": plain, "weight_decay": 0.0}], **kw)


def bench_torch_variant(torch, variant, profile, P0, contexts, device, warmup):
    params, forward = build_torch_model(torch, profile, P0, device)
    opt = make_optimizer(torch, profile, params, device)

    def step(inputs, targets):
        opt.zero_grad(set_to_none=False)
        ce = forward(inputs, targets)
        ce.mean().backward()
        opt.step()
        return ce.detach()

    if variant == "compile":
        step = torch.compile(step)
    elif variant == "compile+cudagraphs":
        step = torch.compile(step, mode="reduce-overhead")
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    losses, times = [], []
    # warm-up steps train too: they come first and are counted in the loss agreement
    for i, (inp, tgt) in enumerate(contexts):
        inp_t = torch.from_numpy(inp.astype(np.int64)).to(device)
        tgt_t = torch.from_numpy(tgt.astype(np.int64)).to(device)
        sync()
        t = time.perf_counter()
        ce = step(inp_t, tgt_t)
        sync()
        dt = time.perf_counter() - t
        losses.append(float(ce.double().mean()))
        if i >= warmup:
            times.append(dt)
    return losses, times


def bench_coppelius(profile, tokens, steps, backend, workdir: Path):
    from host.result_file import read
    from host.run import Request, run
    ckpt = workdir / "bench.ckpt"
    ckpt.write_bytes(b"")
    result = workdir / "bench-result.bin"
    t = time.perf_counter()
    summary = run(Request(profile=profile, tokens=tokens, checkpoint=ckpt, result=result,
                          backend=backend, steps=steps, directory=workdir))
    wall = time.perf_counter() - t
    rf = read(result)
    ts = rf.timestamps
    upd = ts[ts["submission"] == 1]
    device_ms = (upd["device_final_ns"].astype(np.int64) - upd["device_prelaunch_ns"].astype(np.int64)) / 1e6
    fence_ms = np.diff(upd["host_fence_ns"].astype(np.int64)) / 1e6
    return summary, device_ms, fence_ms, wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="coppelius")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10, help="steps excluded from the timing")
    ap.add_argument("--tokens", type=Path, help="token cache (default: the embedded stream)")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "interpret"])
    ap.add_argument("--device", default="cuda", help="torch device (cuda or cpu)")
    ap.add_argument("--variants", default="eager,compile,compile+cudagraphs")
    ap.add_argument("--agree-steps", type=int, default=5, help="steps whose losses are compared")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)

    import torch
    from rich.console import Console
    from rich.table import Table
    from staging import synthetic
    from staging.tokens import TokenCache

    console = Console()
    profile = profiles.get(args.profile)
    steps = min(args.steps, profile.steps)
    warmup = min(args.warmup, max(steps - 1, 0))
    with tempfile.TemporaryDirectory(prefix="coppelius-bench-") as tmp:
        workdir = Path(tmp)
        tokens = args.tokens or synthetic.ensure_default_stream(profile, Path(synthetic.DEFAULT_DIRECTORY))
        cache = TokenCache.open(tokens, profile)
        cache.validate_run(0, steps)
        contexts = [tuple(np.asarray(a) for a in cache.context(c)) for c in range(steps)]

        summary, device_ms, fence_ms, wall = bench_coppelius(profile, tokens, steps, args.backend,
                                                             workdir)
        cop_losses = summary.losses
        timed = device_ms[warmup:] if len(device_ms) > warmup else device_ms
        cop_p50 = float(np.median(fence_ms[warmup:])) if len(fence_ms) > warmup else float(np.median(timed))
        rows = [("coppelius (" + args.backend + ")", cop_p50, float(np.median(timed)))]
        P0 = reference.init_parameters(profile)
        agreement = {}
        for variant in [v for v in args.variants.split(",") if v]:
            losses, times = bench_torch_variant(torch, variant, profile, P0, contexts,
                                                args.device, warmup)
            rows.append((f"torch {variant} ({args.device})", statistics.median(times) * 1e3, None))
            k = min(args.agree_steps, len(losses), len(cop_losses))
            agreement[variant] = max(abs(a - b) for a, b in zip(losses[:k], cop_losses[:k]))

    T = profile.context
    table = Table(title=f"{profile.name}: {steps} steps, p50 after {warmup} warm-up steps")
    for col in ("what", "ms/step p50 (host, fence to fence)", "device ms/step p50", "tokens/s",
                "ratio to coppelius"):
        table.add_column(col, justify="right")
    for name, ms, dev in rows:
        table.add_row(name, f"{ms:.3f}", "—" if dev is None else f"{dev:.3f}",
                      f"{T / (ms / 1e3):,.0f}", f"{ms / rows[0][1]:.2f}×")
    console.print(table)
    for variant, d in agreement.items():
        console.print(f"loss agreement, first {args.agree_steps} steps, torch {variant}: "
                      f"max |Δ mean ce| = {d:.2e}")
    if args.json:
        args.json.write_text(json.dumps({
            "profile": profile.name, "steps": steps, "warmup": warmup,
            "rows": [{"what": n, "ms_p50": m, "device_ms_p50": d} for n, m, d in rows],
            "agreement": agreement, "coppelius_losses": cop_losses[:args.agree_steps]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
