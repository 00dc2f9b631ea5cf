"""Cost-model families of the attention kernels (plan/kernels/attention.py,
plan/attention_split.py): the fused forward, the dK/dV chunks, the dQ + dK/dV merge."""
from __future__ import annotations

from coppelius.plan.attention_split import AttentionSplit

from tools.cost.work import Programs, Step, View, Work, family


# -- attention (plan/attention_split.py): one warpgroup per program, trips over key (forward) or
#    query/kv blocks (backward); each trip's dots depend on the previous elementwise work (FA2
#    order).  The PTX says whether a trip waits on L2 (View.trip_trips): with two stages K/V (Q/dO)
#    of the next trip are copied at the end of a trip and waited for at the start of the next (the
#    PTX's cp.async.wait_group 0: one dependent L2 round trip a trip); with three (the forward) the
#    copies run two trips ahead and a trip waits on none.  The prologue/epilogue round trips are
#    the PTX's (View.tile_trips).  The dK/dV chunk programs decode their id in a scalar loop over
#    the blocks before them (DECODE_OPS dependent integer ops per block skipped, on the chain
#    before the first load)

DECODE_OPS = 5          # per block skipped: subtract, decrement, multiply-add, shift, compare


def _attn_dims(v: View):
    T = v.scalar("T")
    H, d = v.c["HEADS"], v.c["HEAD_DIM"]
    G = v.c.get("KV_HEADS", H)
    return T, H, G, d, v.c["BLOCK_M"], v.c["BLOCK_N"], (H + 2 * G) * d


def _split(v: View) -> AttentionSplit:
    """The launch's split; BLOCK_N is its own key block (the forward's, or the backward's)."""
    T, H, G, d, BM, BN, W = _attn_dims(v)
    return AttentionSplit(T, BM, BN, H, G, BN, v.c.get("BWD_CHUNK", 1))


def _programs(v: View, which, what: str):
    """(split, its programs `which` lists — an AttentionSplit method), checked against the grid."""
    sp = _split(v)
    progs = which(sp)
    _check_programs(v, len(progs), what)
    return sp, progs


def _check_programs(v: View, n: int, what: str):
    if v.programs != n:
        raise ValueError(f"{v.launch.label}: grid {v.launch.grid}, the split has {n} {what}")


def _by_fixed(progs, trips_of, fixed_of, step) -> tuple[Programs, ...]:
    """Consecutive programs sharing a prologue/epilogue (here: the same decode length) grouped."""
    out, run, key = [], [], None
    for prog in progs:
        k = fixed_of(prog)
        if run and k != key:
            out.append(Programs(tuple(run), step, key))
            run = []
        run.append(trips_of(prog))
        key = k
    out.append(Programs(tuple(run), step, key))
    return tuple(out)


@family("attention_fwd")
def _attention_fwd(v: View) -> Work:
    """One program per (query block, head), the shortest rows first, over its whole causal range
    in key blocks of BLOCK_N rows (BLOCK_N may exceed BLOCK_M: the keys past the rows are
    masked, still computed); the normalization in its epilogue, no partials."""
    T, H, G, d, BM, BN, W = _attn_dims(v)
    sp, progs = _programs(v, AttentionSplit.fwd_programs, "(query block, head) programs")
    e = BM * BN
    step = Step(mma_flops=2 * (2 * BM * BN * d), load_bytes=2 * BN * d * 2,      # K, V tiles
                mufu_ops=e + BM, alu_ops=8 * e, phases=4,       # s, row max, row sum, p·v
                l2_trips=v.trip_trips)
    # q in; o = acc / l (div_rn: a MUFU and ~10 ALU ops an element), lse = m + log l; o16, o32
    # and lse out
    fixed = Step(load_bytes=BM * d * 2, store_bytes=BM * d * (2 + 4) + BM * 4,
                 mufu_ops=BM * d + BM, alu_ops=12 * BM * d, hbm_trips=v.tile_trips)
    return Work((Programs(tuple(sp.fwd_trips(m) for m, _ in progs), step, fixed),),
                hbm_bytes=T * W * 2 + T * H * d * (2 + 4) + H * T * 4)


