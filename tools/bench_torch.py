"""Side by side: Coppelius against the same model and learner in PyTorch, on the same device.

Same initial weights (the fresh initialization of CONTRACT §4), the same contexts (the token cache's
first steps), the same AdamW (torch's fused AdamW with the profile's hyper-parameters), bf16
operands with fp32 accumulation.  Variants: `eager`, `reduce-overhead` (torch.compile with CUDA
graphs) and `default` (torch.compile's default mode).

Timed the same way on both sides, after `--warmup` steps, as medians:
  fence to fence — host time between two consecutive steps' completions (Coppelius: host_fence_ns
      of consecutive updates in the result's timestamp table; torch: perf_counter after
      torch.cuda.synchronize() following each step);
  device — events around each step (Coppelius: its pre-launch and final releases' globaltimer
      stamps; torch: a torch.cuda.Event pair), on a GPU only.
The ratio is torch over Coppelius.  A compiled variant's compile time is reported apart: its
warm-up steps' wall time beyond `warmup` steady steps.  Loss agreement: max |Δ mean ce| over the
first `--agree-steps` steps.

  python3 -m tools.bench_torch --result RUN.bin --steps 200 --json bench.json      # on a GPU
  python -m tools.bench_torch --result tests/golden/tiny-result-c0.bin --device cpu \
      --steps 4 --warmup 1 --variants eager                                        # on the CPU

Without `--result` the Coppelius side is run here first (`--backend`, `--profile`, `--steps`).
`--json` is written as the bench goes: `stage` says what it is doing ("done" at the end) and
`rows` holds every row finished, so a bench stopped from outside still leaves them.
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

from coppelius.plan import profiles, reference

VARIANTS = {"eager": None, "reduce-overhead": "reduce-overhead", "default": "default"}
AGREE_ATOL = 1e-2       # max |Δ mean ce| over the first steps: same model, different rounding points
TIMING = ("fence to fence: host time between consecutive step completions (Coppelius: host_fence_ns "
          "of consecutive updates; torch: perf_counter after torch.cuda.synchronize()); device: "
          "events around each step (Coppelius: pre-launch and final release globaltimer stamps; "
          "torch: torch.cuda.Event pairs)")


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

    def rms(x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    def rot(x):                                                          # (heads, T, d)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def mm(a, w):                          # bf16 operands, fp32 accumulation and result
        return (a.to(torch.bfloat16) @ w.to(torch.bfloat16).t()).float()

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
            bf = torch.bfloat16
            o = F.scaled_dot_product_attention(q.to(bf)[None], k.to(bf)[None], v.to(bf)[None],
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


def _p50(xs) -> float | None:
    return float(statistics.median(xs)) if len(xs) else None


def bench_torch_variant(torch, variant, profile, P0, contexts, device, warmup, agree_steps,
                        compile_backend="inductor", stage=lambda text: None):
    """-> {losses (first agree_steps), fence_ms, device_ms (per timed step), compile_s, ...};
    `stage(text)` is told what the loop is doing (the first step: the compile; then the timed
    steps)."""
    params, forward = build_torch_model(torch, profile, P0, device)
    opt = make_optimizer(torch, profile, params, device)

    def step(inputs, targets):
        opt.zero_grad(set_to_none=False)
        ce = forward(inputs, targets)
        ce.mean().backward()
        opt.step()
        return ce.detach()

    mode = VARIANTS[variant]
    if mode is not None:
        # `mode` configures inductor; another backend (the CPU dry run's aot_eager) takes none
        kw = {"mode": mode} if compile_backend == "inductor" else {}
        step = torch.compile(step, backend=compile_backend, **kw)
    cuda = device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    losses, walls, fence, dev = [], [], [], []
    sync()
    last = time.perf_counter()
    for i, (inp, tgt) in enumerate(contexts):
        if i in (0, warmup):
            stage(f"{variant}: step {i + 1} of {len(contexts)} ("
                  + ("the first: compiling" if i == 0 and mode is not None else
                     "the first" if i == 0 else "timed steps from here") + ")")
        inp_t = torch.from_numpy(inp.astype(np.int64)).to(device)
        tgt_t = torch.from_numpy(tgt.astype(np.int64)).to(device)
        if cuda:
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
        ce = step(inp_t, tgt_t)
        if cuda:
            ev[1].record()
        sync()
        now = time.perf_counter()
        walls.append(now - last)
        if i >= warmup:
            fence.append((now - last) * 1e3)
            if cuda:
                dev.append(ev[0].elapsed_time(ev[1]))
        if i < agree_steps:             # read back inside the warm-up: not in the timed steps
            losses.append(float(ce.double().mean()))
        last = time.perf_counter() if i < agree_steps else now
    p50 = _p50(fence)
    compile_s = None
    if mode is not None and p50 is not None:
        compile_s = max(0.0, sum(walls[:warmup]) - warmup * p50 / 1e3)
    return {"losses": losses, "fence_ms": fence, "device_ms": dev, "ms_p50": p50,
            "device_ms_p50": _p50(dev), "compile_s": compile_s, "first_step_s": walls[0]}


def coppelius_figures(result: Path, warmup: int, steps: int) -> dict:
    """The Coppelius side from a result file: per-step losses and the timestamp table's times."""
    from coppelius.results.reader import read
    rf = read(result)
    if int(rf.status["c0"]) != 0:
        raise SystemExit(f"{result}: continued from update {int(rf.status['c0'])}; the side by "
                         "side starts from the fresh initialization (c0 = 0)")
    if rf.steps < steps:
        raise SystemExit(f"{result}: {rf.steps} steps, {steps} asked")
    u = rf.update_entries()[:steps]
    device_ms = (u["device_final_ns"].astype(np.int64) - u["device_prelaunch_ns"].astype(np.int64)) / 1e6
    fence_ms = np.diff(u["host_fence_ns"].astype(np.int64)) / 1e6       # (steps-1,) fence i-1 → i
    from coppelius.staging import records as R
    return {"profile": rf.profile.name, "backend": R.BACKENDS.get(int(rf.status["backend"]), "?"),
            "losses": [float(x) for x in rf.step_losses()[:steps]],
            "ms_p50": _p50(fence_ms[max(warmup - 1, 0):]),
            "device_ms_p50": _p50(device_ms[warmup:]), "source": str(result)}


