"""Cost-model families of the row kernels (norms, cross-entropy, the embedding and E's AdamW), the
streams (casts, copies, predictions) and the hand-written releases."""
from __future__ import annotations

from coppelius.plan import launches
from coppelius.staging import layout as L

from tools.cost.inputs import EMBED_CHAIN, EMBED_DISTINCT
from tools.cost.work import (ADAMW_ALU, ADAMW_MUFU, PMV_BYTES, Programs, Staging, Step, View, Work, add_steps,
                   cdiv, doorbell_read, family, lines, uniform)


# -- row kernels: BLOCK_R whole rows per program, one pass (num_stages = 1), straight-line code:
#    the PTX gives their dependent round trips (a load after a row reduction's barrier is one
#    more) and their instructions (View.tile_trips, View.tail_ops)

@family("rmsnorm_bwd")
def _rmsnorm_bwd(v: View) -> Work:
    T, D, R = v.scalar("T"), v.c["D"], v.c["BLOCK_R"]
    gain, acc, bf16 = v.c["HAS_GAIN"], v.c["ACCUMULATE"], v.c["WRITE_BF16"]
    parts = v.c.get("DY_PARTS", 1)
    alu, mufu = v.tail_ops()
    step = _norm_rows(D, R, gain, acc, bf16, parts, v.tile_trips, alu, mufu, v.tail_bars)
    return Work((uniform(v.programs, 1, step),),
                hbm_bytes=_norm_rows_unique(T, D, gain, acc, bf16, parts))


def _norm_rows(D, R, gain, acc, bf16, parts, trips, alu=None, mufu=None, bars=1) -> Step:
    """dy (its `parts` split-K partials), x, r (and g, and the dx accumulated into) in; dx (and
    bf(dx)) out; a row reduction; `trips` dependent round trips; the instructions and barriers
    given (the PTX's), or by hand where the PTX's tail is another branch's (rmsnorm_bwd_gain)."""
    rows = R * D * 4
    return Step(load_bytes=(parts + 1) * rows + R * 4 + (D * 4 if gain else 0)
                + (rows if acc else 0),
                store_bytes=rows + (R * D * 2 if bf16 else 0),
                alu_ops=(7 + parts) * R * D if alu is None else alu,
                mufu_ops=R if mufu is None else mufu, phases=bars, hbm_trips=trips)


def _norm_rows_unique(T, D, gain, acc, bf16, parts=1) -> float:
    return T * D * 4 * (2 + parts + (1 if acc else 0)) + T * 4 + (D * 4 if gain else 0) \
        + (T * D * 2 if bf16 else 0)


def _gain_programs(T, D, GR, GC, parts, trips) -> Programs:
    """cdiv(D, GC) gain-column programs: T/GR trips of (r, x, dy partials) chunks, each a column
    sum, no prefetch (one-stage loop): `trips` dependent L2 round trips per trip (the PTX's)."""
    gain = Step(load_bytes=GR * 4 + (1 + parts) * GR * GC * 4, alu_ops=(2 + parts) * GR * GC,
                phases=1, l2_trips=trips)
    return uniform(cdiv(D, GC), cdiv(T, GR), gain, Step(store_bytes=GC * 4, hbm_trips=1))


@family("residual_norm")
def _residual_norm(v: View) -> Work:
    T, D, R, parts = v.scalar("T"), v.c["D"], v.c["BLOCK_R"], v.c["PARTS"]
    g = D * 4 if v.c["HAS_GAIN"] else 0
    # BLOCK_R fp32 rows of the residual and of each split-K partial (and the gain) in; their sum
    # out, a row reduction, bf16 rows and rstd out
    alu, mufu = v.tail_ops()
    step = Step(load_bytes=(1 + parts) * R * D * 4 + g, store_bytes=R * D * (4 + 2) + R * 4,
                alu_ops=alu, mufu_ops=mufu, phases=v.tail_bars, hbm_trips=v.tile_trips)
    return Work((uniform(v.programs, 1, step),),
                hbm_bytes=T * D * 4 * (2 + parts) + T * D * 2 + g + T * 4)


