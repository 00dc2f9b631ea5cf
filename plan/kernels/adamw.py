"""AdamW (NUMERICS.md §AdamW) as jit helpers — the bias corrections, the per-element update and
the streamed P/M/V loads and stores — used by every kernel that updates parameters: the
weight-gradient epilogues (matrices, plan/kernels/weight_grad.py), embed_grad and embed_decay (E
and the two gains).  (The whole-plane form of the same update is the tests' oracle,
tests/support/adamw_oracle.py.)  And the plain P → bf16 cast that refreshes the copy after a load or a
fresh init.

t = t_base + doorbell (NUMERICS.md; the doorbell is the device copy the submission's first launch
stages): the bias corrections are formed per program in float64 (β^t by binary exponentiation
over t's bits), rounded once to fp32, then the element update runs in fp32 in NUMERICS order with
IEEE division and square root.  Gains are not decayed.  The bf16 copy is written only where a
matmul reads it: not for the gains and not for the embedding table E (embed_fwd gathers fp32 rows).
"""
import triton
import triton.language as tl
from coppelius.plan.kernels.grid_dependency import await_previous_grid


@triton.jit
def _pow_f64(base, t):
    # base^t for an int64 t ≥ 0 (t < 2^40 in any run), float64 square-and-multiply
    result = tl.full((), 1.0, tl.float64)
    square = base
    for bit in tl.static_range(40):
        result = tl.where(((t >> bit) & 1) == 1, result * square, result)
        square = square * square
    return result


@triton.jit
def bias_corrections(doorbell_ptr, t_base, LR: tl.constexpr, BETA1_F64: tl.constexpr,
                     BETA2_F64: tl.constexpr):
    """(step_size, bc2_sqrt) fp32 scalars of update count t = t_base + doorbell: bc1 = 1 − β1^t,
    bc2 = 1 − β2^t in float64, step_size = fp32(lr / bc1), bc2_sqrt = fp32(sqrt(bc2))."""
    t = t_base.to(tl.int64) + tl.load(doorbell_ptr).to(tl.int64)
    bc1 = 1.0 - _pow_f64(tl.full((), BETA1_F64, tl.float64), t)
    bc2 = 1.0 - _pow_f64(tl.full((), BETA2_F64, tl.float64), t)
    step_size = (tl.full((), LR, tl.float64) / bc1).to(tl.float32)
    bc2_sqrt = tl.sqrt(bc2).to(tl.float32)            # fp64 sqrt is sqrt.rn.f64
    return step_size, bc2_sqrt


@triton.jit
def adamw_update(p, m, v, g, step_size, bc2_sqrt, BETA1: tl.constexpr,
                 ONE_MINUS_BETA1: tl.constexpr, BETA2: tl.constexpr,
                 ONE_MINUS_BETA2: tl.constexpr, EPS: tl.constexpr):
    """NUMERICS order after the decay (p arrives decayed where it decays): m, v, then p; fp32,
    IEEE div/sqrt.  Returns the new (p, m, v)."""
    m = BETA1 * m + ONE_MINUS_BETA1 * g
    v = BETA2 * v + (ONE_MINUS_BETA2 * g) * g
    p = p - tl.div_rn(step_size * m, tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + EPS)
    return p, m, v


@triton.jit
def load_pmv(p_ptr, offs, mask, STRIDE):
    """(p, m, v) of the elements `offs` of one parameter: P at p_ptr, M and V STRIDE and 2·STRIDE
    elements further.  Streamed: each is read once per update, so it is marked to leave L2 first
    and not push out what the main lane's launches read again."""
    p = tl.load(p_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    m = tl.load(p_ptr + STRIDE + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    v = tl.load(p_ptr + 2 * STRIDE + offs, mask=mask, other=0.0, eviction_policy="evict_first")
    return p, m, v


@triton.jit
def store_pmv(p_ptr, offs, mask, STRIDE, p, m, v):
    """load_pmv's planes written back, streaming (`.cs`: the next read is the next update's)."""
    tl.store(p_ptr + STRIDE + offs, m, mask=mask, cache_modifier=".cs")
    tl.store(p_ptr + 2 * STRIDE + offs, v, mask=mask, cache_modifier=".cs")
    tl.store(p_ptr + offs, p, mask=mask, cache_modifier=".cs")


@triton.jit
def cast_bf16(src_ptr, dst_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """dst = bf(src), N elements (refreshes w16 from the P plane)."""
    await_previous_grid(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.bfloat16), mask=mask)
