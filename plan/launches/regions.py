"""What each launch reads and writes, as regions of device buffers and staging: one rule per kernel.

The launch lists carry references (a buffer and an element offset), not extents.  Here every
kernel function has one rule that turns a launch's arguments and constexprs into its regions, read
off the kernel's contract in plan/kernels/: `regions(profile, launch)` gives (reads, writes).  The
per-launch digests (host/run/digest_replay.py) summarize exactly these regions, and the bisect tells a
kernel that diverged (its reads equal, its writes not) from one that inherited a difference.
tests/plan/test_launch_regions*.py check the table against the kernels: every launch of the tiny update
run alone on the interpret backend with everything but its declared reads poisoned changes bytes
only inside its declared writes, writes each of them, and writes the same bytes as with nothing
poisoned (so its declared reads are all it reads).

Regions are exact where the kernel's extent is, and say so where they are not:
  * `partial`: the data decides which part is written — E's rows (P/M/V and the w1 window) are
    split between embed_decay (absent ids) and embed_grad (present ids) by the staged ids;
  * a superset read — embed_fwd's gather reads E rows by id: the whole E; the predictions' rows;
  * ds16 (attention_bwd): the whole buffer; its upper block triangle is never written by any
    launch, so it holds the buffer's poison on every backend;
  * `volatile`: a semaphore's timestamp (device time): recorded, never compared.
Plain data: no Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

from coppelius.plan.attention_split import attention_split
from coppelius.plan.buffers import DTYPE_BYTES, STAGED_DOORBELL
from coppelius.plan.kernels import meta
from coppelius.plan.launches.types import BufferRef, Launch, StagingRef
from coppelius.plan.tuning import cdiv, tuning
from coppelius.staging import layout as L
from coppelius.staging import records as R

STAGING = "staging"             # the region's space when it lies in the staging region
PLANES = ("P", "M", "V")        # a parameter's three planes in `pmv`, N elements apart
SLOT_WORDS = L.SEMAPHORE_RECORD_BYTES // 4              # u32 words of a semaphore record
SLOT_TIME_WORD = R.SEMAPHORE_RECORD.offset("timestamp") // 4   # the u64 device time's first word


class RegionError(ValueError):
    """A launch whose regions cannot be derived: a kernel without a rule, a reference that is
    neither a buffer nor a staging field."""


@dataclass(frozen=True)
class Region:
    """`repeat` runs of `run` elements of `dtype`, `stride` elements apart, from element `offset`
    of a device buffer or of staging (STAGING: elements of `dtype` from the staging base)."""
    name: str                   # the kernel parameter it comes from, e.g. "dx_ptr", "e_ptr (M)"
    space: str                  # a buffer of plan/buffers.py, or STAGING
    offset: int
    run: int
    dtype: str
    repeat: int = 1
    stride: int = 0
    partial: bool = False       # the data decides which part of it is written
    volatile: bool = False      # time-dependent: recorded, never compared

    @property
    def count(self) -> int:
        return self.run * self.repeat

    @property
    def end(self) -> int:
        """One past the last element."""
        return self.offset + (self.repeat - 1) * self.stride + self.run

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def byte_span(self) -> tuple[int, int]:
        """(first byte, bytes) of the smallest range holding every run."""
        return self.offset * self.itemsize, (self.end - self.offset) * self.itemsize


@dataclass(frozen=True)
class LaunchRegions:
    reads: tuple[Region, ...]
    writes: tuple[Region, ...]


def region(launch: Launch, param: str, count: int, *, skip: int = 0, name: str | None = None,
           **kw) -> Region:
    """`count` elements of the argument `param` points at, from `skip` elements past it (with
    `repeat`/`stride` in kw: `count` elements per run)."""
    ref = launch.arg(param)
    if isinstance(ref, BufferRef):
        space, offset = ref.buffer, ref.offset
    elif isinstance(ref, StagingRef):
        size = DTYPE_BYTES[ref.dtype]
        if ref.offset % size:
            raise RegionError(f"{launch.label}: {param} at staging byte {ref.offset} is not "
                              f"{ref.dtype}-aligned")
        space, offset = STAGING, ref.offset // size
    else:
        raise RegionError(f"{launch.label}: {param} is {type(ref).__name__}, not a buffer or "
                          "staging reference")
    return Region(name or param, space, offset + skip, count, ref.dtype, **kw)


def planes(launch: Launch, param: str, count: int, nparam: int, **kw) -> list[Region]:
    """A parameter's P, M and V regions (`param` points at it in the P plane)."""
    return [region(launch, param, count, skip=k * nparam, name=f"{param} ({p})", **kw)
            for k, p in enumerate(PLANES)]


