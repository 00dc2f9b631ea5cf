"""Fused cross-entropy: one read of each logits row gives lse, ce and dlogits; and the predictions.

ce[r] = lse(logits[r]) − logits[r, target[r]] goes to the loss record and w0 (staging);
dlogits = (softmax − onehot) / T is written as bf16 (it is only ever a matmul operand).  For T a
power of two the division is a multiplication by INV_T = 2^−k: both are the correctly rounded
value of the same real number, so the bits are the division's, for one div_rn (an rcp and ~10
dependent operations) less per element.
BLOCK_V ≥ V: a whole row sits in registers, so nothing is read twice.
A row whose input or target id is outside [0, V) — the host checks every id before it stages a
context, so only a fault gets one here — writes CE_BAD_ID (−1.0; a true ce is ≥ 0) to the loss
record and w0: the host reads the loss record after each update and ends the run as a device
error naming the step and the row (host/run/loop.py), before anything of that step is published.
Such a target is only ever compared, never an address.
"""
import triton
import triton.language as tl
from coppelius.plan.kernels.grid_dependency import await_previous_grid


@triton.jit
def cross_entropy(logits_ptr, inputs_ptr, targets_ptr, loss_ptr, w0_ptr, dlogits_ptr, T,
                  V: tl.constexpr, ROWS: tl.constexpr, BLOCK_V: tl.constexpr, INV_T: tl.constexpr,
                  CE_BAD_ID: tl.constexpr, PDL: tl.constexpr = False):
    """logits (T, V) fp32, inputs and targets (T,) u32 → loss, w0 (T,) fp32 and dlogits (T, V)
    bf16; INV_T: 1/T when T is a power of two (exact), else 0.0 (divide by T)."""
    await_previous_grid(PDL)
    offs_r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    offs_v = tl.arange(0, BLOCK_V)
    mask_r = offs_r < T
    mask = mask_r[:, None] & (offs_v[None, :] < V)
    offs = offs_r[:, None] * V + offs_v[None, :]
    # rows past T load zeros (no inf − inf), columns past V are −inf (no weight in the sums)
    logits = tl.load(logits_ptr + offs, mask=mask, other=0.0)
    logits = tl.where(offs_v[None, :] < V, logits, float("-inf"))
    m = tl.max(logits, 1)
    e = tl.exp(logits - m[:, None])
    total = tl.sum(e, 1)
    lse = m + tl.log(total)
    target = tl.load(targets_ptr + offs_r, mask=mask_r, other=0).to(tl.int32)
    hit = offs_v[None, :] == target[:, None]
    ce = lse - tl.sum(tl.where(hit, logits, 0.0), 1)
    source = tl.load(inputs_ptr + offs_r, mask=mask_r, other=0).to(tl.int32)
    bad = (target < 0) | (target >= V) | (source < 0) | (source >= V)
    ce = tl.where(bad, CE_BAD_ID, ce)
    tl.store(loss_ptr + offs_r, ce, mask=mask_r)
    tl.store(w0_ptr + offs_r, ce, mask=mask_r)
    p = tl.div_rn(e, total[:, None]) - tl.where(hit, 1.0, 0.0)
    if INV_T > 0.0:
        dl = p * INV_T
    else:
        dl = tl.div_rn(p, tl.full((), T, tl.float32))
    tl.store(dlogits_ptr + offs, dl.to(tl.bfloat16), mask=mask)


@triton.jit
def predictions(logits_ptr, pred_ptr, V: tl.constexpr, ROW0: tl.constexpr, ROW1: tl.constexpr,
                ROW2: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr = False):
    """pred[i] = {u32 argmax token (first index of the largest finite logit), u32 valid}; program i
    reads row ROW0/ROW1/ROW2; valid = 1 when every logit of the row is finite."""
    await_previous_grid(PDL)
    i = tl.program_id(0)
    row = tl.where(i == 0, ROW0, tl.where(i == 1, ROW1, ROW2))
    offs_v = tl.arange(0, BLOCK_V)
    mask = offs_v < V
    logits = tl.load(logits_ptr + row * V + offs_v, mask=mask, other=0.0)
    finite = (logits == logits) & (tl.abs(logits) < float("inf"))
    valid = tl.sum(tl.where(mask & ~finite, 1, 0), 0) == 0
    clean = tl.where(mask & finite, logits, float("-inf"))
    best = tl.max(clean, 0)
    token = tl.min(tl.where(mask & (clean == best), offs_v, BLOCK_V), 0)
    tl.store(pred_ptr + 2 * i, token.to(tl.uint32))
    tl.store(pred_ptr + 2 * i + 1, valid.to(tl.uint32))
