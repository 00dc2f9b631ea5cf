"""Oracles of plan/kernels/attention.py's launches — the fused forward's (query block, head)
programs, the backward's dK/dV chunks (with the bf(ds)ᵀ tiles) and the dQ / dK / dV merge — each
on the work plan/attention_split.py gives the sampled programs, against the reference attention
computed block by block as the kernels recur."""
from __future__ import annotations

import types

import numpy as np

from coppelius.plan import reference as ref
from coppelius.plan.attention_split import AttentionSplit

from tests.support.production.harness import T_ATT_GRAD, T_ATT_GRAD16, T_ATT_OUT, T_LSE, T_ULP, oracle
from tests.support.production.programs import attention_split_of, sample, span


def _attention_inputs(case):
    T = case.scalar("T")
    H, G, d = case.const("HEADS", "KV_HEADS", "HEAD_DIM")
    qkv = case.input("qkv_ptr", (T, (H + 2 * G) * d))
    q, k, v = qkv[:, :H * d], qkv[:, H * d:(H + G) * d], qkv[:, (H + G) * d:]
    return T, H, G, d, q, k, v


def _lse(q, k, T, H, G, d):
    """(H, T) fp32 log-sum-exp of the causal scores bf(q)bf(k)ᵀ·scale, in float64."""
    scale = float(ref.attention_scale(d))
    causal = np.triu(np.ones((T, T), bool), 1)
    out = np.empty((H, T), np.float32)
    for h in range(H):
        kv = h // (H // G)
        s = (ref.bf16(q[:, h * d:(h + 1) * d]).astype(np.float64)
             @ ref.bf16(k[:, kv * d:(kv + 1) * d]).astype(np.float64).T) * scale
        s[causal] = -np.inf
        m = s.max(-1)
        out[h] = m + np.log(np.exp(s - m[:, None]).sum(-1))
    return out


def _scores(q, k, rows, cols, head, kv, d):
    """s (R, C) fp32 = bf(q)·bf(k)ᵀ·scale of query rows × key cols, −inf above the diagonal."""
    s = (ref.bf16(q[rows, head * d:(head + 1) * d]) @ ref.bf16(k[cols, kv * d:(kv + 1) * d]).T)
    s = s * ref.attention_scale(d)
    r = np.arange(rows.start, rows.stop)[:, None]
    c = np.arange(cols.start, cols.stop)[None, :]
    return np.where(r >= c, s, np.float32(-np.inf)).astype(np.float32)


@oracle("attention_fwd")
class _AttentionFwd:
    """One (query block, head) program over its whole causal range: the flash recurrence key
    block by key block (the launch's BLOCK_N rows) with the running max m (p is rounded against
    it: NUMERICS.md's one ulp of p), then o = acc / l (o32, o16) and lse = m + log l."""

    def setup(self, case):
        T, H, G, d, q, k, v = _attention_inputs(case)
        case.output("o16_ptr", (T, H * d), T_ULP)
        case.output("o32_ptr", (T, H * d), T_ATT_OUT)
        case.output("lse_ptr", (H, T), T_LSE)

    def programs(self, case):
        sp = attention_split_of(case)
        progs = sp.fwd_programs()
        # the last program of the shortest rows (its key block partly past them, where
        # BLOCK_N > BLOCK_M) and the first of the longest
        return sample(len(progs), sp.heads - 1, len(progs) - sp.heads)

    def expect(self, case, pid):
        T, H, d = case.scalar("T"), case.const("HEADS"), case.const("HEAD_DIM")
        sp = attention_split_of(case)
        m, head = sp.fwd_programs()[pid]
        q, k, v = (case.data["qkv_ptr"][:, a:b] for a, b in _qkv_cols(case))
        kv = head // sp.group
        rows, hd = span(m, sp.block_m, T), slice(head * d, (head + 1) * d)
        mi = np.full(rows.stop - rows.start, -np.inf, np.float32)
        li = np.zeros_like(mi)
        acc = np.zeros((rows.stop - rows.start, d), np.float32)
        for b in range(sp.fwd_trips(m)):
            cols = span(b, sp.fwd_block_n, T)
            s = _scores(q, k, rows, cols, head, kv, d)
            m_new = np.maximum(mi, s.max(1))
            alpha = np.exp(mi - m_new)
            p = np.exp(s - m_new[:, None])
            li = li * alpha + p.sum(1, dtype=np.float32)
            acc = acc * alpha[:, None] + ref.bf16(p) @ ref.bf16(v[cols, kv * d:(kv + 1) * d])
            mi = m_new
        o = acc / li[:, None]
        yield "o32_ptr", (rows, hd), o
        yield "o16_ptr", (rows, hd), ref.bf16(o)
        yield "lse_ptr", (head, rows), mi + np.log(li)


