"""Oracles of plan/kernels/matmul.py's launches — matmul (its epilogues and split-K partials) and
the fused forms: residual + Σ out², rotary, SwiGLU, delta — each the reference stage on exactly
the tiles the sampled programs own (the corner tiles and a ragged group's first, of the first and
the last K split)."""
from __future__ import annotations

import types

import numpy as np

from coppelius.plan import reference as ref
from coppelius.plan.kernels import meta
from coppelius.plan.ints import cdiv

from tests.support.production.harness import T_DELTA, T_ELEM, T_SAME, T_ULP, T_Z16, oracle
from tests.support.production.programs import matmul_pid, matmul_split, matmul_tile, sample, span


def _splits(case) -> int:
    return dict(case.launch.constexprs).get("SPLIT_K", 1)


def _matmul_dims(case):
    M, N, K = case.scalar("M", "N", "K")
    bm, bn, g = case.const("BLOCK_M", "BLOCK_N", "GROUP_M")
    tiles = cdiv(M, bm) * cdiv(N, bn) * _splits(case)
    if tuple(case.launch.grid) != (tiles, 1, 1):
        raise AssertionError(f"{case.launch.kernel}: grid {case.launch.grid} but {M}×{N} in "
                             f"{bm}×{bn} tiles × {_splits(case)} K splits is {tiles} programs")
    return M, N, K, bm, bn, g


def _matmul_programs(case):
    """The corner tiles (and a ragged group's first) of the first and the last K split."""
    M, N, _, bm, bn, g = _matmul_dims(case)
    tm, tn = cdiv(M, bm), cdiv(N, bn)
    corners = [matmul_pid(pm, pn, M, N, bm, bn, g) for pm, pn in
               ((tm - 1, tn - 1), (0, tn - 1), (tm - 1, 0), (tm - 1 - (tm - 1) % g, 0))]
    last = (_splits(case) - 1) * tm * tn
    return sample(tm * tn * _splits(case), *corners, *(last + c for c in corners))


def _tile(case, pid):
    M, N, _, bm, bn, g = _matmul_dims(case)
    pm, pn = matmul_tile(pid % (cdiv(M, bm) * cdiv(N, bn)), M, N, bm, bn, g)
    return pn, span(pm, bm, M), span(pn, bn, N)


class _Tiles:
    """A matmul-family oracle: its programs are _matmul_programs' sample of the tiles."""

    def programs(self, case):
        return _matmul_programs(case)


def _h16_input(case, M: int, K: int) -> np.ndarray:
    """A residual x (M, K) of the oracle's and, at h16_ptr, the bf16 rows of rmsnorm(x) the norm
    before the matmul writes; returns x."""
    x = 2.0 * case.rng.standard_normal((M, K), dtype=np.float32)
    case.input("h16_ptr", values=ref.bf16(ref.rmsnorm(x)[0]))
    return x


@oracle("matmul")
class _Matmul(_Tiles):
    """c = epilogue(bf(A) @ bf(B)) (plan/kernels/matmul.py); the oracle is that formula with the
    reference's bf16, epilogues as NUMERICS writes them (out_proj, mlp_backward)."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        a_t, b_t, epi = case.const("A_T", "B_T", "EPILOGUE")
        a = case.input("a_ptr", (K, M) if a_t else (M, K))
        b = case.input("b_ptr", (N, K) if b_t else (K, N), scale=0.1)
        case.cache["A"] = a.T if a_t else a                           # (M, K)
        case.cache["B"] = b.T if b_t else b                           # (K, N)
        if epi == meta.EPI_RESIDUAL:
            case.input("aux_ptr", (M, N))
        if epi == meta.EPI_SWIGLU_BWD:
            case.input("aux_ptr", (M, 2 * N))                         # [a | b] of the forward
            case.output("c_ptr", (M, 2 * N), T_ULP)
        elif _splits(case) > 1:                                       # (splits, M, N) partials
            case.output("c_ptr", (_splits(case), M, N), T_SAME)
        else:
            case.output("c_ptr", (M, N), T_ULP if epi == meta.EPI_BF16 else T_SAME)

    def expect(self, case, pid):
        _, rows, cols = _tile(case, pid)
        N = case.scalar("N")
        epi = case.const("EPILOGUE")
        A, B = case.cache["A"], case.cache["B"]
        if _splits(case) > 1:                # partial `split` of the K chunks it owns
            M, K = case.scalar("M", "K")
            bm, bn, bk = case.const("BLOCK_M", "BLOCK_N", "BLOCK_K")
            _, ks, split = matmul_split(pid, M, N, K, bm, bn, bk, _splits(case))
            yield "c_ptr", (split, rows, cols), ref.bf16(A[rows, ks]) @ ref.bf16(B[ks, cols])
            return
        acc = ref.bf16(A[rows]) @ ref.bf16(B[:, cols])
        if epi == meta.EPI_F32:
            yield "c_ptr", (rows, cols), acc
        elif epi == meta.EPI_BF16:
            yield "c_ptr", (rows, cols), ref.bf16(acc)
        elif epi == meta.EPI_RESIDUAL:
            yield "c_ptr", (rows, cols), case.data["aux_ptr"][rows, cols] + acc
        elif epi == meta.EPI_SWIGLU_BWD:
            ab = case.data["aux_ptr"]
            a, b = ab[rows, cols], ab[rows, N + cols.start:N + cols.stop]
            one = np.float32(1)
            with np.errstate(over="ignore"):
                ea = one + np.exp(-a)
            sig = one / ea
            da = acc * b * (sig * (one + a * (one - sig)))            # NUMERICS mlp_backward
            db = acc * (a / ea)
            yield "c_ptr", (rows, cols), ref.bf16(da)
            yield "c_ptr", (rows, slice(N + cols.start, N + cols.stop)), ref.bf16(db)
        else:
            raise AssertionError(f"{case.launch.kernel}: no oracle for EPILOGUE={epi}")


@oracle("matmul_residual")
class _MatmulResidual(_Tiles):
    """out = x + bf(A) @ bf(B)ᵀ (the reference out_proj / mlp's residual add) and each column
    tile's per-row Σ out² (of the oracle's out: ELEMENTWISE)."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        case.input("a_ptr", (M, K))
        case.input("b_ptr", (N, K), scale=0.1)
        case.input("x_ptr", (M, N))
        case.output("out_ptr", (M, N), T_SAME)
        case.output("ssq_ptr", (cdiv(N, case.const("BLOCK_N")), M), T_ELEM)

    def expect(self, case, pid):
        pn, rows, cols = _tile(case, pid)
        d = case.data
        out = d["x_ptr"][rows, cols] + ref.bf16(d["a_ptr"][rows]) @ ref.bf16(d["b_ptr"][cols]).T
        yield "out_ptr", (rows, cols), out
        yield "ssq_ptr", (pn, rows), (out * out).sum(1, dtype=np.float32)