def run_coppelius(profile, tokens, steps, backend, workdir: Path,
                  fence_timeout_s: float | None = None) -> Path:
    from coppelius.run.loop import Request, run
    ckpt = workdir / "bench.ckpt"
    ckpt.write_bytes(b"")
    result = workdir / "bench-result.bin"
    extra = {} if fence_timeout_s is None else {"fence_timeout_s": fence_timeout_s}
    run(Request(profile=profile, tokens=tokens, checkpoint=ckpt, result=result, backend=backend,
                steps=steps, directory=workdir, **extra))
    return result


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


class JsonOut:
    """The --json file, rewritten (atomically) at every stage: a bench stopped from outside leaves
    the rows it finished and `stage`, what it was doing; "done" once complete."""

    def __init__(self, path: Path | None, head: dict):
        self.path = path
        self.doc = {**head, "stage": "starting", "rows": []}
        self.write()

    def stage(self, text: str, **fields) -> None:
        self.doc.update(stage=text, **fields)
        self.write()

    def write(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".partial")
        tmp.write_text(json.dumps(self.doc, indent=1))
        tmp.replace(self.path)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--result", type=Path, help="a finished Coppelius run from the fresh "
                    "initialization on the embedded stream (default: run one here)")
    ap.add_argument("--profile", default="coppelius", help="without --result: what to run")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10, help="steps excluded from the timing")
    ap.add_argument("--tokens", type=Path, help="token cache (default: the embedded stream)")
    ap.add_argument("--directory", type=Path, help="where the embedded stream is cached "
                    "(default: a temporary directory)")
    ap.add_argument("--backend", default="cuda", choices=["cuda", "interpret"])
    ap.add_argument("--fence-timeout", type=float, default=None, metavar="S",
                    help="without --result: seconds the Coppelius run waits for a fence")
    ap.add_argument("--device", default="cuda", help="torch device (cuda or cpu)")
    ap.add_argument("--variants", default="eager,reduce-overhead",
                    help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend (the CPU dry run uses aot_eager: no C compiler)")
    ap.add_argument("--agree-steps", type=int, default=5, help="steps whose losses are compared")
    ap.add_argument("--json", type=Path, help="write the figures here too (as the bench goes)")
    args = ap.parse_args(argv)
    args.variant_list = [v for v in args.variants.split(",") if v]
    for v in args.variant_list:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}: one of {', '.join(VARIANTS)}")
    return args


