"""Deterministic embedding backward with E's AdamW: dE[id] = Σ de[r] over rows with inputs[r] = id,
rows in increasing order (NUMERICS embed_backward), without atomics, then the update of E's P/M/V
rows from it (and of the two gains from their gradients) — the gradient of E never leaves
registers.

`store_next_rows` (run inside embed_fwd) links each row to the next row holding the same token
(T when none);
`embed_decay` updates E's *absent* rows — the ids no row of the context holds, g = 0: decay and
moment decay, the same operations as any other row — at the start of the update, on the side lane
(of 12,288 rows a coppelius context holds ~323 ids, so ~97 % of E's optimizer traffic leaves
the update's tail).  Nothing else reads or writes those rows during the update:
embed_fwd gathers only present rows, embed_grad updates only present rows, and both decide
presence from the same staged ids as embed_decay;
`embed_grad` gives each program BLOCK_V vocabulary rows: it finds each id's first row, then
walks the chains, adding de rows in increasing row order, and updates the E rows it owns that are
present; the programs that own dE's first words copy them to the w1 window (embed_decay writes the
absent rows' zeros there).  One more program updates the gains from dgain.
"""
import triton
import triton.language as tl

from coppelius.plan.kernels.adamw import adamw_update, bias_corrections
from coppelius.plan.kernels.grid_dependency import await_previous_grid


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
def _update_gain(p_ptr, dg_ptr, NPARAM, step_size, bc2_sqrt, D: tl.constexpr,
                 BLOCK_D: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
                 BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr):
    # a gain (D,) at p_ptr in the P plane: not decayed
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    g = tl.load(dg_ptr + offs, mask=mask, other=0.0)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    m = tl.load(p_ptr + NPARAM + offs, mask=mask, other=0.0)
    v = tl.load(p_ptr + 2 * NPARAM + offs, mask=mask, other=0.0)
    p, m, v = adamw_update(p, m, v, g, step_size, bc2_sqrt, BETA1, ONE_MINUS_BETA1, BETA2,
                           ONE_MINUS_BETA2, EPS)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(p_ptr + NPARAM + offs, m, mask=mask)
    tl.store(p_ptr + 2 * NPARAM + offs, v, mask=mask)


@triton.jit
def _first_rows(ids_t, offs_t, offs_v, T):
    """(BLOCK_V,) the first row holding each id of offs_v, T where no row does (an absent id);
    ids_t (BLOCK_T,) the context's ids as int32, offs_t their rows."""
    here = (ids_t[None, :] == offs_v[:, None]) & (offs_t[None, :] < T)
    return tl.min(tl.where(here, offs_t[None, :], T), 1)


@triton.jit
def _update_rows(e_ptr, flat, mask, g, NPARAM, step_size, bc2_sqrt, DECAY: tl.constexpr,
                 BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr, BETA2: tl.constexpr,
                 ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr):
    # AdamW (decayed) on E's words `flat` where mask: P at e_ptr, M and V NPARAM, 2·NPARAM further
    p = tl.load(e_ptr + flat, mask=mask, other=0.0)
    m = tl.load(e_ptr + NPARAM + flat, mask=mask, other=0.0)
    v = tl.load(e_ptr + 2 * NPARAM + flat, mask=mask, other=0.0)
    p, m, v = adamw_update(p * DECAY, m, v, g, step_size, bc2_sqrt, BETA1, ONE_MINUS_BETA1,
                           BETA2, ONE_MINUS_BETA2, EPS)
    tl.store(e_ptr + flat, p, mask=mask)
    tl.store(e_ptr + NPARAM + flat, m, mask=mask)
    tl.store(e_ptr + 2 * NPARAM + flat, v, mask=mask)