@family("rmsnorm_rows")
def _rmsnorm_rows(v: View) -> Work:
    T, D, R, parts = v.scalar("T"), v.c["D"], v.c["BLOCK_R"], v.c["SSQ_PARTS"]
    # the rows' partial sums of squares and BLOCK_R fp32 rows in (independent loads: one round
    # trip, the PTX says), bf16 rows and rstd out
    alu, mufu = v.tail_ops()
    step = Step(load_bytes=R * parts * 4 + R * D * 4, store_bytes=R * D * 2 + R * 4,
                alu_ops=alu, mufu_ops=mufu, phases=v.tail_bars, hbm_trips=v.tile_trips)
    return Work((uniform(v.programs, 1, step),),
                hbm_bytes=T * D * (4 + 2) + T * 4 + parts * T * 4)


@family("rmsnorm_bwd_gain")
def _rmsnorm_bwd_gain(v: View) -> Work:
    T, D, R = v.scalar("T"), v.c["D"], v.c["BLOCK_R"]
    GR, GC, bf16 = v.c["GAIN_ROWS"], v.c["GAIN_COLS"], v.c["WRITE_BF16"]
    parts = v.c.get("DY_PARTS", 1)
    rows, cols = cdiv(T, R), cdiv(D, GC)
    if v.programs != rows + cols:
        raise ValueError(f"{v.launch.label}: grid {v.launch.grid}, expected {rows} + {cols}")
    return Work((uniform(rows, 1, _norm_rows(D, R, True, False, bf16, parts, v.tile_trips)),
                 _gain_programs(T, D, GR, GC, parts, v.trip_trips)),
                hbm_bytes=_norm_rows_unique(T, D, True, False, bf16, parts) + D * 4)


@family("cross_entropy")
def _cross_entropy(v: View) -> Work:
    T, V, R = v.scalar("T"), v.c["V"], v.c["ROWS"]
    e = R * V
    # one fp32 logits row in, bf16 dlogits out; exp and the softmax's div_rn per element, and a
    # second div_rn by T unless T is a power of two (INV_T: a multiplication); max/sum/pick
    # reductions; the rows' targets (staging, or the staged device copy: an L2 hit) on the chain
    # (the PTX's chain: the targets, then the rest of its round trips)
    staged = "targets_ptr" in v.staging_args()
    alu, mufu = v.tail_ops()
    step = Step(load_bytes=e * 4 + (0 if staged else R * 4), store_bytes=e * 2,
                mufu_ops=mufu, alu_ops=alu, phases=v.tail_bars,
                hbm_trips=v.tile_trips - 1, staging_trips=1 if staged else 0,
                l2_trips=0 if staged else 1)
    targets = ((Staging("targets_ptr", read_bytes=T * 4, read_requests=v.programs,
                        unique_bytes=T * 4),) if staged else ())
    return Work((uniform(v.programs, 1, step),),
                hbm_bytes=T * V * (4 + 2) + (0 if staged else T * 4),
                staging=targets + (Staging("loss_ptr", write_bytes=T * 4),
                                   Staging("w0_ptr", write_bytes=T * 4)))


