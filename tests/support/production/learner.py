"""The fused AdamW updates: `Learner`, the reference learner on a window of the parameter table
(t = t_base + doorbell, fresh P/M/V written as inputs; the embedding updates use it too), and the
oracle of plan/kernels/weight_grad.py's launch — each product tile's dW, then AdamW on its P, M, V
and the w16 copy, for the tiles the sampled programs loop over."""
from __future__ import annotations

import types

import numpy as np

from coppelius.plan import reference as ref
from coppelius.plan.ints import cdiv

from tests.support.production.harness import T_ADAMW, T_ULP, oracle
from tests.support.production.programs import matmul_pid, matmul_tile, span, weight_grad_program


class Learner:
    """Shared by the fused AdamW oracles: t = t_base + doorbell, fresh P/M/V of a parameter
    window written as inputs, and the reference learner on a window of the parameter table."""
    T_BASE, DOORBELL = 4998, 7

    @classmethod
    def start(cls, case):
        case.run_scalars["t_base"] = cls.T_BASE
        case.input("doorbell_ptr", values=np.array([cls.DOORBELL], np.uint32))

    @staticmethod
    def planes(case, arg: str, at: int, n: int, key: str):
        """Fresh P, M, V of n elements at element `at` of parameter pointer `arg` (P plane;
        M, V NPARAM and 2·NPARAM further), kept as case.data[f"{key}{P|M|V}"]."""
        N = case.scalar("NPARAM")
        # V ≥ 1e-6 ≫ (1 − β2)·g² (≈ 6e-10 for the weight_grad oracle's |g| ≈ 8e-4): a product's
        # gradient differs from numpy's by SAME_OPERANDS (another accumulation order), which
        # step·m/√v would amplify where v ≈ 0; the bit-for-bit check on the same gradient is
        # tests/plan/test_kernels_weight_grad.py's
        vals = (0.02 * case.rng.standard_normal(n, dtype=np.float32),
                1e-3 * case.rng.standard_normal(n, dtype=np.float32),
                1e-6 * (1 + np.abs(case.rng.standard_normal(n, dtype=np.float32))))
        for plane, (name, v) in enumerate(zip("PMV", vals)):
            case.input(arg, values=v, at=plane * N + at, key=f"{key}{name}")

    @classmethod
    def update(cls, case, key: str, g: np.ndarray, decayed: bool):
        """The reference learner's (P, M, V) for planes `key` and gradient g (flat)."""
        n = g.size
        one = types.SimpleNamespace(offset=0, end=n, decay=decayed)
        prof = types.SimpleNamespace(parameter_count=n, learner=case.profile.learner,
                                     parameters=[one])
        d = case.data
        return ref.adamw(prof, d[key + "P"], d[key + "M"], d[key + "V"],
                         np.ascontiguousarray(g, np.float32).reshape(-1), cls.T_BASE + cls.DOORBELL)

    @staticmethod
    def outputs(case, arg: str, shape, prefix: str) -> None:
        N = case.scalar("NPARAM")
        for plane, name in enumerate("PMV"):
            case.output(arg, shape, T_ADAMW, at=plane * N, key=prefix + name)


@oracle("weight_grad")
class _WeightGrad:
    """Product tiles: g = bf(dy)ᵀ @ bf(x) (reference head/mlp/qkv backward's dW), then P, M, V of
    the tile by the reference learner (every matrix decays) and w16 = bf(p).  The sampled
    programs are those that own the products' corner and middle tiles (each program loops over
    tiles pid, pid + programs, …); only their tiles' row blocks of the planes are inputs."""

    def _dims(self, case):
        T, bm, bn = case.scalar("T"), *case.const("BLOCK_M", "BLOCK_N")
        dims = [case.scalar("M0", "N0"), case.scalar("M1", "N1")][:case.const("PRODUCTS")]
        return T, bm, bn, dims, [cdiv(M, bm) * cdiv(N, bn) for M, N in dims]

    def setup(self, case):
        T, bm, bn, dims, tiles = self._dims(case)
        n = case.launch.grid[0]
        if not 1 <= n <= sum(tiles):
            raise AssertionError(f"{case.launch.kernel}: grid {n} for {tiles} tiles")
        Learner.start(case)
        g = case.const("GROUP_M")
        picks, base = [], 0
        for (M, N), t in zip(dims, tiles):
            tm, tn = cdiv(M, bm), cdiv(N, bn)
            corners = {matmul_pid(pm, pn, M, N, bm, bn, g) for pm, pn in
                       ((0, 0), (tm - 1, tn - 1), (0, tn - 1), (tm - 1, 0), (tm // 2, tn // 2))}
            picks += [(base + c) % n for c in corners]
            base += t
        case.hint = sorted(set(picks) | {n - 1})
        for j, (M, N) in enumerate(dims):
            case.input(f"a{j}_ptr", (T, M), scale=0.005)
            case.input(f"b{j}_ptr", (T, N), scale=0.005)
            Learner.outputs(case, f"p{j}_ptr", (M, N), f"W{j}")
            case.output(f"h{j}_ptr", (M, N), T_ULP)
        for pid in case.hint:                    # the sampled programs' tiles' rows of P, M, V
            for j, tile in weight_grad_program(pid, tiles, n):
                M, N = dims[j]
                pm, _ = matmul_tile(tile, M, N, bm, bn, g)
                r = span(pm, bm, M)
                key = f"W{j}rows{r.start}"
                if key + "P" not in case.data:
                    Learner.planes(case, f"p{j}_ptr", r.start * N, (r.stop - r.start) * N, key)

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        T, bm, bn, dims, tiles = self._dims(case)
        for j, tile in weight_grad_program(pid, tiles, case.launch.grid[0]):
            yield from self._tile(case, dims, j, tile, bm, bn)

    def _tile(self, case, dims, j, tile, bm, bn):
        M, N = dims[j]
        pm, pn = matmul_tile(tile, M, N, bm, bn, case.const("GROUP_M"))
        r, c = span(pm, bm, M), span(pn, bn, N)
        grad = ref.bf16(case.data[f"a{j}_ptr"][:, r]).T @ ref.bf16(case.data[f"b{j}_ptr"][:, c])
        key = f"W{j}rows{r.start}"
        d = case.data
        sub = {name: d[key + name].reshape(r.stop - r.start, N)[:, c] for name in "PMV"}
        case.data.update({f"{key}{c.start}{k}": v.reshape(-1) for k, v in sub.items()})
        P2, M2, V2 = Learner.update(case, f"{key}{c.start}", grad, True)
        shape = (r.stop - r.start, c.stop - c.start)
        for name, want in zip("PMV", (P2, M2, V2)):
            yield f"W{j}{name}", (r, c), want.reshape(shape)
        yield f"h{j}_ptr", (r, c), ref.bf16(P2).reshape(shape)
