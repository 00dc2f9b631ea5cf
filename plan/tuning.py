"""Meta-parameters per profile: matmul tiles, rows per program, warps and stages of every launch.

They change how the work is split into programs, never what any element computes: every
reduction keeps its fixed order whatever the tile (split-K partials are summed in split order by
their consumer).  Plain data: no Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

from coppelius.plan.ints import cdiv

GROUP_M = 8                 # matmul row tiles that share their B tiles in L2 (grouped ordering)


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
    attn_fwd_n: int                              # key rows per attention_fwd trip (its BLOCK_N)
    attn_bwd_chunk: int                          # (query head, query block) trips per dK/dV program
    ce_rows: int                                 # cross_entropy rows per program
    ce_warps: int                                # cross_entropy's and predictions' warps
    cast_block: int                              # cast_bf16 elements per program (the w16 refresh)
    cast_warps: int
    vocab_block: int                             # embed_grad/embed_decay vocabulary rows per program
    vocab_warps: int                             # their warps (embed_grad's AdamW holds 4 tiles)
    gain_cols: int                               # rmsnorm_bwd_gain dg columns per program
    gain_rows: int                               # … rows per trip down those columns
    copy_block: int = 1024
    swiglu_bwd_tiles: tuple[tuple[int, int], ...] = ()   # SwiGLU-backward tiles ((): mm_tiles)
    dw_tile: tuple[int, int] = (128, 128)        # weight-gradient tiles (AdamW in the epilogue)
    mlp_dw_tile: tuple[int, ...] = ()            # … of a layer's MLP half ((): dw_tile)
    dn_splits: int = 1                           # K splits of the N = D products into a norm
    qkv_dh_splits: int = 1                       # … of the qkv backward's dh (K = W) among them
    dw_programs: int = 64                        # programs of a side-lane weight-gradient launch
    dw_warps: int = 0                            # their warps (0: the matmul rule for the tile)
    decay_programs: int = 16                     # programs of embed_decay (E's absent rows, side lane)
    swiglu_tiles: tuple[tuple[int, int], ...] = ()   # SwiGLU-forward tiles ((): mm_tiles)
    delta_tiles: tuple[tuple[int, int], ...] = ()    # out_proj-backward dO + delta tiles
    attn_fwd_stages: int = 3                     # attention_fwd's pipeline stages (K/V copies ahead)
    head_tiles: tuple[tuple[int, int], ...] = ()     # the head's logits product tiles ((): mm_tiles)
    head_dx_tile: tuple[int, int] = ()           # the head backward's dx tile ((): mm_tiles[0])
    head_dx_splits: int = 0                      # … and its K ranges (0: dn_splits)
    head_block_k: int = 0                        # both head products' K block (0: mm_block_k)


H200 = Tuning(mm_tiles=((128, 128), (128, 64), (64, 64)), mm_min_programs=120, mm_block_k=64,
              mm_warps=8, mm_stages=3, rows=4, rows_warps=4, attn_m=64, attn_n=64, attn_warps=4,
              # the fused forward (docs/PERFORMANCE.md, fused attention forward): one program per
              # (query block, head), its longest row 1,024 keys in 8 trips of 128 keys (16 of 64:
              # 17.6 µs alone, model); 3 stages copy K/V two trips ahead, so no trip waits on L2
              # (ptxas: 157 registers on sm_90a, 197 on sm_80, no spill; 256 keys spill on sm_80).
              # ≤ 11 trips per dK/dV program: 128 programs at 2 per SM beside the side lane (5
              # trips: 244 programs, two rounds there).  The co-residency model's sweep, central µs:
              # 6 / 8 / 9 / 10 / 11 / 12 / 16 trips → 1699 / 1686 / 1671 / 1672 / 1679 / 1696 /
              # 1696; 11 lowers all three scenarios (1304 / 1696 / 2362 → 1282 / 1679 / 2357), 9
              # and 10 raise the pessimistic one (docs/PERFORMANCE.md)
              attn_fwd_n=128, attn_fwd_stages=3, attn_bwd_chunk=11,
              # one row of 12,288 logits per program on 8 warps: 128 registers, so 2 CTAs per
              # SM and the 1,024 rows in 4 rounds (16 warps: 76 registers × 512 threads left room
              # for one CTA, 8 rounds; model 35 → 20 µs, the update 1711 → 1696 µs central;
              # 4 warps: 255 registers, 19 µs; docs/PERFORMANCE.md)
              ce_rows=1, ce_warps=8, cast_block=2048, cast_warps=8, vocab_block=16,
              vocab_warps=8,
              # 128 rows per gain-column trip: 8 unprefetched trips on its chain instead of 16;
              # 16 columns a program: 32 gain programs, so the final norm's dg reading 8 dx
              # partials (the head's dx below) keeps its chain on twice the SMs (model: 1666 →
              # 1658 µs central; 8 columns 1667, 32 1666, 64 1668)
              gain_cols=16, gain_rows=128,
              # 128×128 with the epilogue in column eighths on the bf16 [a|b]: 108 registers, no
              # spill (ptxas -v), so 2 blocks/SM and the 176 tiles in 1 round (quarters: 128; in
              # halves on fp32 [a|b]: 234, 1 block/SM, 2 rounds; docs/PERFORMANCE.md); 128×64
              # loads bf(dres) once per 64 columns: +186 MB of L2
              swiglu_bwd_tiles=((128, 128), (64, 64)),
              # every weight gradient at 128×128 on 4 warps: 2 CTAs per SM whatever ptxas gives
              # (≤ 255 registers × 128 threads), so one CTA's AdamW epilogue runs under the other's
              # K loop (ptxas: 230 registers for two products, 252 for the head on sm_90a, no
              # spill; with one epilogue piece loaded ahead both spill).  A layer's MLP half is
              # 4·22 + 43·4 = 260 tiles (at 128×256 on 8 warps: 250 registers, 1 CTA per SM).
              # Model: 1595 → 1468 µs central (docs/performance/update-levers-round-6.md)
              dw_tile=(128, 128), dw_warps=4,
              # N = 512 products into a norm backward: 32 tiles of 128×128 × 4 K ranges = 128
              # programs at 4× the FLOP per byte of the 64×64 tiles that reach 128 without a split
              dn_splits=4,
              # the qkv backward's dh (K = W = 1024) in 2 K ranges: 64 programs fit beside the side
              # lane's 65 and its norm backward reads 2 partials, not 4 (model: 1461 → 1446 µs
              # central; 1 range: 1458; docs/PERFORMANCE.md)
              qkv_dh_splits=2,
              # the side lane's weight-gradient launches: at most 130 programs (2 per SM on 65
              # SMs), each looping over its tiles, so the main lane keeps ≥ 67 SMs (tools/cost/);
              # 130 because a layer's MLP half is 260 = 130 × 2 tiles (98: 1610 µs central, 160:
              # 1478; docs/performance/update-levers-round-6.md)
              dw_programs=130,
              # the SwiGLU forward on the MLP norm's bf16 rows: 126 registers at 128×64, 2 blocks
              # per SM (344 tiles in 2 rounds); 128×128 takes 231 (1 block/SM; 31 µs more in the
              # model's graph), 64×128 128 and 64×64 78 but re-read the weights per 64 rows
              swiglu_tiles=((128, 64), (64, 64)),
              # out_proj backward's dO + delta at 128×128: 32 programs that fit beside the side
              # lane, each loading bf(dres) and Wo half as often as at 64×64 (model: 1446 → 1441
              # µs central; docs/PERFORMANCE.md)
              delta_tiles=((128, 128),),
              # E's absent rows on 32 programs beside the forward (16: 48 serial block trips, 152
              # µs on 16 SMs; 32: half the chain on 32 SMs; model 1400 → 1397 µs central, 24:
              # 1398; docs/PERFORMANCE.md)
              decay_programs=32,
              # the head (K = 512, 12,288 columns) on 256 × 128 tiles, 8 warps: 1 CTA per SM
              # (164 registers on sm_90a), 384 tiles in 3 rounds; each column of W read by 4 row
              # tiles, not 8 (L2 252 → 201 MB; model: the head 42 → 37 µs, the update 1679 → 1674
              # µs central)
              head_tiles=((256, 128),),
              # its dx (K = 12,288 into the final norm) on 256 × 128 tiles in 8 K ranges: 128
              # programs as at 128 × 128 in 4, dlogits read twice per row where it was read four
              # times (L2 210 → 168 MB with the partials; model 32 → 29 µs, the two gained norm
              # backwards 25 → 32 µs, the update 1674 → 1666 µs central)
              head_dx_tile=(256, 128), head_dx_splits=8,
              # both in K blocks of 32: 3 stages of 256 × 128 at 64 take 147,456 B of shared
              # memory, past the 101,376 B of cc 8.6 / 8.9 / 12.0 GPUs (README: which GPUs run
              # it); at 32 73,728 B, the sm_80 build's largest need as before (model 1658 →
              # 1660 µs central; 2 stages at 64: 1670)
              head_block_k=32)
# tiny keeps GPU-valid shapes (≤ 128 KiB shared memory: sm_80's 163 KiB and sm_90's 227 KiB hold
# it) while the interpreter sees few programs: 128×128×128 matmul tiles, one stage.
INTERPRETER = Tuning(mm_tiles=((128, 128),), mm_min_programs=1, mm_block_k=128, mm_warps=8,
                     # 64 norm rows a program: at 128 embed_fwd spilled 380 B on sm_90a (ptxas -v);
                     # a row's statistics are the same whatever rows share its program, so the
                     # goldens' bits do not move
                     mm_stages=1, rows=64, rows_warps=8,
                     # 64 × 64 attention blocks: at 128 × 128 the dK/dV backward spilled 100 B on
                     # sm_80 (8 warps of 16 rows, each holding the whole 128-column operands;
                     # 64 × 64: 168 registers, no spill).  Its trips in chunks of 8: kv blocks 0–11
                     # split, so the split and the merge run in the whole-plan interpreter tests
                     # (80 programs, 32 unsplit); the forward is one program per (query block,
                     # head): 64.  The interpreter pays per trip, and the attention runs two to
                     # four times the trips: an update step's test 9.9 → 14.3 s, the suite about
                     # 2 min 45 s longer (docs/PERFORMANCE.md).  The dK/dV and dQ sums group their
                     # fp32 terms by the blocks: the goldens were made again
                     attn_m=64, attn_n=64, attn_warps=8, attn_fwd_n=128, attn_bwd_chunk=8,
                     ce_rows=32, ce_warps=8, cast_block=16384, cast_warps=8, vocab_block=64,
                     vocab_warps=8, gain_cols=128, gain_rows=128, dw_tile=(128, 128), dn_splits=1,
                     # the SwiGLU forward on 64×64 tiles: its two 128×128 accumulators spilled
                     # 240 B on sm_80 (128×64: 96 B, 64×128: 156 B); the goldens' bits do not
                     # move (tools/make_golden.py --check: the result reproduced bit for bit, and
                     # every launch's reads and writes kept their digests)
                     swiglu_tiles=((64, 64),),
                     # fewer programs than the 9 tiles of a layer's MLP half: the whole-plan tests
                     # run the tile loop (and embed_decay's block loop: 8 blocks on 2 programs)
                     dw_programs=4, decay_programs=2)
TUNING = {"coppelius": H200, "tiny": INTERPRETER}


def tuning(profile) -> Tuning:
    """The profile's meta-parameters (H200's for a profile without its own)."""
    return TUNING.get(profile.name, H200)


def dn_partials(tu: Tuning) -> int:
    """The most split-K partials any product into a norm writes (the dn buffer's planes)."""
    return max(tu.dn_splits, tu.qkv_dh_splits, tu.head_dx_splits)


def ssq_parts(tu: Tuning, T: int, D: int) -> int:
    """Partial sums of squares per residual row: one per column tile of the T × D residual
    product (out_proj, plan/launches/matmul.matmul_residual), as its tile rule chooses it."""
    return cdiv(D, choose_tile(tu, T, D)[1])


def choose_tile(tu: Tuning, M: int, N: int, tiles=None, heads: int = 1) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, programs): the first candidate with enough programs; `heads` > 1
    keeps only tiles whose columns hold whole heads (fused per-head epilogues)."""
    fits = [(bm, bn) for bm, bn in (tiles or tu.mm_tiles) if bn % heads == 0]
    if not fits:
        raise ValueError(f"no matmul tile holds whole heads of {heads} columns; "
                         f"hint: add a tile with BLOCK_N a multiple of {heads} to the tuning")
    for bm, bn in fits:
        programs = cdiv(M, bm) * cdiv(N, bn)
        if programs >= tu.mm_min_programs:
            break
    return bm, bn, programs