@family("embed_fwd")
def _embed_fwd(v: View) -> Work:
    T, D, R, d = v.scalar("T"), v.c["D"], v.c["BLOCK_R"], v.c["HEAD_DIM"]
    P = v.programs
    # own ids (twice: gather and links) and all T ids (links) — from staging, or from the staged
    # device copy (L2) — then the rows gathered (dependent), rmsnorm and the first attention norm
    # (two row reductions), the rope rows in float64 (sin/cos ≈ 40 dependent ops); the ids are
    # the first of the PTX's round trips
    per = 2 * R * 4 + T * 4
    staged = "ids_ptr" in v.staging_args()
    alu, mufu = v.tail_ops()
    step = Step(load_bytes=R * D * 4 + D * 4 + (0 if staged else per),
                store_bytes=2 * R * D * 4 + R * 4 + R * d * 4 + R * 4 + R * D * 2 + R * 4,
                mufu_ops=mufu, alu_ops=alu, phases=v.tail_bars, serial_ops=80,
                hbm_trips=v.tile_trips - 1, staging_trips=1 if staged else 0,
                l2_trips=0 if staged else 1)
    ids = ((Staging("ids_ptr", read_bytes=P * per,
                    read_requests=P * (2 * lines(R * 4) + lines(T * 4)), unique_bytes=T * 4),)
           if staged else ())
    return Work((uniform(P, 1, step),),
                hbm_bytes=T * D * 4 * 3 + D * 4 + T * 4 + T * d * 4 + T * 4 + T * D * 2 + T * 4,
                staging=ids)


def _present(T: int, V: int) -> float:
    """The fraction of E's rows a context's ids hold (EMBED_DISTINCT, at most T and V)."""
    return min(EMBED_DISTINCT, T, V) / V


@family("embed_decay")
def _embed_decay(v: View) -> Work:
    T, V, D, BV = v.scalar("T"), v.scalar("V"), v.c["D"], v.c["BLOCK_V"]
    P, blocks = v.programs, cdiv(V, BV)
    # per vocabulary block a program reads the T ids (from L2), compares them with its BLOCK_V
    # ids, then updates the absent rows (g = 0: P, M, V in and out), spread evenly over the blocks
    absent = 1.0 - _present(T, V)
    fixed, staged = doorbell_read(v, P)
    e = BV * D * absent
    trip = Step(load_bytes=T * 4 + PMV_BYTES * e, store_bytes=PMV_BYTES * e,
                mufu_ops=ADAMW_MUFU * e, alu_ops=3 * BV * T + ADAMW_ALU * e, phases=1,
                l2_trips=1, hbm_trips=1)
    more, base = blocks % P, blocks // P              # the first `more` programs run base + 1
    groups = tuple(uniform(n, k, trip, fixed) for n, k in ((more, base + 1), (P - more, base)) if n)
    w1 = v.c["W1_WORDS"] * 4 * absent
    return Work(groups, hbm_bytes=T * 4 + V * D * absent * 2 * PMV_BYTES,
                staging=staged + (Staging("w1_ptr", write_bytes=w1),))


@family("embed_grad")
def _embed_grad(v: View) -> Work:
    T, V, D, BV = v.scalar("T"), v.scalar("V"), v.c["D"], v.c["BLOCK_V"]
    P = v.programs - 1                                # the last program updates the two gains
    # every program reads all T ids and compares them with its BLOCK_V ids, then walks the
    # chains: one dependent trip per occurrence of its most frequent id (program 0 holds the
    # markers: EMBED_CHAIN trips; the others one) — a de row and a next-row link per trip; then
    # AdamW on its present rows of E (P, M, V in and out; embed_decay has the absent ones),
    # spread evenly over the blocks
    ids_staged = "ids_ptr" in v.staging_args()
    start, staged = doorbell_read(v, v.programs)
    trip = Step(load_bytes=D * 4 + 4, alu_ops=4 * BV * D, phases=1, l2_trips=1)
    present = _present(T, V)
    e = BV * D * present
    fixed = add_steps(start, Step(load_bytes=(0 if ids_staged else T * 4) + PMV_BYTES * e,
                              store_bytes=PMV_BYTES * e, mufu_ops=ADAMW_MUFU * e,
                              alu_ops=3 * BV * T + ADAMW_ALU * e, phases=1,
                              staging_trips=1 if ids_staged else 0,
                              l2_trips=0 if ids_staged else 1, hbm_trips=1))
    trips = (EMBED_CHAIN,) + (1,) * (P - 1)
    missing_rows = max(0, T - sum(trips))             # de rows read in trips not modelled
    g = 2 * D                                         # both gains
    gains = uniform(1, 1, add_steps(start, Step(load_bytes=g * 4 + PMV_BYTES * g,
                                            store_bytes=PMV_BYTES * g, mufu_ops=ADAMW_MUFU * g,
                                            alu_ops=ADAMW_ALU * g, hbm_trips=1)))
    w1 = v.c["W1_WORDS"] * 4 * present
    ids = ((Staging("ids_ptr", read_bytes=P * T * 4, read_requests=P * lines(T * 4),
                    unique_bytes=T * 4),) if ids_staged else ())
    return Work((Programs(trips, trip, fixed), gains),
                hbm_bytes=T * D * 4 + T * 4 + T * 4 + V * D * present * 2 * PMV_BYTES
                + g * (4 + 2 * PMV_BYTES),
                extra_l2_bytes=missing_rows * (D * 4 + 4),
                staging=ids + staged + (Staging("w1_ptr", write_bytes=w1),))


