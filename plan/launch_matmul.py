"""Launch builders of the matmul family (plan/kernels/matmul.py): tile choice, then one launch each.

Every builder takes its buffers by keyword (the kernel's `*_ptr` names without the suffix) and
derives grid, tile and warps from the profile's tuning.  Plain data: no Triton.
"""
from __future__ import annotations

from plan.kernels import meta
from plan.launch_refs import Context
from plan.launch_types import BufferRef, Launch, cdiv, i32, triton_launch
from plan.tuning import GROUP_M

MODULE = "plan.kernels.matmul"
# tiles of at most this many elements get 4 warps and one more pipeline stage
SMALL_TILE = 64 * 64


def tile(ctx: Context, M: int, N: int, tiles=None, heads: int = 1) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, programs): the first candidate with enough programs; `heads` > 1
    keeps only tiles whose columns hold whole heads (fused per-head epilogues)."""
    tu = ctx.tu
    fits = [(bm, bn) for bm, bn in (tiles or tu.mm_tiles) if bn % heads == 0]
    if not fits:
        raise ValueError(f"no matmul tile holds whole heads of {heads} columns; "
                         f"hint: add a tile with BLOCK_N a multiple of {heads} to the tuning")
    for bm, bn in fits:
        programs = cdiv(M, bm) * cdiv(N, bn)
        if programs >= tu.mm_min_programs:
            break
    return bm, bn, programs


def warps_stages(ctx: Context, bm: int, bn: int) -> tuple[int, int]:
    """(num_warps, num_stages) of a matmul tile: small tiles get 4 warps and one more stage."""
    tu = ctx.tu
    small = bm * bn <= SMALL_TILE
    stages = tu.mm_stages + 1 if small and tu.mm_stages != 1 else tu.mm_stages
    return (4 if small else tu.mm_warps), stages


def _tiled(ctx: Context, function: str, args: dict, constexprs: dict, M: int, N: int, K: int,
           label: str, tiles=None, heads: int = 1, shape=None) -> Launch:
    """A matmul-family launch over (M, N) output tiles: tile chosen, M/N/K appended to the
    arguments, the block constexprs to the kernel's own; `shape` overrides (warps, stages)."""
    bm, bn, programs = tile(ctx, M, N, tiles, heads)
    num_warps, num_stages = shape or warps_stages(ctx, bm, bn)
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": ctx.tu.mm_block_k, "GROUP_M": GROUP_M}
    return triton_launch(MODULE, function, (programs,), args | {"M": i32(M), "N": i32(N), "K": i32(K)},
                         constexprs | blocks, num_warps=num_warps, num_stages=num_stages, label=label)


def matmul(ctx: Context, *, a: BufferRef, b: BufferRef, c: BufferRef, aux: BufferRef,
           M: int, N: int, K: int, epilogue: int, label: str,
           a_transposed: bool = False, b_transposed: bool = False) -> Launch:
    """c (M, N) = epilogue(bf(A) @ bf(B)); A stored (K, M) when a_transposed, B (N, K) when
    b_transposed.  aux: the residual (EPI_RESIDUAL), [a | b] (EPI_SWIGLU_BWD), else unread."""
    return _tiled(ctx, "matmul", {"a_ptr": a, "b_ptr": b, "c_ptr": c, "aux_ptr": aux},
                  {"A_T": bool(a_transposed), "B_T": bool(b_transposed), "EPILOGUE": epilogue},
                  M, N, K, label,
                  tiles=ctx.tu.swiglu_bwd_tiles if epilogue == meta.EPI_SWIGLU_BWD else None)


def matmul_rotary(ctx: Context, *, x, w, qkv, h16, rstd, label: str) -> Launch:
    """qkv16 = bf(rotary(bf(rmsnorm(x)) @ bf(Wq|Wk|Wv)ᵀ)): the norm in the prologue (h16, rstd
    stored), rotary in the epilogue; column tiles hold whole heads."""
    p = ctx.p
    return _tiled(ctx, "matmul_rotary",
                  {"x_ptr": x, "w_ptr": w, "qkv_ptr": qkv, "rope_ptr": ctx.buf("rope"),
                   "h16_ptr": h16, "rstd_ptr": rstd},
                  {"ROTATED": p.heads + p.kv_heads, "HEAD_DIM": p.head_dim},
                  ctx.T, ctx.W, ctx.D, label, heads=p.head_dim)


def matmul_delta(ctx: Context, *, dres16, wo, do, o32, delta, label: str) -> Launch:
    """do = bf(dres) @ bf(Wo) (fp32) and delta = rowsum(do·o) per head in the epilogue; column
    tiles hold whole heads."""
    p = ctx.p
    return _tiled(ctx, "matmul_delta",
                  {"a_ptr": dres16, "b_ptr": wo, "do_ptr": do, "o_ptr": o32, "delta_ptr": delta},
                  {"HEAD_DIM": p.head_dim}, ctx.T, p.q_width, ctx.D, label, heads=p.head_dim)


def matmul_swiglu(ctx: Context, *, x, wg, wu, ab, z, h16, rstd, label: str) -> Launch:
    """rmsnorm(x) in the prologue (h16, rstd stored), gate and up products, SwiGLU."""
    return _tiled(ctx, "matmul_swiglu",
                  {"x_ptr": x, "wg_ptr": wg, "wu_ptr": wu, "ab_ptr": ab, "z_ptr": z,
                   "h16_ptr": h16, "rstd_ptr": rstd}, {}, ctx.T, ctx.F, ctx.D, label,
                  shape=(ctx.tu.mm_warps, ctx.tu.mm_stages))   # the tuning's shape whatever the tile


def matmul_norm(ctx: Context, *, x, g, w, c, h16, rstd, label: str) -> Launch:
    """logits = bf(rmsnorm(x)·g) @ bf(Whead)ᵀ (fp32), the norm in the prologue (h16, rstd stored)."""
    return _tiled(ctx, "matmul_norm",
                  {"x_ptr": x, "g_ptr": g, "w_ptr": w, "c_ptr": c, "h16_ptr": h16, "rstd_ptr": rstd},
                  {}, ctx.T, ctx.V, ctx.D, label)
