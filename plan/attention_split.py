"""How the attention launches cut their work into programs (plain data, no Triton): the forward's
programs, the chunks of the dK/dV backward in program order, and the partial buffer they fill.

The kernels (plan/kernels/attention.py) decode their program id with the same arithmetic; the
builders, the buffer sizes, the cost model and the tests read it from here.

Forward (one launch, no partials): query block m (BLOCK_M rows) of head h visits key blocks of
fwd_block_n rows 0 .. fwd_trips(m) − 1, its whole causal range, in one program.  Programs: query
blocks from the first (the shortest rows) to the last, heads fastest.  (Q·H programs fit the chip
at once, so the order balances no rounds; placed early beside the previous grid's CTAs, the first
programs are the ones that may share an SM, and short ones leave it soon: docs/PERFORMANCE.md,
fused attention forward, the cost model's lane replay.)
dK/dV backward: kv block n (BLOCK_N rows) of kv head g visits the (query head j, query block m)
pairs j = 0 .. GROUP−1 (head order), m = first_q(n) .. Q−1 — GROUP·(Q − first_q(n)) trips; chunk
c of it is trips [c·BWD_CHUNK, (c+1)·BWD_CHUNK).  Programs: kv blocks from the first (the most
trips), chunks in trip order, kv heads fastest.  Chunk c's partial lives in slot c of the partial
buffer; a merge sums slots 0, 1, … in that order.
"""
from __future__ import annotations

from dataclasses import dataclass

from coppelius.plan.ints import cdiv


@dataclass(frozen=True)
class AttentionSplit:
    T: int
    block_m: int
    block_n: int                    # kv rows per block of the backward (dK/dV, dQ)
    heads: int
    kv_heads: int
    fwd_block_n: int                # key rows per trip of the forward
    bwd_chunk: int                  # (query head, query block) trips per dK/dV program

    @property
    def q_blocks(self) -> int:
        return self.T // self.block_m

    @property
    def kv_blocks(self) -> int:
        return self.T // self.block_n

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    # -- forward
    def fwd_trips(self, m: int) -> int:
        """Key blocks of fwd_block_n rows query block m visits (its causal range, diagonal
        included; the last block's keys past the rows are masked)."""
        return cdiv((m + 1) * self.block_m, self.fwd_block_n)

    def fwd_programs(self) -> list[tuple[int, int]]:
        """(query block, head) of each attention_fwd program, in program-id order: the first
        query block (the fewest trips) first."""
        return [(m, h) for m in range(self.q_blocks) for h in range(self.heads)]

    # -- dK/dV backward
    def first_q(self, n: int) -> int:
        """The query block holding kv block n's diagonal (the first one that sees it)."""
        return n * self.block_n // self.block_m

    def dkdv_trips(self, n: int) -> int:
        return self.group * (self.q_blocks - self.first_q(n))

    def dkdv_chunks(self, n: int) -> int:
        return cdiv(self.dkdv_trips(n), self.bwd_chunk)

    def dkdv_programs(self) -> list[tuple[int, int, int]]:
        """(kv block, chunk, kv head) of each attention_bwd program, in program-id order."""
        return [(n, c, g) for n in range(self.kv_blocks) for c in range(self.dkdv_chunks(n))
                for g in range(self.kv_heads)]

    def dkdv_chunk_pairs(self, n: int, c: int) -> list[tuple[int, int]]:
        """(query head within the group, query block) of each trip of chunk c of kv block n."""
        rows = self.q_blocks - self.first_q(n)
        lo, hi = c * self.bwd_chunk, min((c + 1) * self.bwd_chunk, self.dkdv_trips(n))
        return [(t // rows, self.first_q(n) + t % rows) for t in range(lo, hi)]

    @property
    def bwd_slots(self) -> int:
        """Partial slots of dK/dV: the most chunks of any kv block (the first)."""
        return self.dkdv_chunks(0)

    # -- dQ + dK/dV merge
    def dq_kv_blocks(self, m: int) -> int:
        """kv blocks (BLOCK_N rows) query block m's dQ program visits (the causal range)."""
        return cdiv((m + 1) * self.block_m, self.block_n)

    def dq_programs(self) -> list[tuple[str, int, int]]:
        """attention_bwd_dq's programs in id order: ("dq", query block, head), the last query
        block first, then ("merge", kv block, kv head)."""
        return ([("dq", m, h) for m in reversed(range(self.q_blocks)) for h in range(self.heads)]
                + [("merge", n, g) for n in range(self.kv_blocks) for g in range(self.kv_heads)])


def attention_split(profile, tuning) -> AttentionSplit:
    """The split a profile's tuning gives (the blocks' and chunks' checks are the builders')."""
    return AttentionSplit(profile.context, tuning.attn_m, tuning.attn_n, profile.heads,
                          profile.kv_heads, tuning.attn_fwd_n, tuning.attn_bwd_chunk)