@family("attention_bwd")
def _attention_bwd(v: View) -> Work:
    T, H, G, d, BM, BN, W = _attn_dims(v)
    sp, progs = _programs(v, AttentionSplit.dkdv_programs, "dK/dV chunk programs")
    e = BM * BN
    # a (query head, query block) trip: kqᵀ, pᵀdO, v dOᵀ, dsᵀq; qᵀ, dO, lse, delta in; the
    # bf(ds)ᵀ tile out
    do = v.elem("do_ptr")
    step = Step(mma_flops=4 * (2 * BN * BM * d), load_bytes=d * BM * 2 + BM * d * do + 2 * BM * 4,
                store_bytes=e * 2, mufu_ops=e, alu_ops=10 * e + BM * d, phases=5,
                l2_trips=v.trip_trips)
    part = 2 * BN * d * 4                                         # dk', dv partial, fp32

    def fixed(prog):                                             # k, v in; the partial out
        n = prog[0]
        return Step(load_bytes=2 * BN * d * 2, store_bytes=part, hbm_trips=v.tile_trips,
                    serial_ops=DECODE_OPS * n)
    ds_tiles = H * sum(sp.q_blocks - sp.first_q(n) for n in range(sp.kv_blocks))
    return Work(_by_fixed(progs, lambda pr: len(sp.dkdv_chunk_pairs(pr[0], pr[1])), fixed, step),
                hbm_bytes=T * W * 2 + T * H * d * do + 2 * H * T * 4 + ds_tiles * e * 2
                + len(progs) * part)


@family("attention_bwd_dq")
def _attention_bwd_dq(v: View) -> Work:
    T, H, G, d, BM, BN, W = _attn_dims(v)
    sp, progs = _programs(v, AttentionSplit.dq_programs, "dQ + merge programs")
    rope = BM * d * 4                                             # [cos|sin] rows, fp32
    # dQ (query block m, head): kv blocks 0 .. m, one product per trip from the stored bf(ds)ᵀ
    dq_trips = tuple(sp.dq_kv_blocks(m) for kind, m, _ in progs if kind == "dq")
    dq_step = Step(mma_flops=2 * BM * BN * d, load_bytes=BN * BM * 2 + BN * d * 2, phases=1,
                   l2_trips=v.chain.per_trip_of(mma=True))
    dq_fixed = Step(load_bytes=rope, store_bytes=BM * d * 2, alu_ops=6 * BM * d,
                    hbm_trips=v.tile_trips)
    # merge (kv block n, kv head): its chunks' partials in slot order; loads that feed no dot
    # are not software-pipelined: each trip waits for its partial from L2 (the PTX's loop with
    # no product; the dQ programs' step takes the loop with one: ptx_chain.Chain.per_trip_of)
    part = 2 * BN * d * 4
    mg_trips = tuple(sp.dkdv_chunks(n) for kind, n, _ in progs if kind == "merge")
    mg_step = Step(load_bytes=part, alu_ops=2 * BN * d, l2_trips=v.chain.per_trip_of(mma=False))
    mg_fixed = Step(load_bytes=BN * d * 4, store_bytes=2 * BN * d * 2, alu_ops=8 * BN * d,
                    hbm_trips=v.tile_trips)
    ds_tiles = H * sum(sp.q_blocks - sp.first_q(n) for n in range(sp.kv_blocks))
    return Work((Programs(dq_trips, dq_step, dq_fixed), Programs(mg_trips, mg_step, mg_fixed)),
                hbm_bytes=ds_tiles * BM * BN * 2 + T * G * d * 2 + sum(mg_trips) * part
                + T * d * 4 + T * W * 2)