@triton.jit
def embed_decay(ids_ptr, e_ptr, w1_ptr, doorbell_ptr, t_base, T, V, NPARAM, D: tl.constexpr,
                W1_WORDS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr,
                BLOCK_D: tl.constexpr, LR: tl.constexpr, BETA1_F64: tl.constexpr,
                BETA2_F64: tl.constexpr, DECAY: tl.constexpr, BETA1: tl.constexpr,
                ONE_MINUS_BETA1: tl.constexpr, BETA2: tl.constexpr,
                ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr, PDL: tl.constexpr = False):
    """E's absent rows (no row of ids (T,) u32 holds them): AdamW with g = 0 at t = t_base +
    doorbell, and zeros to their words of the w1 window.  Program pid runs the vocabulary blocks
    pid, pid + programs, … of BLOCK_V rows (the grid is the side lane's SM budget)."""
    await_previous_grid(PDL)
    step_size, bc2_sqrt = bias_corrections(doorbell_ptr, t_base, LR, BETA1_F64, BETA2_F64)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    for block in range(tl.program_id(0), tl.cdiv(V, BLOCK_V), tl.num_programs(0)):
        offs_v = block * BLOCK_V + tl.arange(0, BLOCK_V)
        # the ids again per block (4 KB from L2): held across the loop they spill (ptxas -v)
        ids_t = tl.load(ids_ptr + offs_t, mask=offs_t < T, other=0).to(tl.int32)
        absent = _first_rows(ids_t, offs_t, offs_v, T) >= T
        zero = tl.zeros((BLOCK_V, BLOCK_D), tl.float32)
        flat = offs_v[:, None] * D + offs_d[None, :]            # (BLOCK_V, BLOCK_D) word index
        mask = ((offs_v < V) & absent)[:, None] & mask_d[None, :]
        if block * BLOCK_V * D < W1_WORDS:
            tl.store(w1_ptr + flat, zero, mask=mask & (flat < W1_WORDS))
        _update_rows(e_ptr, flat, mask, zero, NPARAM, step_size, bc2_sqrt, DECAY, BETA1,
                     ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)


@triton.jit
def embed_grad(ids_ptr, next_ptr, de_ptr, e_ptr, gain0_ptr, gain1_ptr, dgain_ptr, w1_ptr,
               doorbell_ptr, t_base, T, V, NPARAM, D: tl.constexpr, W1_WORDS: tl.constexpr,
               BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
               LR: tl.constexpr, BETA1_F64: tl.constexpr, BETA2_F64: tl.constexpr,
               DECAY: tl.constexpr, BETA1: tl.constexpr, ONE_MINUS_BETA1: tl.constexpr,
               BETA2: tl.constexpr, ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr,
               PDL: tl.constexpr = False):
    """dE (V, D) from de (T, D), ids (T,) u32 and the next-row links, applied at once: E's present
    rows of P/M/V (e_ptr: E in the P plane; M, V planes NPARAM and 2·NPARAM further; the absent
    ones are embed_decay's) updated by AdamW (decayed) at t = t_base + doorbell; their words of
    dE's first W1_WORDS to w1.  Program cdiv(V, BLOCK_V) updates the two gains (gain0/gain1:
    g_embed, g_final in the P plane) from dgain (2, D)."""
    await_previous_grid(PDL)
    pid = tl.program_id(0)
    step_size, bc2_sqrt = bias_corrections(doorbell_ptr, t_base, LR, BETA1_F64, BETA2_F64)
    if pid == tl.cdiv(V, BLOCK_V):
        _update_gain(gain0_ptr, dgain_ptr, NPARAM, step_size, bc2_sqrt, D, BLOCK_D, BETA1,
                     ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
        _update_gain(gain1_ptr, dgain_ptr + D, NPARAM, step_size, bc2_sqrt, D, BLOCK_D, BETA1,
                     ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
    else:
        offs_v = pid * BLOCK_V + tl.arange(0, BLOCK_V)
        offs_t = tl.arange(0, BLOCK_T)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        ids_t = tl.load(ids_ptr + offs_t, mask=offs_t < T, other=0).to(tl.int32)
        cur = _first_rows(ids_t, offs_t, offs_v, T)                # (BLOCK_V,) first row or T
        present = cur < T
        acc = tl.zeros((BLOCK_V, BLOCK_D), tl.float32)
        while tl.min(cur, 0) < T:
            live = cur < T
            row = tl.where(live, cur, 0)
            acc += tl.load(de_ptr + row[:, None] * D + offs_d[None, :],
                           mask=live[:, None] & mask_d[None, :], other=0.0)
            cur = tl.where(live, tl.load(next_ptr + row, mask=live, other=T), T)
        flat = offs_v[:, None] * D + offs_d[None, :]                # (BLOCK_V, BLOCK_D) word index
        mask = ((offs_v < V) & present)[:, None] & mask_d[None, :]
        if pid * BLOCK_V * D < W1_WORDS:
            tl.store(w1_ptr + flat, acc, mask=mask & (flat < W1_WORDS))
        _update_rows(e_ptr, flat, mask, acc, NPARAM, step_size, bc2_sqrt, DECAY, BETA1,
                     ONE_MINUS_BETA1, BETA2, ONE_MINUS_BETA2, EPS)
