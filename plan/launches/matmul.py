"""Launch builders of the matmul family (plan/kernels/matmul.py): tile choice, then one launch each.

Every builder takes its buffers by keyword (the kernel's `*_ptr` names without the suffix) and
derives grid, tile and warps from the profile's tuning.  Plain data: no Triton.
"""
from __future__ import annotations

from coppelius.plan.kernels import meta
from coppelius.plan.launches.builders import learner_constexprs
from coppelius.plan.launches.refs import Context
from coppelius.plan.ints import cdiv
from coppelius.plan.launches.types import BufferRef, Launch, RunScalar, i32, triton_launch
from coppelius.plan.tuning import GROUP_M, choose_tile, ssq_parts

MODULE = "coppelius.plan.kernels.matmul"
# tiles of at most this many elements get 4 warps and one more pipeline stage
SMALL_TILE = 64 * 64


def tile(ctx: Context, M: int, N: int, tiles=None, heads: int = 1) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, programs): the first candidate with enough programs; `heads` > 1
    keeps only tiles whose columns hold whole heads (fused per-head epilogues)."""
    return choose_tile(ctx.tu, M, N, tiles, heads)


def warps_stages(ctx: Context, bm: int, bn: int) -> tuple[int, int]:
    """(num_warps, num_stages) of a matmul tile: small tiles get 4 warps and one more stage."""
    tu = ctx.tu
    small = bm * bn <= SMALL_TILE
    stages = tu.mm_stages + 1 if small and tu.mm_stages != 1 else tu.mm_stages
    return (4 if small else tu.mm_warps), stages


def _tiled(ctx: Context, function: str, args: dict, constexprs: dict, M: int, N: int, K: int,
           label: str, tiles=None, heads: int = 1, shape=None, split_k: int = 1,
           block_k: int = 0) -> Launch:
    """A matmul-family launch over (M, N) output tiles (× split_k K ranges): tile chosen, M/N/K
    appended to the arguments, the block constexprs to the kernel's own; `shape` overrides
    (warps, stages), `block_k` the tuning's K block."""
    bm, bn, programs = tile(ctx, M, N, tiles, heads)
    num_warps, num_stages = shape or warps_stages(ctx, bm, bn)
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": block_k or ctx.tu.mm_block_k,
              "GROUP_M": GROUP_M}
    return triton_launch(MODULE, function, (programs * split_k,),
                         args | {"M": i32(M), "N": i32(N), "K": i32(K)},
                         constexprs | blocks, num_warps=num_warps, num_stages=num_stages, label=label)


def matmul(ctx: Context, *, a: BufferRef, b: BufferRef, c: BufferRef, aux: BufferRef,
           M: int, N: int, K: int, epilogue: int, label: str,
           a_transposed: bool = False, b_transposed: bool = False, tiles=(),
           block_k: int = 0) -> Launch:
    """c (M, N) = epilogue(bf(A) @ bf(B)); A stored (K, M) when a_transposed, B (N, K) when
    b_transposed.  aux: the residual (EPI_RESIDUAL), [a | b] (EPI_SWIGLU_BWD), else unread.
    `tiles`: the tile candidates (empty: the SwiGLU backward's, or the usual rule's); `block_k`:
    the K block (0: the tuning's)."""
    return _tiled(ctx, "matmul", {"a_ptr": a, "b_ptr": b, "c_ptr": c, "aux_ptr": aux},
                  {"A_T": bool(a_transposed), "B_T": bool(b_transposed), "EPILOGUE": epilogue,
                   "SPLIT_K": 1},
                  M, N, K, label,
                  tiles=tiles or (ctx.tu.swiglu_bwd_tiles if epilogue == meta.EPI_SWIGLU_BWD
                                  else None), block_k=block_k)


def matmul_residual(ctx: Context, *, a: BufferRef, b: BufferRef, x: BufferRef, out: BufferRef,
                    ssq: BufferRef, M: int, N: int, K: int, label: str) -> Launch:
    """out (M, N) = x + bf(A) @ bf(B)ᵀ (out_proj, mlp down: the residual stream) and its per-row
    partial sums of squares ssq (parts, M), one per column tile, for the next norm prologue."""
    launch = _tiled(ctx, "matmul_residual", {"a_ptr": a, "b_ptr": b, "x_ptr": x, "out_ptr": out,
                                             "ssq_ptr": ssq}, {}, M, N, K, label)
    parts = cdiv(N, dict(launch.constexprs)["BLOCK_N"])
    if (M, N) != (ctx.T, ctx.D) or parts != ssq_parts(ctx.tu, ctx.T, ctx.D):
        raise ValueError(f"{label}: a residual product is T × D with ssq_parts column tiles")
    return launch


def matmul_into_norm(ctx: Context, *, a: BufferRef, b: BufferRef, dn: BufferRef, M: int, N: int,
                     K: int, label: str, b_transposed: bool = False,
                     splits: int | None = None, tile: tuple[int, int] = (),
                     block_k: int = 0) -> Launch:
    """dn (splits, M, N) fp32 partials of bf(A) @ bf(B), K split in `dn_splits` ranges: the
    N = D products whose consumer is a norm (backward, or the forward's residual_norm after the
    mlp down) that adds the partials in split order:
    the largest tile (4× the FLOP per loaded byte of a 64×64 one) and enough K ranges to fill
    the GPU instead of small tiles (`splits` overrides dn_splits; the consumer reads the launch's
    SPLIT_K; `tile` overrides the largest tile, `block_k` the K block).  Without a split (1),
    the usual tile rule."""
    tu = ctx.tu
    splits = splits or tu.dn_splits
    tiles = (tile or tu.mm_tiles[0],) if splits > 1 else None      # unsplit: the usual tile rule
    if splits * M * N > ctx.bufs[dn.buffer].elements - dn.offset:
        raise ValueError(f"{label}: {splits} partials of {M}×{N} do not fit buffer {dn.buffer}")
    return _tiled(ctx, "matmul", {"a_ptr": a, "b_ptr": b, "c_ptr": dn, "aux_ptr": dn},
                  {"A_T": False, "B_T": bool(b_transposed), "EPILOGUE": meta.EPI_F32,
                   "SPLIT_K": splits},
                  M, N, K, label, tiles=tiles, split_k=splits, block_k=block_k)


