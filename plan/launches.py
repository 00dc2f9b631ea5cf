"""The three submissions' launch lists as data (SPEC §6–§7): kernel, grid, arguments by name.

Each argument is a buffer reference (buffer name + element offset, see plan/buffers.py), a
staging reference (a staging/layout.py offset, never a raw address), a scalar, or a run scalar the
backend fills at instantiation (`t_base`).  A launch's `kernel` names its manifest entry
(kernels_ptx/<profile>/<target>/manifest.json); `module`/`function`/`constexprs`/`num_warps`/
`num_stages` are what tools/build_ptx.py compiles for it.  Every submission is
release(pre-launch slot), its kernels, release(final slot).  No Triton import here.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from plan import profiles as _profiles
from plan.buffers import DTYPE_BYTES, buffers, norm_points, qkv_width
from plan.kernels import meta
from staging import layout as SL

POINTER_ALIGN = 16          # bytes: pointer arguments specialized as 16-byte aligned when they are
INT_DIVISOR = 16            # integer arguments specialized as multiples of 16 when they are
RELEASE = "release"         # the hand-written PTX kernel (plan/kernels/release.ptx)


# ---------------------------------------------------------------- argument kinds

@dataclass(frozen=True)
class BufferRef:
    buffer: str
    offset: int = 0             # elements
    dtype: str = "fp32"         # the buffer's element type

    @property
    def signature(self) -> str:
        return "*" + self.dtype

    @property
    def byte_offset(self) -> int:
        return self.offset * DTYPE_BYTES[self.dtype]


@dataclass(frozen=True)
class StagingRef:
    field: str                  # the staging/layout.py name, for people: "LOSS_RECORD", "loss_window(0)"
    offset: int                 # bytes from the staging base
    dtype: str = "fp32"

    @property
    def signature(self) -> str:
        return "*" + self.dtype


@dataclass(frozen=True)
class Scalar:
    type: str                   # "i32" | "i64" | "fp32"
    value: int | float

    @property
    def signature(self) -> str:
        return self.type


@dataclass(frozen=True)
class RunScalar:
    name: str                   # "t_base"
    type: str = "i64"

    @property
    def signature(self) -> str:
        return self.type


Arg = BufferRef | StagingRef | Scalar | RunScalar


@dataclass(frozen=True)
class Launch:
    kernel: str                                  # manifest entry name
    module: str                                  # "plan.kernels.matmul" ("" for release)
    function: str                                # Triton function name, or "release"
    grid: tuple[int, int, int]
    args: tuple[tuple[str, Arg], ...]            # (parameter name, value) in parameter order
    constexprs: tuple[tuple[str, object], ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    label: str = ""                              # the model stage, e.g. "layers.0.qkv"

    def arg(self, name: str) -> Arg:
        for n, a in self.args:
            if n == name:
                return a
        raise KeyError(f"{self.kernel} has no argument {name!r}")


@dataclass(frozen=True)
class Submission:
    index: int
    name: str
    launches: tuple[Launch, ...]


def specialization(args) -> tuple[int, ...]:
    """Indices of the arguments compiled as 16-divisible (pointers: byte address; ints: value).

    Buffer bases are 256-byte aligned and the staging base page-aligned, so a pointer's
    alignment is its offset's."""
    out = []
    for i, (_, a) in enumerate(args):
        if isinstance(a, BufferRef) and a.byte_offset % POINTER_ALIGN == 0:
            out.append(i)
        elif isinstance(a, StagingRef) and a.offset % POINTER_ALIGN == 0:
            out.append(i)
        elif isinstance(a, Scalar) and a.type in ("i32", "i64") and a.value % INT_DIVISOR == 0:
            out.append(i)
    return tuple(out)


