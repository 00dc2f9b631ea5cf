"""Causal grouped-query flash attention on the fused bf16 qkv rows: forward and backward, no atomics.

Row layout of qkv (T, (H + 2G)·d): q heads at h·d, k heads at (H + g)·d, v heads at (H + G + g)·d;
query head h reads kv head h // (H/G).  The forward normalizes at the end (NUMERICS.md: its bf16
rounding of p differs from bf(softmax) by ≤ 1 ulp of p) and saves lse = m + log(l) per row.
Backward (FlashAttention-2 split; delta = rowsum(do·o) comes from matmul_delta's epilogue):
dK/dV: one program per kv block and kv head, looping over the query heads that share it in head
order, then over the query blocks — the sum order is fixed, so the result is deterministic.  dQ: one program per query block and head.
Both backward kernels own whole heads of their output rows, so their epilogues apply the inverse
rotary (rotary_backward) and store bf(dq) | bf(dk) | bf(dv), the qkv_backward matmul operands.
"""
import triton
import triton.language as tl

from plan.kernels.rotary import load_rope, rotate_tile


@triton.jit
def attention_fwd(qkv_ptr, o16_ptr, o32_ptr, lse_ptr, T, SCALE: tl.constexpr, HEADS: tl.constexpr,
                  KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """o = softmax(bf(q)bf(k)ᵀ·scale, causal) bf(v): o16 bf16 and o32 fp32 (T, H·d), lse (H, T)."""
    W: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    kv = head // (HEADS // KV_HEADS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(qkv_ptr + offs_m[:, None] * W + head * HEAD_DIM + offs_d[None, :])
    k_col = (HEADS + kv) * HEAD_DIM
    v_col = (HEADS + KV_HEADS + kv) * HEAD_DIM
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, (pid_m + 1) * BLOCK_M, BLOCK_N):
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
    o = tl.div_rn(acc, l_i[:, None])
    offs_o = offs_m[:, None] * (HEADS * HEAD_DIM) + head * HEAD_DIM + offs_d[None, :]
    tl.store(o16_ptr + offs_o, o.to(tl.bfloat16))
    tl.store(o32_ptr + offs_o, o)
    tl.store(lse_ptr + head * T + offs_m, m_i + tl.log(l_i))


@triton.jit
def _dkdv(qkv_ptr, do_ptr, lse_ptr, delta_ptr, rope_ptr, dqkv_ptr, T, pid_n, kv, SCALE: tl.constexpr,
          HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """bf(dk) (dk' through rotary_backward) and bf(dv) (T, G·d) into dqkv's k and v columns (bf16)
    for one (kv block, kv head)."""
    W: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    GROUP: tl.constexpr = HEADS // KV_HEADS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_col = (HEADS + kv) * HEAD_DIM
    v_col = (HEADS + KV_HEADS + kv) * HEAD_DIM
    k = tl.load(qkv_ptr + offs_n[:, None] * W + k_col + offs_d[None, :])            # (BLOCK_N, d)
    v = tl.load(qkv_ptr + offs_n[:, None] * W + v_col + offs_d[None, :])
    dk = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    dv = tl.zeros((BLOCK_N, HEAD_DIM), tl.float32)
    first_m = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M                 # the block holding the diagonal
    for j in tl.static_range(GROUP):                                  # query heads in head order
        head = kv * GROUP + j
        for start_m in range(first_m, T, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
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
            dst = pt * (dpt - delta[None, :]) * SCALE
            dk = tl.dot(dst.to(tl.bfloat16), tl.trans(qt), dk)
    cos_t, sin_t = load_rope(rope_ptr, offs_n, T, HEAD_DIM)
    dk = rotate_tile(dk, cos_t, sin_t, 0, 1, 1, HEAD_DIM, True)
    tl.store(dqkv_ptr + offs_n[:, None] * W + k_col + offs_d[None, :], dk.to(tl.bfloat16))
    tl.store(dqkv_ptr + offs_n[:, None] * W + v_col + offs_d[None, :], dv.to(tl.bfloat16))


@triton.jit
def _dq(qkv_ptr, do_ptr, lse_ptr, delta_ptr, rope_ptr, dqkv_ptr, T, pid_m, head, SCALE: tl.constexpr,
        HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """bf(dq) (dq' through rotary_backward) (T, H·d) into dqkv's q columns (bf16) for one
    (query block, head)."""
    W: tl.constexpr = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    kv = head // (HEADS // KV_HEADS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    k_col = (HEADS + kv) * HEAD_DIM
    v_col = (HEADS + KV_HEADS + kv) * HEAD_DIM
    q = tl.load(qkv_ptr + offs_m[:, None] * W + head * HEAD_DIM + offs_d[None, :])   # (BM, d)
    do = tl.load(do_ptr + offs_m[:, None] * (HEADS * HEAD_DIM) + head * HEAD_DIM
                 + offs_d[None, :]).to(tl.bfloat16)
    lse = tl.load(lse_ptr + head * T + offs_m)
    delta = tl.load(delta_ptr + head * T + offs_m)
    dq = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    for start_n in range(0, (pid_m + 1) * BLOCK_M, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = tl.load(qkv_ptr + offs_n[None, :] * W + k_col + offs_d[:, None])         # (d, BN)
        vt = tl.load(qkv_ptr + offs_n[None, :] * W + v_col + offs_d[:, None])
        s = tl.dot(q, kt) * SCALE
        p = tl.exp(s - lse[:, None])
        p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        dp = tl.dot(do, vt)
        ds = p * (dp - delta[:, None]) * SCALE
        dq = tl.dot(ds.to(tl.bfloat16), tl.trans(kt), dq)
    cos_t, sin_t = load_rope(rope_ptr, offs_m, T, HEAD_DIM)
    dq = rotate_tile(dq, cos_t, sin_t, 0, 1, 1, HEAD_DIM, True)
    tl.store(dqkv_ptr + offs_m[:, None] * W + head * HEAD_DIM + offs_d[None, :], dq.to(tl.bfloat16))


@triton.jit
def attention_bwd(qkv_ptr, do_ptr, lse_ptr, delta_ptr, rope_ptr, dqkv_ptr, T, SCALE: tl.constexpr,
                  HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The whole attention backward in one launch, grid ((T/BLOCK_N)·G + (T/BLOCK_M)·H,): the first
    programs are dK/dV (kv block, kv head), the rest dQ (query block, head).  They write disjoint
    columns of dqkv and share no partial sums, so running them side by side changes no bit; one
    launch instead of two fills the GPU (64 + 128 programs on 132 SMs for coppelius).  Both halves
    start with their longest programs (kv block 0 loops over every query block; the last query
    block over every kv block)."""
    pid = tl.program_id(0)
    kv_blocks = tl.cdiv(T, BLOCK_N)
    q_blocks = tl.cdiv(T, BLOCK_M)
    if pid < kv_blocks * KV_HEADS:
        _dkdv(qkv_ptr, do_ptr, lse_ptr, delta_ptr, rope_ptr, dqkv_ptr, T, pid % kv_blocks,
              pid // kv_blocks, SCALE, HEADS, KV_HEADS, HEAD_DIM, BLOCK_M, BLOCK_N)
    else:
        q = pid - kv_blocks * KV_HEADS
        _dq(qkv_ptr, do_ptr, lse_ptr, delta_ptr, rope_ptr, dqkv_ptr, T, q_blocks - 1 - q % q_blocks,
            q // q_blocks, SCALE, HEADS, KV_HEADS, HEAD_DIM, BLOCK_M, BLOCK_N)
