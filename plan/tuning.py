"""Meta-parameters per profile: matmul tiles, rows per program, warps and stages of every launch.

They change how the work is split into programs, never what any element computes: every
reduction keeps its fixed order whatever the tile.  Plain data: no Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    attn_fwd_chunk: int                          # kv blocks per attention_fwd program (a split)
    attn_bwd_chunk: int                          # (query head, query block) trips per dK/dV program
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
              # attention split (docs/PERFORMANCE.md, issue 14): ≤ 4 kv blocks per forward program
              # (320 programs ≤ 528 slots at 4 per SM), ≤ 5 trips per dK/dV program (244 ≤ 264)
              attn_fwd_chunk=4, attn_bwd_chunk=5,
              ce_rows=1, ce_warps=16, adamw_block=2048, adamw_warps=8, vocab_block=16,
              gain_cols=32, gain_rows=64,
              # 128×128 spilled 360 B (ptxas -v: 255 registers, the epilogue holds dz, a, b, σ);
              # 128×64 keeps it in registers
              swiglu_bwd_tiles=((128, 64), (64, 64)))
# tiny keeps GPU-valid shapes (≤ 128 KiB shared memory: sm_80's 163 KiB and sm_90's 227 KiB hold
# it) while the interpreter sees few programs: 128×128×128 matmul tiles, one stage.
INTERPRETER = Tuning(mm_tiles=((128, 128),), mm_min_programs=1, mm_block_k=128, mm_warps=8,
                     mm_stages=1, rows=128, rows_warps=8, attn_m=128, attn_n=128, attn_warps=8,
                     # the longer half of the rows in two chunks: the split and the merges run in
                     # the whole-plan interpreter tests for a few programs more (48 + 24 vs 32 + 16)
                     attn_fwd_chunk=4, attn_bwd_chunk=8,
                     ce_rows=32, ce_warps=8, adamw_block=16384, adamw_warps=8, vocab_block=64,
                     gain_cols=128, gain_rows=128)
TUNING = {"coppelius": H200, "tiny": INTERPRETER}


def tuning(profile) -> Tuning:
    """The profile's meta-parameters (H200's for a profile without its own)."""
    return TUNING.get(profile.name, H200)
