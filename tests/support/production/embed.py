"""Oracles of the embedding launches — embed_fwd (plan/kernels/norms.py: the gathered rows, their
norm, layer 0's attention norm, the rotary table and the next-row links), embed_decay (E's absent
rows) and embed_grad (E's present rows from the in-order sums of dE, and the two gains;
plan/kernels/embed_grad.py) — on the row and vocabulary blocks of the sampled programs."""
from __future__ import annotations

import types

import numpy as np

from coppelius.plan import reference as ref
from coppelius.plan.ints import cdiv

from tests.support.production.harness import EXACT, T_ELEM, T_ULP, oracle
from tests.support.production.learner import Learner
from tests.support.production.norms import gain_input, norm_rows
from tests.support.production.programs import sample, span


def _token_ids(case, T, V, hot):
    """(T,) ids: random, each `hot` token repeated at several rows (first and last row among
    them), and V-1 present: chains for next-row links and multi-row sums."""
    ids = case.rng.integers(0, V, T).astype(np.uint32)
    rows = case.rng.permutation(T)
    k = 0
    for tok in hot:
        n = 2 + int(case.rng.integers(0, 5))
        ids[rows[k:k + n]] = tok
        k += n
    ids[0], ids[T - 1], ids[T // 2] = hot[0], hot[0], V - 1
    return ids


def _next_rows(ids: np.ndarray) -> np.ndarray:
    """next[r] = the next row holding the same id, else T (embed_grad's links, by definition)."""
    T = len(ids)
    out = np.full(T, T, np.int32)
    last: dict[int, int] = {}
    for r in range(T - 1, -1, -1):
        out[r] = last.get(int(ids[r]), T)
        last[int(ids[r])] = r
    return out


@oracle("embed_fwd")
class _EmbedFwd:
    """emb, rstd, x: the reference embed stage; h16, rstd0: the reference rmsnorm of x (layer 0's
    attention norm); rope: the reference rotary tables; next-row links."""

    def setup(self, case):
        T, D, d = case.scalar("T"), case.const("D"), case.const("HEAD_DIM")
        V = case.profile.vocab
        ids = _token_ids(case, T, V, hot=[int(t) for t in case.rng.integers(0, V, 6)])
        case.input("ids_ptr", values=ids)
        case.input("table_ptr", (V, D))
        gain_input(case, D)
        case.cache["next"] = _next_rows(ids)
        case.cache["rope"] = np.concatenate(ref.rotary_tables(
            types.SimpleNamespace(context=T, head_dim=d)), axis=1)
        for name, shape, tol in (("emb_ptr", (T, D), EXACT), ("rstd_ptr", (T,), T_ELEM),
                                 ("x_ptr", (T, D), T_ELEM), ("rope_ptr", (T, d), T_ELEM),
                                 ("next_ptr", (T,), EXACT), ("h16_ptr", (T, D), T_ULP),
                                 ("rstd0_ptr", (T,), T_ELEM)):
            case.output(name, shape, tol)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        rows = span(pid, case.const("BLOCK_R"), case.scalar("T"))
        e = ref.embed(case.data["table_ptr"], case.data["g_ptr"], case.data["ids_ptr"][rows])
        yield "emb_ptr", (rows,), e.e
        yield "rstd_ptr", (rows,), e.r
        yield "x_ptr", (rows,), e.x
        yield "rope_ptr", (rows,), case.cache["rope"][rows]
        yield "next_ptr", (rows,), case.cache["next"][rows]
        yield from norm_rows(rows, e.x, rstd="rstd0_ptr")


def _e_blocks(case, blocks) -> None:
    """Fresh P, M, V of E's vocabulary blocks `blocks` (BLOCK_V rows each) as inputs, keyed E{b}."""
    V, D, bv = case.scalar("V"), case.const("D"), case.const("BLOCK_V")
    for b in blocks:
        rows = span(b, bv, V)
        Learner.planes(case, "e_ptr", rows.start * D, (rows.stop - rows.start) * D, f"E{b}")


def _e_outputs(case) -> None:
    """E's P, M, V planes and the w1 window, declared as outputs."""
    V, D = case.scalar("V"), case.const("D")
    Learner.outputs(case, "e_ptr", (V, D), "E")
    case.output("w1_ptr", (case.const("W1_WORDS"),), EXACT)


def _present_rows(case, rows: slice) -> np.ndarray:
    """The rows of `rows` that some id of the context holds, increasing."""
    ids = case.data["ids_ptr"].astype(np.int64)
    return np.intersect1d(ids, np.arange(rows.start, rows.stop))


def _row_words(case, rows: slice, pick: np.ndarray, values: np.ndarray):
    """(key, index, value) of E's rows `pick` (a subset of `rows`, values (len(rows), D)) in the
    w1 window: one region per row that the window reaches."""
    D, w1 = case.const("D", "W1_WORDS")
    for r in pick:
        words = slice(int(r) * D, min((int(r) + 1) * D, w1))
        if words.start < words.stop:
            yield "w1_ptr", (words,), values[r - rows.start][:words.stop - words.start]


def _e_rows(case, key: str, rows: slice, pick: np.ndarray, g: np.ndarray):
    """E's P, M, V rows `pick` (a subset of block `rows`) by the reference learner (decayed) on
    the block's gradient g (len(rows), D) and planes `key`, and their w1 words (g itself)."""
    new = [x.reshape(-1, case.const("D")) for x in Learner.update(case, key, g, True)]
    for r in pick:
        for name, x in zip("PMV", new):
            yield "E" + name, (slice(int(r), int(r) + 1),), x[r - rows.start][None]
    yield from _row_words(case, rows, pick, g)


@oracle("embed_decay")
class _EmbedDecay:
    """E's absent rows (no id of the context holds them): the reference learner with g = 0
    (decayed), their w1 words zero; the present rows and their w1 words untouched (watched).
    Program pid runs vocabulary blocks pid, pid + programs, …; only the sampled programs' blocks
    of the planes are written as inputs."""

    def setup(self, case):
        T, V = case.scalar("T", "V")
        bv = case.const("BLOCK_V")
        n, blocks = case.launch.grid[0], cdiv(V, bv)
        if n > blocks:
            raise AssertionError(f"{case.launch.kernel}: grid {n} for {blocks} vocabulary blocks")
        Learner.start(case)
        case.hint = sample(n)
        case.cache["blocks"] = {pid: list(range(pid, blocks, n)) for pid in case.hint}
        mine = [b for pid in case.hint for b in case.cache["blocks"][pid]]
        # a few present rows in blocks the sampled programs run (the first block among them,
        # which the w1 window covers): both kinds of row in one block
        hot = [min(int(b * bv + case.rng.integers(0, bv)), V - 1) for b in mine[::7] + [0]]
        case.input("ids_ptr", values=_token_ids(case, T, V, hot))
        _e_blocks(case, mine)
        _e_outputs(case)

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        V = case.scalar("V")
        D, bv = case.const("D", "BLOCK_V")
        for b in case.cache["blocks"][pid]:
            rows = span(b, bv, V)
            absent = np.setdiff1d(np.arange(rows.start, rows.stop), _present_rows(case, rows))
            zero = np.zeros((rows.stop - rows.start, D), np.float32)
            yield from _e_rows(case, f"E{b}", rows, absent, zero)


@oracle("embed_grad")
class _EmbedGrad:
    """dE rows = Σ de over the rows holding each id, increasing row order (np.add.at, sequential:
    the reference embed_backward's sum); w1 = dE's first W1_WORDS words of the present rows; E's
    present rows of P, M, V: the reference learner on those sums (decayed); the absent rows and
    their w1 words untouched (watched: embed_decay's); the last program: the two gains from dgain
    (not decayed).  Only the sampled programs' rows of the planes are written as inputs."""

    def setup(self, case):
        T, V = case.scalar("T", "V")
        D, bv = case.const("D", "BLOCK_V")
        n = case.launch.grid[0]
        if n != cdiv(V, bv) + 1:
            raise AssertionError(f"{case.launch.kernel}: grid {n} is not cdiv({V}, {bv}) + 1")
        Learner.start(case)
        case.hint = sample(n)
        hot = [min(int(p * bv + case.rng.integers(0, bv)), V - 1) for p in case.hint[:-1]
               for _ in range(3)]
        ids = _token_ids(case, T, V, hot)
        case.input("ids_ptr", values=ids)
        case.input("next_ptr", values=_next_rows(ids))
        case.input("de_ptr", (T, D))
        case.input("dgain_ptr", (2, D), scale=1e-3)
        _e_blocks(case, case.hint[:-1])
        for g in ("gain0_ptr", "gain1_ptr"):
            Learner.planes(case, g, 0, D, g)
            Learner.outputs(case, g, (D,), g)
        _e_outputs(case)

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        V = case.scalar("V")
        D, bv = case.const("D", "BLOCK_V")
        if pid == cdiv(V, bv):
            for i, g in enumerate(("gain0_ptr", "gain1_ptr")):
                new = Learner.update(case, g, case.data["dgain_ptr"][i], False)
                for name, want in zip("PMV", new):
                    yield g + name, (slice(0, D),), want
            return
        rows = span(pid, bv, V)
        ids = case.data["ids_ptr"].astype(np.int64)
        want = np.zeros((rows.stop - rows.start, D), np.float32)
        hit = np.flatnonzero((ids >= rows.start) & (ids < rows.stop))    # increasing rows
        np.add.at(want, ids[hit] - rows.start, case.data["de_ptr"][hit])
        yield from _e_rows(case, f"E{pid}", rows, _present_rows(case, rows), want)