def slot(launch: Launch) -> list[Region]:
    """A semaphore record: payload and zero word compared, the device time volatile."""
    return [region(launch, "slot_ptr", SLOT_TIME_WORD, name="slot_ptr (payload)"),
            region(launch, "slot_ptr", SLOT_WORDS - SLOT_TIME_WORD, skip=SLOT_TIME_WORD,
                   name="slot_ptr (time)", volatile=True)]


class _Shape:
    """A launch's integer arguments and constexprs by name, and the profile's figures."""

    def __init__(self, profile, launch: Launch):
        self.p, self.launch = profile, launch
        self.c = dict(launch.constexprs)
        self.split = attention_split(profile, tuning(profile))

    def __getattr__(self, name):
        c = self.__dict__["c"]
        if name in c:
            return c[name]
        return self.__dict__["launch"].arg(name).value

    @property
    def e_words(self) -> int:
        return self.p.parameter("embed").size

    @property
    def qkv_width(self) -> int:
        return (self.HEADS + 2 * self.KV_HEADS) * self.HEAD_DIM


# ---------------------------------------------------------------- rules: (reads, writes)

def _stage_in(s, x):
    return ([region(x, "doorbell_ptr", 1), region(x, "record_ptr", STAGED_DOORBELL)],
            [region(x, "staged_ptr", STAGED_DOORBELL + 1)] + slot(x))


def _release(s, x):
    return [region(x, "doorbell_ptr", 1)], slot(x)


def _embed_fwd(s, x):
    T, D = s.T, s.D
    return ([region(x, "ids_ptr", T), region(x, "table_ptr", s.e_words), region(x, "g_ptr", D)],
            [region(x, "emb_ptr", T * D), region(x, "rstd_ptr", T), region(x, "x_ptr", T * D),
             region(x, "h16_ptr", T * D), region(x, "rstd0_ptr", T),
             region(x, "rope_ptr", T * s.HEAD_DIM), region(x, "next_ptr", T)])


def _rmsnorm_rows(s, x):
    T, D = s.T, s.D
    return ([region(x, "x_ptr", T * D), region(x, "ssq_ptr", s.SSQ_PARTS * T)],
            [region(x, "h16_ptr", T * D), region(x, "rstd_ptr", T)])


def _residual_norm(s, x):
    T, D = s.T, s.D
    reads = [region(x, "x_ptr", T * D), region(x, "part_ptr", s.PARTS * T * D)]
    reads += [region(x, "g_ptr", D)] if s.HAS_GAIN else []
    return reads, [region(x, "out_ptr", T * D), region(x, "h16_ptr", T * D),
                   region(x, "rstd_ptr", T)]


def _norm_bwd_reads(s, x, gain: bool) -> list[Region]:
    T, D = s.T, s.D
    return ([region(x, "dy_ptr", s.DY_PARTS * T * D), region(x, "x_ptr", T * D),
             region(x, "rstd_ptr", T)] + ([region(x, "g_ptr", D)] if gain else []))


def _rmsnorm_bwd(s, x):
    T, D = s.T, s.D
    reads = _norm_bwd_reads(s, x, s.HAS_GAIN)
    reads += [region(x, "dx_ptr", T * D)] if s.ACCUMULATE else []
    return reads, ([region(x, "dx_ptr", T * D)]
                   + ([region(x, "dx16_ptr", T * D)] if s.WRITE_BF16 else []))


