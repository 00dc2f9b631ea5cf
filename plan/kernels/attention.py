"""Causal grouped-query flash attention on the fused bf16 qkv rows: the forward in one launch, the
backward in two, no atomics, every sum in a fixed order (bit-identical run to run).

Row layout of qkv (T, (H + 2G)·d): q heads at h·d, k heads at (H + g)·d, v heads at (H + G + g)·d;
query head h reads kv head h // (H/G).  plan/attention_split.py holds each launch's program order
and the backward's chunks; the kernels decode their program id the same way:

attention_fwd: one program per (query block, head), the first query block (the shortest causal
row) first, over its whole causal range: online softmax over key blocks of BLOCK_N rows, the blocks
above the diagonal never visited, p = bf(exp(s − m)) against the running max (NUMERICS.md: ≤ 1
bf16 ulp of p), then o = acc / l (o16, o32) and lse = m + log l, the statistics the backward reads.
No partial buffer and no merge launch: one program holds the row's whole sum, so its order is
the key blocks' order.  Its BLOCK_N is the forward's own (tuning attn_fwd_n): a longer key block
halves the dependent trips of the longest row (docs/PERFORMANCE.md, fused attention forward).
attention_bwd (FlashAttention-2's dK/dV pass; delta = rowsum(do·o) comes from matmul_delta's
epilogue): one program per chunk of ≤ BWD_CHUNK (query head, query block) trips of one (kv block,
kv head) — the group's heads in head order, then the query blocks — writing fp32 partial dk′, dv
to slot c, and the bf(ds) tile of every trip to ds16 (NUMERICS rounds ds there anyway:
dq′ = bf(ds) @ bf(k′), dk′ = bf(ds)ᵀ @ bf(q′)).
attention_bwd_dq: dq′ of one (query block, head) = Σ over kv blocks, in order, of bf(ds)·bf(k′) —
one product per trip, the scores are not recomputed — and, side by side in the same grid, the sum
of each (kv block, kv head)'s partials in slot order; both epilogues apply the inverse rotary
(rotary_backward) and store bf(dq) | bf(dk) | bf(dv), the qkv_backward matmul operands.
"""
import triton
import triton.language as tl

from coppelius.plan.kernels.rotary import load_rope, rotate_tile
from coppelius.plan.kernels.grid_dependency import await_previous_grid


# ---------------------------------------------------------------- forward