def entry_name(function: str, args, constexprs, num_warps: int, num_stages: int) -> str:
    """A stable manifest key per compiled specialization: function + digest of what shapes it."""
    key = repr((function, tuple((n, a.signature) for n, a in args), specialization(args),
                tuple(constexprs), num_warps, num_stages))
    return f"{function}_{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _launch(module: str, function: str, grid, args: dict, constexprs: dict | None = None,
            num_warps: int = 4, num_stages: int = 3, label: str = "") -> Launch:
    grid = tuple(grid) + (1,) * (3 - len(grid))
    a = tuple(args.items())
    c = tuple((constexprs or {}).items())
    return Launch(entry_name(function, a, c, num_warps, num_stages), module, function, grid, a, c,
                  num_warps, num_stages, label)


# ---------------------------------------------------------------- tuning per profile

@dataclass(frozen=True)
class Tuning:
    """Meta-parameters.  Production: H200 (132 SMs; ≥ ~128 programs per launch where the shape
    allows).  tiny: few, large programs, because the interpreter pays per program."""
    mm_tiles: tuple[tuple[int, int], ...]        # (BLOCK_M, BLOCK_N) candidates, largest first
    mm_min_programs: int
    mm_block_k: int
    mm_warps: int
    mm_stages: int
    rows: int                                    # rows per program of the norm kernels
    rows_warps: int
    attn_m: int
    attn_n: int
    attn_warps: int
    ce_rows: int
    ce_warps: int
    adamw_block: int
    adamw_warps: int
    vocab_block: int                             # embed_grad vocabulary rows per program
    gain_cols: int
    gain_rows: int
    copy_block: int = 1024
    swiglu_bwd_tiles: tuple[tuple[int, int], ...] = ()   # SwiGLU-backward tiles ((): mm_tiles)


H200 = Tuning(mm_tiles=((128, 128), (128, 64), (64, 64)), mm_min_programs=120, mm_block_k=64,
              mm_warps=8, mm_stages=3, rows=4, rows_warps=4, attn_m=64, attn_n=64, attn_warps=4,
              ce_rows=1, ce_warps=16, adamw_block=2048, adamw_warps=8, vocab_block=16,
              gain_cols=32, gain_rows=64,
              # 128×128 spilled 360 B (ptxas -v: 255 registers, the epilogue holds dz, a, b, σ);
              # 128×64 keeps it in registers
              swiglu_bwd_tiles=((128, 64), (64, 64)))
# tiny keeps GPU-valid shapes (≤ 128 KiB shared memory: sm_80's 163 KiB and sm_90's 227 KiB hold
# it) while the interpreter sees few programs: 128×128×128 matmul tiles, one stage.
INTERPRETER = Tuning(mm_tiles=((128, 128),), mm_min_programs=1, mm_block_k=128, mm_warps=8,
                     mm_stages=1, rows=128, rows_warps=8, attn_m=128, attn_n=128, attn_warps=8,
                     ce_rows=32, ce_warps=8, adamw_block=16384, adamw_warps=8, vocab_block=64,
                     gain_cols=128, gain_rows=128)
TUNING = {"coppelius": H200, "tiny": INTERPRETER}


def tuning(profile) -> Tuning:
    return TUNING.get(profile.name, H200)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


# ---------------------------------------------------------------- builder