def _rmsnorm_bwd_gain(s, x):
    T, D = s.T, s.D
    return (_norm_bwd_reads(s, x, True),
            [region(x, "dx_ptr", T * D)] + ([region(x, "dx16_ptr", T * D)] if s.WRITE_BF16 else [])
            + [region(x, "dg_ptr", D)])


def _attention_fwd(s, x):
    T, hd = s.T, s.HEADS * s.HEAD_DIM
    return ([region(x, "qkv_ptr", T * s.qkv_width)],
            [region(x, "o16_ptr", T * hd), region(x, "o32_ptr", T * hd),
             region(x, "lse_ptr", s.HEADS * T)])


def _kv_slots(s, x) -> list[Region]:
    """attention_bwd's partials: slot c holds the kv blocks with more than c chunks (the first
    ones), whole rows of 2·G·d."""
    sp, T = s.split, s.T
    width = 2 * s.KV_HEADS * s.HEAD_DIM
    return [region(x, "kv_part_ptr", sum(sp.dkdv_chunks(n) > c for n in range(sp.kv_blocks))
                   * sp.block_n * width, skip=c * T * width, name=f"kv_part_ptr (slot {c})")
            for c in range(sp.bwd_slots)]


def _attention_bwd(s, x):
    T, H, hd = s.T, s.HEADS, s.HEADS * s.HEAD_DIM
    return ([region(x, "qkv_ptr", T * s.qkv_width), region(x, "do_ptr", T * hd),
             region(x, "lse_ptr", H * T), region(x, "delta_ptr", H * T)],
            _kv_slots(s, x) + [region(x, "ds_ptr", H * T * T)])


def _attention_bwd_dq(s, x):
    T, W = s.T, s.qkv_width
    return ([region(x, "qkv_ptr", T * W), region(x, "ds_ptr", s.HEADS * T * T)]
            + _kv_slots(s, x) + [region(x, "rope_ptr", T * s.HEAD_DIM)],
            [region(x, "dqkv_ptr", T * W)])


def _cross_entropy(s, x):
    T, V = s.T, s.V
    return ([region(x, "logits_ptr", T * V), region(x, "inputs_ptr", T),
             region(x, "targets_ptr", T)],
            [region(x, "loss_ptr", T), region(x, "w0_ptr", T), region(x, "dlogits_ptr", T * V)])


