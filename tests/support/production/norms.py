"""Oracles of plan/kernels/norms.py's rmsnorm launches — rmsnorm_rows, residual_norm (the split-K
partials added, then the norm), rmsnorm_bwd and rmsnorm_bwd_gain (row programs, then the gain's
column programs) — each the reference stage on the row blocks of the sampled programs."""
from __future__ import annotations

import numpy as np
from tests.support.kernels_support import ssq_parts

from coppelius.plan import reference as ref
from coppelius.plan.ints import cdiv

from tests.support.production.harness import EXACT, T_ELEM, T_GAIN_SUM, T_ULP, oracle
from tests.support.production.programs import rmsnorm_bwd_gain_program, sample, span


def gain_input(case, D: int) -> np.ndarray:
    """A gain near 1 (D,) at g_ptr."""
    return case.input("g_ptr", values=1 + 0.1 * case.rng.standard_normal(D, dtype=np.float32))


def norm_rows(rows: slice, x: np.ndarray, g=None, rstd: str = "rstd_ptr"):
    """h16 = bf(rmsnorm(x)) and its rstd for the rows `rows` (the reference rmsnorm), or with the
    gain g, h16 = bf(final_norm(x, g)) (the head's operand)."""
    if g is None:
        y, r = ref.rmsnorm(x)
    else:
        f = ref.final_norm(x, g)
        y, r = f.hf, f.r
    yield "h16_ptr", (rows,), ref.bf16(y)
    yield rstd, (rows,), r


class _NormRows:
    """A row kernel that writes h16 (T, D) bf16 and rstd (T,) for BLOCK_R rows per program."""

    def outputs(self, case):
        T, D = case.scalar("T"), case.const("D")
        case.output("h16_ptr", (T, D), T_ULP)
        case.output("rstd_ptr", (T,), T_ELEM)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def rows(self, case, pid) -> slice:
        return span(pid, case.const("BLOCK_R"), case.scalar("T"))


@oracle("rmsnorm_rows")
class _RmsnormRows(_NormRows):
    """h16 = bf(rmsnorm(x)) and rstd from x and its producer's partial sums of squares: the
    reference rmsnorm (the MLP sites' norm, formed once for the SwiGLU forward)."""

    def setup(self, case):
        T, D = case.scalar("T"), case.const("D")
        x = case.input("x_ptr", (T, D), scale=3.0)
        case.input("ssq_ptr", values=ssq_parts(x, case.const("SSQ_PARTS")))
        self.outputs(case)

    def expect(self, case, pid):
        rows = self.rows(case, pid)
        yield from norm_rows(rows, case.data["x_ptr"][rows])


@oracle("residual_norm")
class _ResidualNorm(_NormRows):
    """out = x + Σ partials in split order (the mlp down's residual add), then h16 =
    bf(rmsnorm(out)[·g]) and rstd: the reference mlp stage's residual and the norm after it
    (the next layer's qkv norm, or final_norm with g_final)."""

    def setup(self, case):
        T, D, parts = case.scalar("T"), case.const("D"), case.const("PARTS")
        x = case.input("x_ptr", (T, D), scale=3.0)
        total = None
        for p in case.input("part_ptr", (parts, T, D)):
            total = p if total is None else total + p
        case.data["out"] = x + total
        if case.const("HAS_GAIN"):
            gain_input(case, D)
        case.output("out_ptr", (T, D), EXACT)
        self.outputs(case)

    def expect(self, case, pid):
        rows = self.rows(case, pid)
        out = case.data["out"][rows]
        yield "out_ptr", (rows,), out
        yield from norm_rows(rows, out, case.data["g_ptr"] if case.const("HAS_GAIN") else None)


def _norm_inputs(case, T, D):
    """x, its rstd, and dy as DY_PARTS split-K partials (case.data["dy"]: their sum in order)."""
    x = case.input("x_ptr", (T, D), scale=2.0)
    _, r = ref.rmsnorm(x)
    case.input("rstd_ptr", values=r)
    parts = case.input("dy_ptr", (case.const("DY_PARTS"), T, D))
    dy = parts[0]
    for p in parts[1:]:
        dy = dy + p
    case.data["dy"] = dy
    return x


def _rows_expect(case, rows, has_gain, accumulate, write_bf16):
    x, r, dy = case.data["x_ptr"][rows], case.data["rstd_ptr"][rows], case.data["dy"][rows]
    if has_gain:
        dy = dy * case.data["g_ptr"]
    dx = ref.rmsnorm_backward(dy, x * r[:, None], r)
    if accumulate:
        dx = case.data["dx_ptr"][rows] + dx
    yield "dx_ptr", (rows,), dx
    if write_bf16:
        yield "dx16_ptr", (rows,), ref.bf16(dx)


@oracle("rmsnorm_bwd")
class _RmsnormBwd:
    """dx [+]= rmsnorm_backward(dy [·g], x·r, r), dx16 = bf(dx): the reference stage."""

    def setup(self, case):
        T, D = case.scalar("T"), case.const("D")
        has_gain, acc, bf = case.const("HAS_GAIN", "ACCUMULATE", "WRITE_BF16")
        _norm_inputs(case, T, D)
        if has_gain:
            gain_input(case, D)
        if acc:
            case.input("dx_ptr", (T, D))                              # the residual gradient so far
        case.output("dx_ptr", (T, D), T_ELEM)
        if bf:
            case.output("dx16_ptr", (T, D), T_ULP)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        T = case.scalar("T")
        yield from _rows_expect(case, span(pid, case.const("BLOCK_R"), T),
                                *case.const("HAS_GAIN", "ACCUMULATE", "WRITE_BF16"))


@oracle("rmsnorm_bwd_gain")
class _RmsnormBwdGain:
    """Row programs: the gained rmsnorm backward; column programs: dg = Σ_rows dy·y — the
    reference final_norm_backward (the same formula embed_backward uses for dg_embed)."""

    def setup(self, case):
        T, D = case.scalar("T"), case.const("D")
        br, cols = case.const("BLOCK_R", "GAIN_COLS")
        if case.launch.grid[0] != cdiv(T, br) + cdiv(D, cols):
            raise AssertionError(f"{case.launch.kernel}: grid {case.launch.grid} is not "
                                 f"{cdiv(T, br)} row + {cdiv(D, cols)} column programs")
        x = _norm_inputs(case, T, D)
        g = gain_input(case, D)
        y, r = x * case.data["rstd_ptr"][:, None], case.data["rstd_ptr"]
        case.cache["dg"] = ref.final_norm_backward(case.data["dy"], y, r, g)[1]
        case.output("dx_ptr", (T, D), T_ELEM)
        if case.const("WRITE_BF16"):
            case.output("dx16_ptr", (T, D), T_ULP)
        case.output("dg_ptr", (D,), T_GAIN_SUM)

    def programs(self, case):
        rows = cdiv(case.scalar("T"), case.const("BLOCK_R"))
        n = case.launch.grid[0]
        return sample(n, rows - 1, rows, rows + (n - rows) // 2)

    def expect(self, case, pid):
        T, D = case.scalar("T"), case.const("D")
        kind, b = rmsnorm_bwd_gain_program(pid, T, case.const("BLOCK_R"))
        if kind == "rows":
            yield from _rows_expect(case, span(b, case.const("BLOCK_R"), T), True, False,
                                    case.const("WRITE_BF16"))
        else:
            cols = span(b, case.const("GAIN_COLS"), D)
            yield "dg_ptr", (cols,), case.cache["dg"][cols]