def coppelius_side(args, out: JsonOut):
    """(profile, steps, warmup, agree, contexts, the Coppelius figures): from --result, or from a
    run made here first."""
    from coppelius.staging import synthetic
    from coppelius.staging.tokens import TokenCache
    with tempfile.TemporaryDirectory(prefix="coppelius-bench-") as tmp:
        workdir = Path(tmp)
        if args.result is not None:
            from coppelius.results.reader import read
            profile = profiles.get(read(args.result).profile.name)
        else:
            profile = profiles.get(args.profile)
        steps = min(args.steps, profile.steps)
        warmup = min(args.warmup, max(steps - 1, 0))
        agree = min(args.agree_steps, steps)
        tokens = args.tokens or synthetic.ensure_default_stream(profile, args.directory or workdir)
        cache = TokenCache.open(tokens, profile)
        cache.validate_run(0, steps)
        contexts = [tuple(np.asarray(a) for a in cache.context(c)) for c in range(steps)]
        if args.result is None:
            out.stage(f"coppelius: running {steps} steps on {args.backend}")
        result = args.result or run_coppelius(profile, tokens, steps, args.backend, workdir,
                                              args.fence_timeout)
        cop = coppelius_figures(result, warmup, steps)
    return profile, steps, warmup, agree, contexts, cop


def print_table(rows, profile, steps, warmup, agree, agreement) -> float:
    """The side-by-side table on stdout; returns the worst loss disagreement."""
    from rich.console import Console
    from rich.table import Table
    console = Console()
    T = profile.context
    table = Table(title=f"{profile.name}: {steps} steps, p50 after {warmup} warm-up steps")
    for col in ("what", "ms f2f p50", "ms device p50", "tokens/s", "ratio", "compile s",
                "|Δ loss|"):
        table.add_column(col, justify="right")

    def f(x, spec):
        return "—" if x is None else format(x, spec)
    for r in rows:
        table.add_row(r["what"], f(r["ms_p50"], ".3f"), f(r["device_ms_p50"], ".3f"),
                      f(T / (r["ms_p50"] / 1e3) if r["ms_p50"] else None, ",.0f"),
                      f(r["ratio"], ".2f"), f(r["compile_s"], ".1f"), f(r.get("agreement"), ".1e"))
    console.print(table)
    console.print(f"timing — {TIMING}")
    worst = max(agreement.values(), default=0.0)
    console.print(f"loss agreement over the first {agree} steps: max |Δ mean ce| = {worst:.2e} "
                  f"(bound {AGREE_ATOL:g})")
    return worst


def main(argv=None) -> int:
    args = parse(argv)
    out = JsonOut(args.json, {"device": args.device, "compile_backend": args.compile_backend,
                              "timing": TIMING, "agreement_atol": AGREE_ATOL, "agreement": {}})
    out.stage("importing torch")
    import torch
    out.doc["torch"] = torch.__version__
    out.stage("the Coppelius side")
    profile, steps, warmup, agree, contexts, cop = coppelius_side(args, out)
    P0 = reference.init_parameters(profile)
    rows = out.doc["rows"]
    rows.append({"what": f"coppelius ({cop['backend']})", "variant": "coppelius",
                 "ms_p50": cop["ms_p50"], "device_ms_p50": cop["device_ms_p50"], "ratio": 1.0,
                 "device_ratio": 1.0 if cop["device_ms_p50"] else None, "compile_s": None})
    agreement = out.doc["agreement"]
    out.stage("coppelius row", profile=profile.name, steps=steps, warmup=warmup, coppelius=cop,
              agree_steps=agree)
    for variant in args.variant_list:
        t = bench_torch_variant(torch, variant, profile, P0, contexts, args.device, warmup, agree,
                                args.compile_backend, stage=out.stage)
        k = min(len(t["losses"]), len(cop["losses"]))
        agreement[variant] = max(abs(a - b) for a, b in zip(t["losses"][:k], cop["losses"][:k]))
        device_p50 = t["device_ms_p50"] if args.device != "cpu" else None
        rows.append({"what": f"torch {variant} ({args.device})", "variant": variant,
                     "ms_p50": t["ms_p50"], "device_ms_p50": device_p50,
                     "ratio": _ratio(t["ms_p50"], cop["ms_p50"]),
                     "device_ratio": _ratio(device_p50, cop["device_ms_p50"]),
                     "compile_s": t["compile_s"], "first_step_s": t["first_step_s"],
                     "agreement": agreement[variant], "losses": t["losses"]})
        out.stage(f"{variant}: done")
    worst = print_table(rows, profile, steps, warmup, agree, agreement)
    out.stage("done")
    return 0 if worst <= AGREE_ATOL else 1


if __name__ == "__main__":
    sys.exit(main())
