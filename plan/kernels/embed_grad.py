"""Deterministic embedding backward: dE[id] = Σ de[r] over rows with inputs[r] = id, rows in
increasing order (NUMERICS embed_backward), without atomics.

`store_next_rows` (run inside embed_fwd) links each row to the next row holding the same token
(T when none);
`embed_grad` gives each program BLOCK_V vocabulary rows: it finds each id's first row, then
walks the chains, adding de rows in increasing row order, and writes every dE row it owns
(zeros for absent ids), so the whole E slice of the gradient is overwritten each step, and copies
the first words to the w1 window.
"""
import triton
import triton.language as tl


@triton.jit
def store_next_rows(ids_ptr, next_ptr, offs_r, T, BLOCK_T: tl.constexpr):
    """next[r] = min{r' > r : ids[r'] = ids[r]} or T for the rows offs_r, (T,) int32.  Called by
    embed_fwd, which owns the same rows: one launch fewer than a separate links kernel."""
    offs_t = tl.arange(0, BLOCK_T)
    mask_r = offs_r < T
    ids_r = tl.load(ids_ptr + offs_r, mask=mask_r, other=0)
    ids_t = tl.load(ids_ptr + offs_t, mask=offs_t < T, other=0)
    later = (ids_t[None, :] == ids_r[:, None]) & (offs_t[None, :] > offs_r[:, None]) \
        & (offs_t[None, :] < T)
    nxt = tl.min(tl.where(later, offs_t[None, :], T), 1)
    tl.store(next_ptr + offs_r, nxt, mask=mask_r)


@triton.jit
def embed_grad(ids_ptr, next_ptr, de_ptr, de_table_ptr, w1_ptr, T, V, D: tl.constexpr,
               W1_WORDS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """dE (V, D) fp32 from de (T, D), ids (T,) u32 and the next-row links; the programs that own
    dE's first W1_WORDS words also store them to w1 (the staging window: one copy launch fewer)."""
    offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    ids_t = tl.load(ids_ptr + offs_t, mask=offs_t < T, other=0).to(tl.int32)
    here = (ids_t[None, :] == offs_v[:, None]) & (offs_t[None, :] < T)
    cur = tl.min(tl.where(here, offs_t[None, :], T), 1)              # (BLOCK_V,) first row or T
    acc = tl.zeros((BLOCK_V, BLOCK_D), tl.float32)
    while tl.min(cur, 0) < T:
        live = cur < T
        row = tl.where(live, cur, 0)
        acc += tl.load(de_ptr + row[:, None] * D + offs_d[None, :],
                       mask=live[:, None] & mask_d[None, :], other=0.0)
        cur = tl.where(live, tl.load(next_ptr + row, mask=live, other=T), T)
    flat = offs_v[:, None] * D + offs_d[None, :]                    # (BLOCK_V, BLOCK_D) word index
    mask = (offs_v < V)[:, None] & mask_d[None, :]
    tl.store(de_table_ptr + flat, acc, mask=mask)
    if tl.program_id(0) * BLOCK_V * D < W1_WORDS:
        tl.store(w1_ptr + flat, acc, mask=mask & (flat < W1_WORDS))