def _qkv_cols(case):
    H, G, d = case.const("HEADS", "KV_HEADS", "HEAD_DIM")
    return (0, H * d), (H * d, (H + G) * d), ((H + G) * d, (H + 2 * G) * d)


def _slots(shape_of_slot, sp: AttentionSplit, used, rng, blocks: int, block: int, axis: int):
    """Random partials (slots, …) in the slots each block uses, NaN in the rest (a merge that
    reads a slot its block did not fill sees NaN)."""
    x = rng.standard_normal(shape_of_slot, dtype=np.float32)
    for b in range(blocks):
        for c in range(shape_of_slot[0]):
            if not used(b, c):
                index = [c] + [slice(None)] * (len(shape_of_slot) - 1)
                index[axis] = slice(b * block, (b + 1) * block)
                x[tuple(index)] = np.nan
    return x


@oracle("attention_bwd")
class _AttentionBwd:
    """One (kv block, trip chunk, kv head) program: the fp32 partial dk′ = Σ bf(ds)ᵀ·bf(q′),
    dv = Σ bf(p)ᵀ·bf(dO) over its (query head, query block) trips, and each trip's bf(ds)ᵀ tile;
    p = exp(s − lse), ds = p·(dp − delta)·scale with the forward's lse and delta (reference)."""

    def setup(self, case):
        T, H, G, d, q, k, v = _attention_inputs(case)
        do = case.input("do_ptr", (T, H * d))
        at = ref.attention(q, k, v, d)
        case.input("lse_ptr", values=_lse(q, k, T, H, G, d))
        case.input("delta_ptr", values=np.ascontiguousarray(
            (do * at.o).reshape(T, H, d).sum(-1, dtype=np.float32).T))
        sp = attention_split_of(case)
        case.output("kv_part_ptr", (sp.bwd_slots, T, 2 * G * d), T_ATT_GRAD)
        case.output("ds_ptr", (H, T, T), T_ATT_GRAD16)

    def programs(self, case):
        sp = attention_split_of(case)
        progs = sp.dkdv_programs()
        # a chunk that crosses from one query head to the next, and a ragged last chunk
        cross = [i for i, (n, c, _) in enumerate(progs)
                 if len({j for j, _ in sp.dkdv_chunk_pairs(n, c)}) > 1]
        ragged = [i for i, (n, c, _) in enumerate(progs)
                  if len(sp.dkdv_chunk_pairs(n, c)) < sp.bwd_chunk]
        return sample(len(progs), *cross[:1], *ragged[:1])

    def expect(self, case, pid):
        T, H, G, d = case.scalar("T"), *case.const("HEADS", "KV_HEADS", "HEAD_DIM")
        sp = attention_split_of(case)
        n, c, g = sp.dkdv_programs()[pid]
        q, k, v = (case.data["qkv_ptr"][:, a:b] for a, b in _qkv_cols(case))
        do, lse, delta = case.data["do_ptr"], case.data["lse_ptr"], case.data["delta_ptr"]
        cols = span(n, sp.block_n, T)                                 # this program's kv rows
        kd = slice(g * d, (g + 1) * d)
        dk = np.zeros((cols.stop - cols.start, d), np.float32)
        dv = np.zeros_like(dk)
        for j, m in sp.dkdv_chunk_pairs(n, c):
            head = g * sp.group + j
            rows, hd = span(m, sp.block_m, T), slice(head * d, (head + 1) * d)
            p = np.exp(_scores(q, k, rows, cols, head, g, d) - lse[head, rows][:, None])
            dp = ref.bf16(do[rows, hd]) @ ref.bf16(v[cols, kd]).T
            ds = ref.bf16(p * (dp - delta[head, rows][:, None]) * ref.attention_scale(d))
            yield "ds_ptr", (head, cols, rows), ds.T
            dk += ds.T @ ref.bf16(q[rows, hd])
            dv += ref.bf16(p).T @ ref.bf16(do[rows, hd])
        yield "kv_part_ptr", (c, cols, kd), dk
        yield "kv_part_ptr", (c, cols, slice((G + g) * d, (G + g + 1) * d)), dv