def _predictions(s, x):
    V = s.V
    rows = [region(x, "logits_ptr", V, skip=r * V, name=f"logits_ptr (row {r})")
            for r in (s.ROW0, s.ROW1, s.ROW2)]
    return rows, [region(x, "pred_ptr", L.PREDICTIONS_BYTES // 4)]


def _embed_decay(s, x):
    n = s.NPARAM
    return ([region(x, "ids_ptr", s.T), region(x, "doorbell_ptr", 1)]
            + planes(x, "e_ptr", s.e_words, n),
            planes(x, "e_ptr", s.e_words, n, partial=True)
            + [region(x, "w1_ptr", s.W1_WORDS, partial=True)])


def _embed_grad(s, x):
    T, D, n = s.T, s.D, s.NPARAM
    gains = planes(x, "gain0_ptr", D, n) + planes(x, "gain1_ptr", D, n)
    return ([region(x, "ids_ptr", T), region(x, "next_ptr", T), region(x, "de_ptr", T * D),
             region(x, "dgain_ptr", 2 * D), region(x, "doorbell_ptr", 1)]
            + planes(x, "e_ptr", s.e_words, n) + gains,
            planes(x, "e_ptr", s.e_words, n, partial=True) + gains
            + [region(x, "w1_ptr", s.W1_WORDS, partial=True)])


def _matmul(s, x):
    M, N, K, epi = s.M, s.N, s.K, s.EPILOGUE
    reads = [region(x, "a_ptr", M * K), region(x, "b_ptr", N * K)]
    if epi == meta.EPI_RESIDUAL:
        reads.append(region(x, "aux_ptr", M * N))
    if epi == meta.EPI_SWIGLU_BWD:
        return reads + [region(x, "aux_ptr", M * 2 * N)], [region(x, "c_ptr", M * 2 * N)]
    return reads, [region(x, "c_ptr", s.SPLIT_K * M * N)]


def _matmul_residual(s, x):
    M, N, K = s.M, s.N, s.K
    parts = cdiv(N, s.BLOCK_N)                           # one per column tile
    return ([region(x, "a_ptr", M * K), region(x, "b_ptr", N * K), region(x, "x_ptr", M * N)],
            [region(x, "out_ptr", M * N), region(x, "ssq_ptr", parts * M)])


def _matmul_swiglu(s, x):
    M, N, K = s.M, s.N, s.K
    return ([region(x, "h16_ptr", M * K), region(x, "wg_ptr", N * K), region(x, "wu_ptr", N * K)],
            [region(x, "ab_ptr", M * 2 * N), region(x, "z_ptr", M * N)])


def _matmul_rotary(s, x):
    M, N, K = s.M, s.N, s.K
    return ([region(x, "h16_ptr", M * K), region(x, "w_ptr", N * K),
             region(x, "rope_ptr", M * s.HEAD_DIM)], [region(x, "qkv_ptr", M * N)])


def _matmul_delta(s, x):
    M, N, K = s.M, s.N, s.K
    return ([region(x, "a_ptr", M * K), region(x, "b_ptr", K * N), region(x, "o_ptr", M * N)],
            [region(x, "do_ptr", M * N), region(x, "delta_ptr", N // s.HEAD_DIM * M)])


def _weight_grad(s, x):
    T, n = s.T, s.NPARAM
    reads, writes = [region(x, "doorbell_ptr", 1)], []
    for j in range(s.PRODUCTS):
        M, N = x.arg(f"M{j}").value, x.arg(f"N{j}").value
        reads += [region(x, f"a{j}_ptr", T * M), region(x, f"b{j}_ptr", T * N)]
        reads += planes(x, f"p{j}_ptr", M * N, n)
        writes += planes(x, f"p{j}_ptr", M * N, n) + [region(x, f"h{j}_ptr", M * N)]
    return reads, writes


def _elementwise(s, x):
    return [region(x, "src_ptr", s.N)], [region(x, "dst_ptr", s.N)]


RULES = {
    "release_stage_in": _stage_in, "release": _release, "embed_fwd": _embed_fwd,
    "rmsnorm_rows": _rmsnorm_rows, "residual_norm": _residual_norm, "rmsnorm_bwd": _rmsnorm_bwd,
    "rmsnorm_bwd_gain": _rmsnorm_bwd_gain, "attention_fwd": _attention_fwd,
    "attention_bwd": _attention_bwd, "attention_bwd_dq": _attention_bwd_dq,
    "cross_entropy": _cross_entropy,
    "predictions": _predictions, "embed_decay": _embed_decay, "embed_grad": _embed_grad,
    "matmul": _matmul, "matmul_residual": _matmul_residual, "matmul_swiglu": _matmul_swiglu,
    "matmul_rotary": _matmul_rotary, "matmul_delta": _matmul_delta, "weight_grad": _weight_grad,
    "cast_bf16": _elementwise, "copy_f32": _elementwise,
}


def regions(profile, launch: Launch) -> LaunchRegions:
    """(reads, writes) of one launch of `profile`'s plan."""
    rule = RULES.get(launch.function)
    if rule is None:
        raise RegionError(f"{launch.label}: no region rule for kernel {launch.function!r}; hint: "
                          "add one to plan/launches/regions.py RULES from the kernel's contract")
    reads, writes = rule(_Shape(profile, launch), launch)
    return LaunchRegions(tuple(reads), tuple(writes))