@triton.jit
def attention_fwd(qkv_ptr, o16_ptr, o32_ptr, lse_ptr, T, SCALE: tl.constexpr, HEADS: tl.constexpr,
                  KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, PDL: tl.constexpr = False):
    """o16 (bf16), o32 (T, H·d) and lse (H, T), fp32, of one (query block, head): key blocks
    0 .. ⌈(pid_m + 1)·BLOCK_M / BLOCK_N⌉ − 1 in order.  Every row sees key 0 in the first block,
    so m is finite after it and the −inf of the masked scores weigh 0; BLOCK_N may exceed BLOCK_M
    (the last block's keys past the rows are masked: T is a multiple of BLOCK_N, the builder
    checks, so the block is never past T)."""
    await_previous_grid(PDL)
    W: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    HD: tl.constexpr = HEADS * HEAD_DIM
    pid = tl.program_id(0)
    head = pid % HEADS
    # the shortest rows first: the grid fits the chip in one round, so the order balances
    # nothing; it decides which programs share an SM where the grid becomes resident beside its
    # predecessor's CTAs (programmatic launch) and the first-placed ones double up: short ones,
    # which soon leave the long ones their SM (AttentionSplit.fwd_programs)
    pid_m = pid // HEADS
    kv = head // (HEADS // KV_HEADS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(qkv_ptr + offs_m[:, None] * W + head * HEAD_DIM + offs_d[None, :])
    k_col = (HEADS + kv) * HEAD_DIM
    v_col = (HEADS + KV_HEADS + kv) * HEAD_DIM
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, (pid_m + 1) * BLOCK_M, BLOCK_N):         # causal: no block above
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(qkv_ptr + offs_n[None, :] * W + k_col + offs_d[:, None])     # (d, BLOCK_N)
        s = tl.dot(q, kt) * SCALE
        s = tl.where(offs_m[:, None] >= offs_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(qkv_ptr + offs_n[:, None] * W + v_col + offs_d[None, :])       # (BLOCK_N, d)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
        m_i = m_new
    offs_o = offs_m[:, None] * HD + head * HEAD_DIM + offs_d[None, :]
    o = tl.div_rn(acc, l_i[:, None])
    tl.store(o16_ptr + offs_o, o.to(tl.bfloat16))
    tl.store(o32_ptr + offs_o, o)
    tl.store(lse_ptr + head * T + offs_m, m_i + tl.log(l_i))


# ---------------------------------------------------------------- backward

@triton.jit
def _dkdv_chunk_of(idx, T, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BWD_CHUNK: tl.constexpr):
    """(kv block, chunk) of dK/dV chunk idx: kv blocks from the first, chunks in trip order
    (AttentionSplit.dkdv_programs).  ⌈a/b⌉ is written out: tl.cdiv is a jit function, and the
    interpreter pays ~1 ms per nested jit call, here once per block skipped."""
    q_blocks = T // BLOCK_M
    pid_n = idx * 0
    chunks = (GROUP * q_blocks + BWD_CHUNK - 1) // BWD_CHUNK         # kv block 0: every query block
    while idx >= chunks:
        idx -= chunks
        pid_n += 1
        chunks = (GROUP * (q_blocks - pid_n * BLOCK_N // BLOCK_M) + BWD_CHUNK - 1) // BWD_CHUNK
    return pid_n, idx


@triton.jit
def attention_bwd(qkv_ptr, do_ptr, lse_ptr, delta_ptr, kv_part_ptr, ds_ptr, T, SCALE: tl.constexpr,
                  HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BWD_CHUNK: tl.constexpr,
                  PDL: tl.constexpr = False):
    """One chunk c of one (kv block, kv head): its ≤ BWD_CHUNK (query head, query block) trips as
    fp32 partial dk′ | dv in kv_part[c] (T, 2·G·d), and bf(ds)ᵀ of each trip's tile in ds16
    (H, T, T) at [head, kv rows, query rows] (0 above the diagonal)."""
    await_previous_grid(PDL)
    W: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    GROUP: tl.constexpr = HEADS // KV_HEADS
    PW: tl.constexpr = 2 * KV_HEADS * HEAD_DIM
    pid = tl.program_id(0)
    kv = pid % KV_HEADS
    pid_n, chunk = _dkdv_chunk_of(pid // KV_HEADS, T, GROUP, BLOCK_M, BLOCK_N, BWD_CHUNK)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_col = (HEADS + kv) * HEAD_DIM
    v_col = (HEADS + KV_HEADS + kv) * HEAD_DIM
    # dk, dv start as +0.0 from a product of zeros, not from zero moves: with the accumulators
    # defined by moves ptxas serializes the loop's 16 wgmmas a trip (its warning C7515); a
    # peeled first trip or one stage lift that too but spill on sm_80 (docs/PERFORMANCE.md)
    zeros = tl.zeros((BLOCK_N, 16), tl.bfloat16)
    dk = tl.dot(zeros, tl.zeros((16, HEAD_DIM), tl.bfloat16))
    dv = dk
    k = tl.load(qkv_ptr + offs_n[:, None] * W + k_col + offs_d[None, :])            # (BLOCK_N, d)
    v = tl.load(qkv_ptr + offs_n[:, None] * W + v_col + offs_d[None, :])
    first_m = (pid_n * BLOCK_N) // BLOCK_M                          # the block holding the diagonal
    rows = T // BLOCK_M - first_m                                   # query blocks per query head
    t0 = chunk * BWD_CHUNK
    for t in range(t0, tl.minimum(t0 + BWD_CHUNK, GROUP * rows)):   # head order, then block order
        head = kv * GROUP + t // rows
        offs_m = (first_m + t % rows) * BLOCK_M + tl.arange(0, BLOCK_M)
        qt = tl.load(qkv_ptr + offs_m[None, :] * W + head * HEAD_DIM + offs_d[:, None])  # (d, BM)
        do = tl.load(do_ptr + offs_m[:, None] * (HEADS * HEAD_DIM) + head * HEAD_DIM
                     + offs_d[None, :]).to(tl.bfloat16)                                # (BM, d)
        lse = tl.load(lse_ptr + head * T + offs_m)
        delta = tl.load(delta_ptr + head * T + offs_m)
        st = tl.dot(k, qt) * SCALE                                                     # (BN, BM)
        pt = tl.exp(st - lse[None, :])
        pt = tl.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
        dv = tl.dot(pt.to(tl.bfloat16), do, dv)
        dpt = tl.dot(v, tl.trans(do))                                                  # (BN, BM)
        dst = (pt * (dpt - delta[None, :]) * SCALE).to(tl.bfloat16)
        tl.store(ds_ptr + head * T * T + offs_n[:, None] * T + offs_m[None, :], dst)
        dk = tl.dot(dst, tl.trans(qt), dk)
    part = kv_part_ptr + chunk * T * PW + offs_n[:, None] * PW + kv * HEAD_DIM + offs_d[None, :]
    tl.store(part, dk)
    tl.store(part + KV_HEADS * HEAD_DIM, dv)


@triton.jit
def _dq(qkv_ptr, ds_ptr, rope_ptr, dqkv_ptr, T, pid_m, head, HEADS: tl.constexpr,
        KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """bf(dq) (dq′ = Σ_n bf(ds)·bf(k′), through rotary_backward) into dqkv's q columns for one
    (query block, head); the kv blocks in order, the diagonal's upper part is 0 in ds16."""
    W: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    kv = head // (HEADS // KV_HEADS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    k_col = (HEADS + kv) * HEAD_DIM
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, (pid_m + 1) * BLOCK_M, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        dst = tl.load(ds_ptr + head * T * T + offs_n[:, None] * T + offs_m[None, :])  # (BN, BM)
        k = tl.load(qkv_ptr + offs_n[:, None] * W + k_col + offs_d[None, :])          # (BN, d)
        dq = tl.dot(tl.trans(dst), k, dq)
    cos_t, sin_t = load_rope(rope_ptr, offs_m, T, HEAD_DIM)
    dq = rotate_tile(dq, cos_t, sin_t, 0, 1, 1, HEAD_DIM, True)
    tl.store(dqkv_ptr + offs_m[:, None] * W + head * HEAD_DIM + offs_d[None, :], dq.to(tl.bfloat16))


@triton.jit
def _dkdv_merge(kv_part_ptr, rope_ptr, dqkv_ptr, T, pid_n, kv, HEADS: tl.constexpr,
                KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BWD_CHUNK: tl.constexpr):
    """bf(dk) (the partials' sum in slot order, through rotary_backward) and bf(dv) into dqkv's k
    and v columns for one (kv block, kv head)."""
    W: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    GROUP: tl.constexpr = HEADS // KV_HEADS
    PW: tl.constexpr = 2 * KV_HEADS * HEAD_DIM
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    chunks = tl.cdiv(GROUP * (T // BLOCK_M - (pid_n * BLOCK_N) // BLOCK_M), BWD_CHUNK)
    part = kv_part_ptr + offs_n[:, None] * PW + kv * HEAD_DIM + offs_d[None, :]
    dk = tl.load(part)
    dv = tl.load(part + KV_HEADS * HEAD_DIM)
    for c in range(1, chunks):
        dk = dk + tl.load(part + c * T * PW)
        dv = dv + tl.load(part + c * T * PW + KV_HEADS * HEAD_DIM)
    cos_t, sin_t = load_rope(rope_ptr, offs_n, T, HEAD_DIM)
    dk = rotate_tile(dk, cos_t, sin_t, 0, 1, 1, HEAD_DIM, True)
    k_col = (HEADS + kv) * HEAD_DIM
    v_col = (HEADS + KV_HEADS + kv) * HEAD_DIM
    tl.store(dqkv_ptr + offs_n[:, None] * W + k_col + offs_d[None, :], dk.to(tl.bfloat16))
    tl.store(dqkv_ptr + offs_n[:, None] * W + v_col + offs_d[None, :], dv.to(tl.bfloat16))


@triton.jit
def attention_bwd_dq(qkv_ptr, ds_ptr, kv_part_ptr, rope_ptr, dqkv_ptr, T, HEADS: tl.constexpr,
                     KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BWD_CHUNK: tl.constexpr, PDL: tl.constexpr = False):
    """The rest of the attention backward, grid ((T/BLOCK_M)·H + (T/BLOCK_N)·G,): first dQ programs
    (query block, head), the last query block first, then the dK/dV merges (kv block, kv head).
    They write disjoint columns of dqkv, so running them side by side changes no bit."""
    await_previous_grid(PDL)
    pid = tl.program_id(0)
    dq_programs = T // BLOCK_M * HEADS
    if pid < dq_programs:
        _dq(qkv_ptr, ds_ptr, rope_ptr, dqkv_ptr, T, T // BLOCK_M - 1 - pid // HEADS, pid % HEADS,
            HEADS, KV_HEADS, HEAD_DIM, BLOCK_M, BLOCK_N)
    else:
        r = pid - dq_programs
        _dkdv_merge(kv_part_ptr, rope_ptr, dqkv_ptr, T, r // KV_HEADS, r % KV_HEADS, HEADS,
                    KV_HEADS, HEAD_DIM, BLOCK_M, BLOCK_N, BWD_CHUNK)
