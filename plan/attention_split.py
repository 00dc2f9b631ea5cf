"""How the attention launches cut their work into programs (plain data, no Triton): the chunks of
the forward and of the dK/dV backward in program order, and the partial buffers they fill.

The kernels (plan/kernels/attention.py) decode their program id with the same arithmetic; the
builders, the buffer sizes, the cost model and the tests read it from here.

Forward: query block m (BLOCK_M rows) visits kv blocks 0 .. kv_blocks(m) − 1; chunk c of it is
kv blocks [c·FWD_CHUNK, (c+1)·FWD_CHUNK) ∩ that range.  Programs: query blocks from the last
(the most chunks) to the first, chunks in kv order, heads fastest.
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
    block_n: int
    heads: int
    kv_heads: int
    fwd_chunk: int                  # kv blocks per forward program
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
    def fwd_kv_blocks(self, m: int) -> int:
        """kv blocks query block m visits (the causal range, diagonal included)."""
        return cdiv((m + 1) * self.block_m, self.block_n)

    def fwd_chunks(self, m: int) -> int:
        return cdiv(self.fwd_kv_blocks(m), self.fwd_chunk)

    def fwd_programs(self) -> list[tuple[int, int, int]]:
        """(query block, chunk, head) of each forward program, in program-id order."""
        return [(m, c, h) for m in reversed(range(self.q_blocks)) for c in range(self.fwd_chunks(m))
                for h in range(self.heads)]

    def fwd_chunk_trips(self, m: int, c: int) -> int:
        return min(self.fwd_chunk, self.fwd_kv_blocks(m) - c * self.fwd_chunk)

    @property
    def fwd_slots(self) -> int:
        """Partial slots of the forward: the most chunks of any query block (the last)."""
        return self.fwd_chunks(self.q_blocks - 1)

    def fwd_merge_programs(self) -> list[tuple[int, int]]:
        """(query block, head) of each attention_fwd_merge program: the last query block first."""
        return [(m, h) for m in reversed(range(self.q_blocks)) for h in range(self.heads)]

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

    def dq_programs(self) -> list[tuple[str, int, int]]:
        """attention_bwd_dq's programs in id order: ("dq", query block, head), the last query
        block first, then ("merge", kv block, kv head)."""
        return ([("dq", m, h) for m in reversed(range(self.q_blocks)) for h in range(self.heads)]
                + [("merge", n, g) for n in range(self.kv_blocks) for g in range(self.kv_heads)])


def attention_split(profile, tuning) -> AttentionSplit:
    """The split a profile's tuning gives (the blocks' and chunks' checks are the builders')."""
    return AttentionSplit(profile.context, tuning.attn_m, tuning.attn_n, profile.heads,
                          profile.kv_heads, tuning.attn_fwd_chunk, tuning.attn_bwd_chunk)