@oracle("matmul_rotary")
class _MatmulRotary(_Tiles):
    """qkv16 = bf(rotary(h16 @ bf(W)ᵀ)), h16 the norm's bf16 rows: reference qkv then rotary on
    q and k heads."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        d = case.const("HEAD_DIM")
        _h16_input(case, M, K)
        case.input("w_ptr", (N, K))
        cos, sin = ref.rotary_tables(types.SimpleNamespace(context=M, head_dim=d))
        case.input("rope_ptr", values=np.concatenate([cos, sin], axis=1))
        case.output("qkv_ptr", (M, N), T_ULP)

    def expect(self, case, pid):
        _, rows, cols = _tile(case, pid)
        d, rotated = case.const("HEAD_DIM", "ROTATED")
        M = case.scalar("M")
        acc = case.data["h16_ptr"][rows] @ ref.bf16(case.data["w_ptr"][cols]).T
        cos, sin = ref.rotary_tables(types.SimpleNamespace(context=M, head_dim=d))
        out = acc.copy()
        for j in range((cols.stop - cols.start) // d):
            if cols.start // d + j < rotated:
                out[:, j * d:(j + 1) * d] = ref.rotary(acc[:, j * d:(j + 1) * d], cos[rows], sin[rows])
        yield "qkv_ptr", (rows, cols), ref.bf16(out)


@oracle("matmul_swiglu")
class _MatmulSwiglu(_Tiles):
    """ab = [a | b], z16 = bf(silu(a)·b) from h16 = bf(rmsnorm(x)): the reference mlp stage on the
    tile (x is the oracle's; the kernel reads the bf16 rows rmsnorm_rows would write)."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        case.cache["x"] = _h16_input(case, M, K)
        case.input("wg_ptr", (N, K), scale=0.1)
        case.input("wu_ptr", (N, K), scale=0.1)
        case.output("ab_ptr", (M, 2 * N), T_ULP)
        case.output("z_ptr", (M, N), T_Z16)

    def expect(self, case, pid):
        pn, rows, cols = _tile(case, pid)
        N, K = case.scalar("N", "K")
        no_down = np.zeros((K, cols.stop - cols.start), np.float32)   # the oracle's, not an input
        m = ref.mlp(case.cache["x"][rows], case.data["wg_ptr"][cols], case.data["wu_ptr"][cols],
                    no_down)
        yield "ab_ptr", (rows, cols), m.a
        yield "ab_ptr", (rows, slice(N + cols.start, N + cols.stop)), m.b
        yield "z_ptr", (rows, cols), ref.bf16(m.z)


@oracle("matmul_delta")
class _MatmulDelta(_Tiles):
    """dO = bf(dres) @ bf(Wo) (reference out_proj_backward) and delta = Σ_d dO·o per head."""

    def setup(self, case):
        M, N, K, *_ = _matmul_dims(case)
        d = case.const("HEAD_DIM")
        case.input("a_ptr", (M, K))
        case.input("b_ptr", (K, N), scale=0.1)                        # Wo (D, H·d) = (K, N)
        case.input("o_ptr", (M, N))
        case.output("do_ptr", (M, N), T_SAME)
        case.output("delta_ptr", (N // d, M), T_DELTA)

    def expect(self, case, pid):
        _, rows, cols = _tile(case, pid)
        d = case.const("HEAD_DIM")
        o = case.data["o_ptr"][rows, cols]
        do, _ = ref.out_proj_backward(case.data["a_ptr"][rows], o, case.data["b_ptr"][:, cols])
        yield "do_ptr", (rows, cols), do
        for j in range((cols.stop - cols.start) // d):
            head = cols.start // d + j
            delta = (do[:, j * d:(j + 1) * d] * o[:, j * d:(j + 1) * d]).sum(-1, dtype=np.float32)
            yield "delta_ptr", (head, rows), delta