class _Plan:
    """Builds launches for one profile; element offsets come from profile.parameters."""

    def __init__(self, profile):
        self.p = profile
        self.tu = tuning(profile)
        self.bufs = buffers(profile)
        self.T, self.D, self.V, self.F = profile.context, profile.width, profile.vocab, profile.hidden
        self.W = qkv_width(profile)
        self.N = profile.parameter_count
        self.scale = float(np.float32(1.0 / math.sqrt(profile.head_dim)))

    # -- references
    def buf(self, name: str, offset: int = 0) -> BufferRef:
        spec = self.bufs[name]
        if not 0 <= offset < spec.elements:
            raise ValueError(f"offset {offset} outside buffer {name} ({spec.elements} elements)")
        return BufferRef(name, offset, spec.dtype)

    def param(self, name: str, plane: str = "pmv", plane_index: int = 0) -> BufferRef:
        off = self.p.parameter(name).offset
        if plane == "pmv":
            off += plane_index * self.N
        return self.buf(plane, off)

    def slab(self, name: str, index: int) -> BufferRef:
        spec = self.bufs[name]
        per = spec.elements // spec.shape[0]
        return self.buf(name, index * per)

    def rstd(self, site: int | None) -> BufferRef:
        """site None: the embed norm; else norm site s (2l attention, 2l+1 MLP, 2L final)."""
        return self.slab("rstd", 0 if site is None else site + 1)

    @staticmethod
    def i32(v: int) -> Scalar:
        return Scalar("i32", int(v))

    # -- kernels
    def release(self, submission: int, which: int) -> Launch:
        slot = SL.semaphore_slot(submission) + which
        part = "SLOT_PRELAUNCH_RELEASE" if which == SL.SLOT_PRELAUNCH_RELEASE else "SLOT_FINAL_RELEASE"
        args = (("doorbell_ptr", StagingRef("DOORBELL", SL.DOORBELL, "u32")),
                ("slot_ptr", StagingRef(f"semaphore_slot({submission}) + {part}", slot, "u32")))
        return Launch(RELEASE, "", RELEASE, (1, 1, 1), args, (), 1, 1,
                      "prelaunch_release" if which == SL.SLOT_PRELAUNCH_RELEASE else "final_release")

    def tile(self, M, N, tiles=None, heads=1):
        """(BLOCK_M, BLOCK_N, programs): the first candidate with enough programs; `heads` > 1
        keeps only tiles whose columns hold whole heads (fused per-head epilogues)."""
        tu = self.tu
        fits = [(bm, bn) for bm, bn in (tiles or tu.mm_tiles) if bn % heads == 0]
        if not fits:
            raise ValueError(f"no matmul tile holds whole heads of {heads} columns")
        for bm, bn in fits:
            programs = -(-M // bm) * -(-N // bn)
            if programs >= tu.mm_min_programs:
                break
        return bm, bn, programs

    def mm_shape(self, bm, bn):
        """(num_warps, num_stages) of a matmul tile: small tiles get 4 warps and one more stage."""
        tu = self.tu
        stages = tu.mm_stages if bm * bn > 64 * 64 or tu.mm_stages == 1 else tu.mm_stages + 1
        return (tu.mm_warps if bm * bn > 64 * 64 else 4), stages

    def matmul(self, a, b, c, aux, M, N, K, a_t, b_t, epilogue, label):
        tu = self.tu
        tiles = tu.swiglu_bwd_tiles if epilogue == meta.EPI_SWIGLU_BWD else None
        bm, bn, programs = self.tile(M, N, tiles)
        return _launch("plan.kernels.matmul", "matmul", (programs,),
                       {"a_ptr": a, "b_ptr": b, "c_ptr": c, "aux_ptr": aux,
                        "M": self.i32(M), "N": self.i32(N), "K": self.i32(K)},
                       {"A_T": bool(a_t), "B_T": bool(b_t), "EPILOGUE": epilogue,
                        "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": tu.mm_block_k, "GROUP_M": 8},
                       *self.mm_shape(bm, bn), label)

    def matmul_rotary(self, x, w, qkv, h16, rstd, label):
        """qkv16 = bf(rotary(bf(rmsnorm(x)) @ bf(Wq|Wk|Wv)ᵀ)): the norm in the prologue (h16, rstd
        stored), rotary in the epilogue."""
        p = self.p
        M, N, K = self.T, self.W, self.D
        bm, bn, programs = self.tile(M, N, heads=p.head_dim)
        return _launch("plan.kernels.matmul", "matmul_rotary", (programs,),
                       {"x_ptr": x, "w_ptr": w, "qkv_ptr": qkv, "rope_ptr": self.buf("rope"),
                        "h16_ptr": h16, "rstd_ptr": rstd,
                        "M": self.i32(M), "N": self.i32(N), "K": self.i32(K)},
                       {"ROTATED": p.heads + p.kv_heads, "HEAD_DIM": p.head_dim,
                        "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": self.tu.mm_block_k, "GROUP_M": 8},
                       *self.mm_shape(bm, bn), label)

    def matmul_delta(self, dres16, wo, do, o32, delta, label):
        """do = bf(dres) @ bf(Wo) (fp32) and delta = rowsum(do·o) per head in the epilogue."""
        p = self.p
        M, N, K = self.T, p.q_width, self.D
        bm, bn, programs = self.tile(M, N, heads=p.head_dim)
        return _launch("plan.kernels.matmul", "matmul_delta", (programs,),
                       {"a_ptr": dres16, "b_ptr": wo, "do_ptr": do, "o_ptr": o32, "delta_ptr": delta,
                        "M": self.i32(M), "N": self.i32(N), "K": self.i32(K)},
                       {"HEAD_DIM": p.head_dim, "BLOCK_M": bm, "BLOCK_N": bn,
                        "BLOCK_K": self.tu.mm_block_k, "GROUP_M": 8},
                       *self.mm_shape(bm, bn), label)

    def matmul_swiglu(self, x, wg, wu, ab, z, h16, rstd, label):
        """rmsnorm(x) in the prologue (h16, rstd stored), gate and up products, SwiGLU."""
        tu = self.tu
        M, N, K = self.T, self.F, self.D
        bm, bn, programs = self.tile(M, N)
        return _launch("plan.kernels.matmul", "matmul_swiglu", (programs,),
                       {"x_ptr": x, "wg_ptr": wg, "wu_ptr": wu, "ab_ptr": ab, "z_ptr": z,
                        "h16_ptr": h16, "rstd_ptr": rstd,
                        "M": self.i32(M), "N": self.i32(N), "K": self.i32(K)},
                       {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": tu.mm_block_k, "GROUP_M": 8},
                       tu.mm_warps, tu.mm_stages, label)

    def matmul_norm(self, x, g, w, c, h16, rstd, M, N, K, label):
        """c = bf(rmsnorm(x)·g) @ bf(W)ᵀ (fp32), the norm in the prologue (h16, rstd stored)."""
        bm, bn, programs = self.tile(M, N)
        return _launch("plan.kernels.matmul", "matmul_norm", (programs,),
                       {"x_ptr": x, "g_ptr": g, "w_ptr": w, "c_ptr": c, "h16_ptr": h16,
                        "rstd_ptr": rstd, "M": self.i32(M), "N": self.i32(N), "K": self.i32(K)},
                       {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": self.tu.mm_block_k, "GROUP_M": 8},
                       *self.mm_shape(bm, bn), label)

    def rows_grid(self, rows):
        return (-(-self.T // rows),)

    def rmsnorm_bwd(self, dy, x, rstd, g, dx, dx16, has_gain, accumulate, write_bf16, label):
        return _launch("plan.kernels.norms", "rmsnorm_bwd", self.rows_grid(self.tu.rows),
                       {"dy_ptr": dy, "x_ptr": x, "rstd_ptr": rstd, "g_ptr": g, "dx_ptr": dx,
                        "dx16_ptr": dx16, "T": self.i32(self.T)},
                       {"D": self.D, "HAS_GAIN": has_gain, "ACCUMULATE": accumulate,
                        "WRITE_BF16": write_bf16, "BLOCK_R": self.tu.rows, "BLOCK_D": _pow2(self.D)},
                       self.tu.rows_warps, 1, label)

    def rmsnorm_bwd_gain(self, dy, x, rstd, g, dx, dx16, dg, write_bf16, label):
        """A gained norm's backward: dx (and dx16) by row blocks and dg by column blocks, side by
        side in one grid (the two halves only read what they share)."""
        tu = self.tu
        cols = min(tu.gain_cols, _pow2(self.D))
        grid = (self.rows_grid(tu.rows)[0] + -(-self.D // cols),)
        return _launch("plan.kernels.norms", "rmsnorm_bwd_gain", grid,
                       {"dy_ptr": dy, "x_ptr": x, "rstd_ptr": rstd, "g_ptr": g, "dx_ptr": dx,
                        "dx16_ptr": dx16, "dg_ptr": dg, "T": self.i32(self.T)},
                       {"D": self.D, "WRITE_BF16": write_bf16, "BLOCK_R": tu.rows,
                        "BLOCK_D": _pow2(self.D), "GAIN_ROWS": tu.gain_rows, "GAIN_COLS": cols},
                       tu.rows_warps, 1, label)

    def copy(self, src, dst, n, label):
        blk = self.tu.copy_block
        return _launch("plan.kernels.copy", "copy_f32", (-(-n // blk),),
                       {"src_ptr": src, "dst_ptr": dst, "N": self.i32(n)}, {"BLOCK": blk}, 4, 1, label)

    def attention_consts(self):
        tu, p = self.tu, self.p
        if self.T % tu.attn_m or self.T % tu.attn_n or tu.attn_m % tu.attn_n:
            raise ValueError(f"attention blocks {tu.attn_m}×{tu.attn_n} do not tile T={self.T}")
        return {"SCALE": self.scale, "HEADS": p.heads, "KV_HEADS": p.kv_heads,
                "HEAD_DIM": p.head_dim, "BLOCK_M": tu.attn_m, "BLOCK_N": tu.attn_n}

    # -- the model
    def forward(self) -> list[Launch]:
        p, tu = self.p, self.tu
        T, D, F, W = self.T, self.D, self.F, self.W
        Hd = p.q_width
        out = [_launch("plan.kernels.norms", "embed_fwd", self.rows_grid(tu.rows),
                       {"ids_ptr": StagingRef("INPUTS", SL.INPUTS, "u32"),
                        "table_ptr": self.param("embed"),
                        "g_ptr": self.param("g_embed"), "emb_ptr": self.buf("emb"),
                        "rstd_ptr": self.rstd(None), "x_ptr": self.slab("resid", 0),
                        "rope_ptr": self.buf("rope"), "next_ptr": self.buf("next_row"),
                        "T": self.i32(T)},
                       {"D": self.D, "HEAD_DIM": p.head_dim, "BLOCK_R": tu.rows,
                        "BLOCK_D": _pow2(self.D), "BLOCK_T": _pow2(T)}, tu.rows_warps, 1, "embed")]
        for l in range(p.layers):
            L = f"layers.{l}."
            s_attn, s_mlp = 2 * l, 2 * l + 1
            out.append(self.matmul_rotary(self.slab("resid", s_attn), self.param(L + "wq", "w16"),
                                          self.slab("qkv16", l), self.slab("h16", s_attn),
                                          self.rstd(s_attn), L + "norm+qkv+rotary"))
            out.append(_launch("plan.kernels.attention", "attention_fwd",
                               (T // tu.attn_m, p.heads),
                               {"qkv_ptr": self.slab("qkv16", l), "o16_ptr": self.slab("o16", l),
                                "o32_ptr": self.slab("o32", l), "lse_ptr": self.slab("lse", l),
                                "T": self.i32(T)},
                               self.attention_consts(), tu.attn_warps, 2, L + "attention"))
            out.append(self.matmul(self.slab("o16", l), self.param(L + "wo", "w16"),
                                   self.slab("resid", s_mlp), self.slab("resid", s_attn),
                                   T, D, Hd, 0, 1, meta.EPI_RESIDUAL, L + "out_proj"))
            out.append(self.matmul_swiglu(self.slab("resid", s_mlp), self.param(L + "wgate", "w16"),
                                          self.param(L + "wup", "w16"), self.slab("ab", l),
                                          self.slab("z16", l), self.slab("h16", s_mlp),
                                          self.rstd(s_mlp), L + "mlp.norm+swiglu"))
            out.append(self.matmul(self.slab("z16", l), self.param(L + "wdown", "w16"),
                                   self.slab("resid", s_mlp + 1), self.slab("resid", s_mlp),
                                   T, D, F, 0, 1, meta.EPI_RESIDUAL, L + "mlp.down"))
        last = norm_points(p) - 1
        out.append(self.matmul_norm(self.slab("resid", last), self.param("g_final"),
                                    self.param("head", "w16"), self.buf("logits"),
                                    self.slab("h16", last), self.rstd(last), T, self.V, D,
                                    "final_norm+head"))
        return out

    def backward(self) -> list[Launch]:
        p, tu = self.p, self.tu
        T, D, V, F, W = self.T, self.D, self.V, self.F, self.W
        Hd = p.q_width
        last = norm_points(p) - 1
        out = [_launch("plan.kernels.cross_entropy", "cross_entropy", (-(-T // tu.ce_rows),),
                       {"logits_ptr": self.buf("logits"),
                        "targets_ptr": StagingRef("TARGETS", SL.TARGETS, "u32"),
                        "loss_ptr": StagingRef("LOSS_RECORD", SL.LOSS_RECORD),
                        "w0_ptr": StagingRef("loss_window(W0_LAST_CE)", SL.loss_window(SL.W0_LAST_CE)),
                        "dlogits_ptr": self.buf("dlogits16"), "T": self.i32(T)},
                       {"V": V, "ROWS": tu.ce_rows, "BLOCK_V": _pow2(V)}, tu.ce_warps, 1,
                       "cross_entropy")]
        # head and final norm
        out.append(self.matmul(self.buf("dlogits16"), self.slab("h16", last), self.param("head", "grad"),
                               self.buf("dn"), V, D, T, 1, 0, meta.EPI_F32, "head_backward.dW"))
        out.append(self.matmul(self.buf("dlogits16"), self.param("head", "w16"), self.buf("dn"),
                               self.buf("dn"), T, D, V, 0, 0, meta.EPI_F32, "head_backward.dx"))
        out.append(self.rmsnorm_bwd_gain(self.buf("dn"), self.slab("resid", last), self.rstd(last),
                                         self.param("g_final"), self.buf("dres"), self.buf("dres16"),
                                         self.param("g_final", "grad"), True, "final_norm_backward+dg"))
        for l in reversed(range(p.layers)):
            L = f"layers.{l}."
            s_attn, s_mlp = 2 * l, 2 * l + 1
            # MLP
            out.append(self.matmul(self.buf("dres16"), self.slab("z16", l), self.param(L + "wdown", "grad"),
                                   self.buf("dn"), D, F, T, 1, 0, meta.EPI_F32, L + "mlp_backward.dWdown"))
            out.append(self.matmul(self.buf("dres16"), self.param(L + "wdown", "w16"), self.buf("dab16"),
                                   self.slab("ab", l), T, F, D, 0, 0, meta.EPI_SWIGLU_BWD,
                                   L + "mlp_backward.swiglu"))
            out.append(self.matmul(self.buf("dab16"), self.slab("h16", s_mlp), self.param(L + "wgate", "grad"),
                                   self.buf("dn"), 2 * F, D, T, 1, 0, meta.EPI_F32,
                                   L + "mlp_backward.dWgate_up"))
            out.append(self.matmul(self.buf("dab16"), self.param(L + "wgate", "w16"), self.buf("dn"),
                                   self.buf("dn"), T, D, 2 * F, 0, 0, meta.EPI_F32, L + "mlp_backward.dh"))
            out.append(self.rmsnorm_bwd(self.buf("dn"), self.slab("resid", s_mlp), self.rstd(s_mlp),
                                        self.param("g_final"), self.buf("dres"), self.buf("dres16"),
                                        False, True, True, L + "mlp_backward.norm"))
            # attention
            out.append(self.matmul(self.buf("dres16"), self.slab("o16", l), self.param(L + "wo", "grad"),
                                   self.buf("dn"), D, Hd, T, 1, 0, meta.EPI_F32, L + "out_proj_backward.dWo"))
            out.append(self.matmul_delta(self.buf("dres16"), self.param(L + "wo", "w16"), self.buf("do32"),
                                         self.slab("o32", l), self.buf("delta"),
                                         L + "out_proj_backward.do+delta"))
            bwd_args = {"qkv_ptr": self.slab("qkv16", l), "do_ptr": self.buf("do32"),
                        "lse_ptr": self.slab("lse", l), "delta_ptr": self.buf("delta"),
                        "rope_ptr": self.buf("rope"), "dqkv_ptr": self.buf("dqkv16"), "T": self.i32(T)}
            out.append(_launch("plan.kernels.attention", "attention_bwd",
                               (T // tu.attn_n * p.kv_heads + T // tu.attn_m * p.heads,), bwd_args,
                               self.attention_consts(), tu.attn_warps, 2, L + "attention_backward"))
            out.append(self.matmul(self.buf("dqkv16"), self.slab("h16", s_attn), self.param(L + "wq", "grad"),
                                   self.buf("dn"), W, D, T, 1, 0, meta.EPI_F32, L + "qkv_backward.dW"))
            out.append(self.matmul(self.buf("dqkv16"), self.param(L + "wq", "w16"), self.buf("dn"),
                                   self.buf("dn"), T, D, W, 0, 0, meta.EPI_F32, L + "qkv_backward.dh"))
            out.append(self.rmsnorm_bwd(self.buf("dn"), self.slab("resid", s_attn), self.rstd(s_attn),
                                        self.param("g_final"), self.buf("dres"), self.buf("dres16"),
                                        False, True, True, L + "qkv_backward.norm"))
        # embedding
        ids = StagingRef("INPUTS", SL.INPUTS, "u32")
        out.append(self.rmsnorm_bwd_gain(self.buf("dres"), self.buf("emb"), self.rstd(None),
                                         self.param("g_embed"), self.buf("de"), self.buf("de"),
                                         self.param("g_embed", "grad"), False, "embed_backward.norm+dg"))
        # the next-row links were written by embed_fwd (forward, same submission)
        out.append(_launch("plan.kernels.embed_grad", "embed_grad", (-(-V // tu.vocab_block),),
                           {"ids_ptr": ids, "next_ptr": self.buf("next_row"), "de_ptr": self.buf("de"),
                            "de_table_ptr": self.param("embed", "grad"),
                            "w1_ptr": StagingRef("loss_window(W1_EMBED_GRAD)",
                                                 SL.loss_window(SL.W1_EMBED_GRAD)),
                            "T": self.i32(T), "V": self.i32(V)},
                           {"D": D, "W1_WORDS": SL.LOSS_WINDOW_WORDS, "BLOCK_V": tu.vocab_block,
                            "BLOCK_T": _pow2(T), "BLOCK_D": _pow2(D)}, 4, 1, "embed_backward.dE+w1"))
        return out

    def adamw(self) -> Launch:
        p, tu, lr = self.p, self.tu, self.p.learner
        gains = [q for q in p.parameters if not q.decay]
        if len(gains) != 2:
            raise ValueError(f"profile {p.name}: AdamW expects two undecayed ranges, got {len(gains)}")
        f32 = lambda x: float(np.float32(x))                                     # noqa: E731
        frac = lambda r: r.numerator / r.denominator                             # noqa: E731
        one_minus = lambda r: (r.denominator - r.numerator) / r.denominator      # noqa: E731
        embed = p.parameter("embed")
        consts = {"GAIN0_START": gains[0].offset, "GAIN0_END": gains[0].end,
                  "GAIN1_START": gains[1].offset, "GAIN1_END": gains[1].end,
                  "EMBED_START": embed.offset, "EMBED_END": embed.end,
                  "LR": frac(lr.lr), "BETA1_F64": frac(lr.beta1), "BETA2_F64": frac(lr.beta2),
                  "DECAY": f32((lr.lr.denominator * lr.decay.denominator
                                - lr.lr.numerator * lr.decay.numerator)
                               / (lr.lr.denominator * lr.decay.denominator)),
                  "BETA1": f32(frac(lr.beta1)), "ONE_MINUS_BETA1": f32(one_minus(lr.beta1)),
                  "BETA2": f32(frac(lr.beta2)), "ONE_MINUS_BETA2": f32(one_minus(lr.beta2)),
                  "EPS": f32(frac(lr.epsilon)), "BLOCK": tu.adamw_block}
        return _launch("plan.kernels.adamw", "adamw", (-(-self.N // tu.adamw_block),),
                       {"pmv_ptr": self.buf("pmv"), "grad_ptr": self.buf("grad"),
                        "w16_ptr": self.buf("w16"),
                        "doorbell_ptr": StagingRef("DOORBELL", SL.DOORBELL, "u32"),
                        "t_base": RunScalar("t_base", "i64"), "N": self.i32(self.N)},
                       consts, tu.adamw_warps, 1, "adamw")

    def records(self, rows, dst_offset: int, field: str) -> list[Launch]:
        V = self.V
        return [self.copy(self.buf("logits", r * V), StagingRef(f"{field} + {i}·V·4", dst_offset + 4 * i * V),
                          V, f"record.row{r}") for i, r in enumerate(rows)]

    def predictions(self) -> Launch:
        r0, r1, r2 = _profiles.PREDICTION_ROWS
        return _launch("plan.kernels.cross_entropy", "predictions", (SL.PREDICTION_COUNT,),
                       {"logits_ptr": self.buf("logits"),
                        "pred_ptr": StagingRef("PREDICTIONS", SL.PREDICTIONS, "u32")},
                       {"V": self.V, "ROW0": r0, "ROW1": r1, "ROW2": r2, "BLOCK_V": _pow2(self.V)},
                       self.tu.ce_warps, 1, "predictions")

    def submissions(self) -> tuple[Submission, Submission, Submission]:
        p = self.p
        SL.check_layout(p)
        blk = self.tu.adamw_block
        cast = _launch("plan.kernels.adamw", "cast_bf16", (-(-self.N // blk),),
                       {"src_ptr": self.buf("pmv"), "dst_ptr": self.buf("w16"), "N": self.i32(self.N)},
                       {"BLOCK": blk}, self.tu.adamw_warps, 1, "refresh_w16")
        forward = [cast] + self.forward() \
            + self.records(_profiles.PREDICTION_ROWS, SL.record_forward_offset(p), "record_forward_offset") \
            + [self.predictions()]
        update = self.forward() + self.backward() + [self.adamw()]
        e = p.parameter("embed").offset
        final = self.forward() \
            + self.records(_profiles.PREDICTION_ROWS[-1:], SL.record_final_offset(p), "record_final_offset") \
            + [self.predictions(),
               self.copy(self.buf("pmv", e), StagingRef("loss_window(W2_EMBED_FINAL)",
                                                        SL.loss_window(SL.W2_EMBED_FINAL)),
                         SL.LOSS_WINDOW_WORDS, "w2"),
               self.copy(self.buf("pmv", self.N + e), StagingRef("loss_window(W3_EMBED_M_FINAL)",
                                                                 SL.loss_window(SL.W3_EMBED_M_FINAL)),
                         SL.LOSS_WINDOW_WORDS, "w3")]
        out = []
        for index, body in enumerate((forward, update, final)):
            launches = ([self.release(index, SL.SLOT_PRELAUNCH_RELEASE)] + body
                        + [self.release(index, SL.SLOT_FINAL_RELEASE)])
            out.append(Submission(index, SL.SUBMISSIONS[index], tuple(launches)))
        return tuple(out)


def submissions(profile) -> tuple[Submission, Submission, Submission]:
    """(forward, update, final) for a profile (SPEC §7)."""
    return _Plan(profile).submissions()


def kernels(profile) -> dict[str, Launch]:
    """One launch per distinct compiled specialization (manifest entry), first use first."""
    out: dict[str, Launch] = {}
    for sub in submissions(profile):
        for launch in sub.launches:
            out.setdefault(launch.kernel, launch)
    return out


__all__ = ["BufferRef", "StagingRef", "Scalar", "RunScalar", "Launch", "Submission", "buffers",
           "submissions", "kernels", "specialization", "entry_name", "tuning", "RELEASE"]