@oracle("attention_bwd_dq")
class _AttentionBwdDq:
    """dQ programs: bf(rotary_backward(Σ_n bf(ds)·bf(k′))) of one (query block, head) from the
    bf(ds)ᵀ tiles (random in the tiles attention_bwd writes, 0 above the diagonal, NaN elsewhere);
    merge programs: bf(rotary_backward(Σ_c dk′_c)), bf(Σ_c dv_c) of one (kv block, kv head) from
    random partials (NaN in the slots the block does not use), summed in slot order."""

    def setup(self, case):
        T, H, G, d = case.scalar("T"), *case.const("HEADS", "KV_HEADS", "HEAD_DIM")
        sp = attention_split_of(case)
        case.input("qkv_ptr", (T, (H + 2 * G) * d))
        ds = np.full((H, T, T), np.nan, np.float32)                     # [head, kv row, query row]
        causal = np.tril(np.ones((T, T), bool)).T                       # kv row ≤ query row
        for n in range(sp.kv_blocks):
            kv_rows = span(n, sp.block_n, T)
            q_rows = slice(sp.first_q(n) * sp.block_m, T)
            tile = case.rng.standard_normal((H, kv_rows.stop - kv_rows.start,
                                             T - q_rows.start), dtype=np.float32) * 1e-2
            ds[:, kv_rows, q_rows] = np.where(causal[kv_rows, q_rows], tile, 0)
        case.input("ds_ptr", values=ds)
        used = lambda n, c: c < sp.dkdv_chunks(n)  # noqa: E731
        case.input("kv_part_ptr", values=_slots((sp.bwd_slots, T, 2 * G * d), sp, used, case.rng,
                                                sp.kv_blocks, sp.block_n, 1))
        cos, sin = ref.rotary_tables(types.SimpleNamespace(context=T, head_dim=d))
        case.cache["cos_sin"] = cos, sin
        case.input("rope_ptr", values=np.concatenate([cos, sin], axis=1))
        case.output("dqkv_ptr", (T, (H + 2 * G) * d), T_ULP)

    def programs(self, case):
        n, first_merge = case.launch.grid[0], case.const("HEADS") * attention_split_of(case).q_blocks
        return sample(n, first_merge - 1, first_merge, first_merge // 2 + 1)

    def expect(self, case, pid):
        T, H, G, d = case.scalar("T"), *case.const("HEADS", "KV_HEADS", "HEAD_DIM")
        sp = attention_split_of(case)
        kind, block, head = sp.dq_programs()[pid]
        cos, sin = case.cache["cos_sin"]
        k = case.data["qkv_ptr"][:, H * d:(H + G) * d]
        if kind == "dq":
            rows, g = span(block, sp.block_m, T), head // sp.group
            keys = slice(0, sp.dq_kv_blocks(block) * sp.block_n)
            ds = case.data["ds_ptr"][head, keys, rows].T                # (BM, keys), bf16 values
            dq = ds @ ref.bf16(k[keys, g * d:(g + 1) * d])
            yield ("dqkv_ptr", (rows, slice(head * d, (head + 1) * d)),
                   ref.bf16(ref.rotary_backward(dq, cos[rows], sin[rows])))
            return
        rows, g = span(block, sp.block_n, T), head
        part = case.data["kv_part_ptr"]
        kd, vd = slice(g * d, (g + 1) * d), slice((G + g) * d, (G + g + 1) * d)
        dk, dv = part[0, rows, kd], part[0, rows, vd]
        for c in range(1, sp.dkdv_chunks(block)):
            dk, dv = dk + part[c, rows, kd], dv + part[c, rows, vd]
        yield ("dqkv_ptr", (rows, slice((H + g) * d, (H + g + 1) * d)),
               ref.bf16(ref.rotary_backward(dk, cos[rows], sin[rows])))
        yield "dqkv_ptr", (rows, slice((H + G + g) * d, (H + G + g + 1) * d)), ref.bf16(dv)