def _adjacent_parameters(ctx: Context, first: str, M: int, N: int) -> None:
    """Refuse a weight-gradient product (M, N) that is not whole adjacent (·, N) parameters from
    `first` on (Wq|Wk|Wv, Wgate|Wup share one product)."""
    names = [q.name for q in ctx.p.parameters]
    rows, i = 0, names.index(first)
    while rows < M and i < len(names):
        q = ctx.p.parameters[i]
        if len(q.shape) != 2 or q.shape[1] != N:
            break
        rows, i = rows + q.shape[0], i + 1
    if rows != M:
        raise ValueError(f"weight gradient ({M}, {N}) from {first} is not whole adjacent "
                         f"parameters of width {N}; hint: name the product's first parameter")


def weight_grad(ctx: Context, *, products, label: str, tile: tuple[int, int] = ()) -> Launch:
    """One launch: the weight gradients `products` — (dy16 (T, M), x16 (T, N), the first
    parameter's name, M, N) each, W (M, N) one or more adjacent parameters — with AdamW in their
    epilogue (P/M/V and w16).  At most `dw_programs` programs, each looping over the tiles
    pid, pid + programs, …: the side lane takes at most that many SMs from the main lane
    (tools/cost/).  Placed after the last launch that reads the old bf16 weights.
    `tile`: (BLOCK_M, BLOCK_N), the tuning's `dw_tile` when empty."""
    tu, T = ctx.tu, ctx.T
    if not 1 <= len(products) <= 2:
        raise ValueError(f"{label}: weight_grad runs one or two products, got {len(products)}")
    if tu.dw_programs < 1:
        raise ValueError(f"{label}: dw_programs = {tu.dw_programs}; hint: at least one program")
    bm, bn = tile or tu.dw_tile
    args, dims, tiles = {}, {}, 0
    for j, (dy16, x16, name, M, N) in enumerate(products + products[:1] * (2 - len(products))):
        _adjacent_parameters(ctx, name, M, N)
        args |= {f"a{j}_ptr": dy16, f"b{j}_ptr": x16, f"p{j}_ptr": ctx.param(name),
                 f"h{j}_ptr": ctx.param(name, "w16")}
        dims |= {f"M{j}": i32(M), f"N{j}": i32(N)}
        if j < len(products):
            tiles += cdiv(M, bm) * cdiv(N, bn)
    args |= {"doorbell_ptr": ctx.doorbell(), "t_base": RunScalar("t_base", "i64")}
    args |= dims | {"T": i32(T), "NPARAM": i32(ctx.N)}
    num_warps, num_stages = warps_stages(ctx, bm, bn)
    return triton_launch("coppelius.plan.kernels.weight_grad", "weight_grad", (min(tiles, tu.dw_programs),),
                         args,
                         {"PRODUCTS": len(products), **learner_constexprs(ctx.p),
                          "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": tu.mm_block_k,
                          "GROUP_M": GROUP_M},
                         num_warps=tu.dw_warps or num_warps, num_stages=num_stages, label=label)


def matmul_rotary(ctx: Context, *, h16, w, qkv, label: str) -> Launch:
    """qkv16 = bf(rotary(h16 @ bf(Wq|Wk|Wv)ᵀ)) on the attention norm's bf16 rows (a row launch
    wrote them), rotary in the epilogue; column tiles hold whole heads."""
    p = ctx.p
    return _tiled(ctx, "matmul_rotary",
                  {"h16_ptr": h16, "w_ptr": w, "qkv_ptr": qkv, "rope_ptr": ctx.buf("rope")},
                  {"ROTATED": p.heads + p.kv_heads, "HEAD_DIM": p.head_dim},
                  ctx.T, ctx.W, ctx.D, label, heads=p.head_dim)


def matmul_delta(ctx: Context, *, dres16, wo, do, o32, delta, label: str) -> Launch:
    """do = bf(dres) @ bf(Wo) (fp32) and delta = rowsum(do·o) per head in the epilogue; column
    tiles hold whole heads."""
    p, tu = ctx.p, ctx.tu
    return _tiled(ctx, "matmul_delta",
                  {"a_ptr": dres16, "b_ptr": wo, "do_ptr": do, "o_ptr": o32, "delta_ptr": delta},
                  {"HEAD_DIM": p.head_dim}, ctx.T, p.q_width, ctx.D, label,
                  tiles=tu.delta_tiles or None, heads=p.head_dim)


def matmul_swiglu(ctx: Context, *, h16, wg, wu, ab, z, label: str) -> Launch:
    """Gate and up products of h16 = bf(rmsnorm(x)) (a rmsnorm_rows launch wrote it), SwiGLU."""
    tu = ctx.tu
    return _tiled(ctx, "matmul_swiglu",
                  {"h16_ptr": h16, "wg_ptr": wg, "wu_ptr": wu, "ab_ptr": ab, "z_ptr": z}, {},
                  ctx.T, ctx.F, ctx.D, label, tiles=tu.swiglu_tiles or None,
                  shape=(tu.mm_warps, tu.mm_stages))   # the tuning's shape whatever the tile