# -- streams

@family("cast_bf16")
def _cast_bf16(v: View) -> Work:
    N, B = v.scalar("N"), v.c["BLOCK"]
    alu, mufu = v.tail_ops()
    return Work((uniform(v.programs, 1, Step(load_bytes=B * 4, store_bytes=B * 2, alu_ops=alu,
                                             mufu_ops=mufu, hbm_trips=v.tile_trips)),),
                hbm_bytes=N * 6)


@family("copy_f32")
def _copy_f32(v: View) -> Work:
    N, B = v.scalar("N"), v.c["BLOCK"]
    staged = "dst_ptr" in v.staging_args()              # the writers copy device → staging
    alu, mufu = v.tail_ops()
    step = Step(load_bytes=B * 4, store_bytes=0 if staged else B * 4, alu_ops=alu, mufu_ops=mufu,
                hbm_trips=v.tile_trips)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=N * 4 * (1 if staged else 2),
                staging=(Staging("dst_ptr", write_bytes=N * 4),) if staged else ())


@family("predictions")
def _predictions(v: View) -> Work:
    V = v.c["V"]
    alu, mufu = v.tail_ops()
    step = Step(load_bytes=V * 4, alu_ops=alu, mufu_ops=mufu, phases=v.tail_bars,
                hbm_trips=v.tile_trips)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=v.programs * V * 4,
                staging=(Staging("pred_ptr", write_bytes=v.programs * 8),))


@family(launches.RELEASE)
def _release(v: View) -> Work:
    # one thread: reads the doorbell (the device copy after the stage-in, or staging), then
    # fence.acq_rel.sys (a host round trip), 16 B out
    staged = "doorbell_ptr" in v.staging_args()
    step = Step(staging_trips=2 if staged else 1, l2_trips=0 if staged else 1)
    doorbell = ((Staging("doorbell_ptr", read_bytes=4, read_requests=1, unique_bytes=4),)
                if staged else ())
    return Work((uniform(v.programs, 1, step),), hbm_bytes=0,
                staging=doorbell + (Staging("slot_ptr", write_bytes=16),))


@family(launches.STAGE_IN)
def _release_stage_in(v: View) -> Work:
    # one block: every thread reads 2 × 16 B of the input record from staging (64 lines in
    # flight together: one round trip), stores them; thread 0 then reads the doorbell (a second
    # round trip), stores it, fence.acq_rel.sys (a third), 16 B of semaphore record out
    record = L.INPUT_RECORD_BYTES
    step = Step(load_bytes=0, store_bytes=record + 4, staging_trips=3, alu_ops=record // 4)
    return Work((uniform(v.programs, 1, step),), hbm_bytes=record + 4,
                staging=(Staging("record_ptr", read_bytes=record, read_requests=2 * record // 32,
                                 unique_bytes=record),
                         Staging("doorbell_ptr", read_bytes=4, read_requests=1, unique_bytes=4),
                         Staging("slot_ptr", write_bytes=16)))
