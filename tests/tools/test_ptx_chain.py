"""The PTX round-trip pass (tools/cost/ptx_chain.py, ptx_levels.py, ptx_parse.py, ptx_ops.py):
synthetic snippets whose chains are known by construction, and the committed PTX of weight_grad,
the SwiGLU-backward matmul, rmsnorm_rows and cast_bf16 against counts derived by hand from it."""
from __future__ import annotations

import re

import pytest

from tools.cost import inputs as ci
from tools.cost.ptx_chain import chain_of, chains_of_ptx, kernel_chains
from tools.cost.ptx_ops import Ops
from tools.cost.ptx_parse import blocks_of, entry_bodies, natural_loops, parse_instr
from tests.support.paths import ROOT

PTX = ROOT / "kernels_ptx" / "coppelius" / "sm_90a"

HEAD = """
.version 8.0
.target sm_90a
.address_size 64
.visible .entry k(
	.param .u64 .ptr .global .align 1 k_param_0,
	.param .u64 .ptr .global .align 1 k_param_1
)
.reqntid 128
{
	.reg .pred 	%p<4>;
	.reg .b32 	%r<40>;
	.reg .b64 	%rd<20>;
	ld.param.b64 	%rd1, [k_param_0];
	ld.param.b64 	%rd2, [k_param_1];
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	add.s64 	%rd5, %rd2, %rd3;
"""
HEAD_SLOTS = 6          # the six instructions above


def chain(body: str):
    return chains_of_ptx(HEAD + body + "\tret;\n}\n")["k"]


@pytest.mark.parametrize("body,want", [
    # a load after a store whose data came from a load: two trips; the same with a read-only load
    # (.nc, which ptxas may hoist above the store): one
    ("ld.global.b32 %r2, [%rd4];\n add.f32 %r3, %r2, %r2;\n st.global.b32 [%rd4], %r3;\n"
     "ld.global.b32 %r4, [%rd5];\n st.global.b32 [%rd5], %r4;\n", 2),
    ("ld.global.b32 %r2, [%rd4];\n st.global.b32 [%rd4], %r2;\n"
     "ld.global.nc.b32 %r4, [%rd5];\n st.global.b32 [%rd5], %r4;\n", 1),
    # a gather: the second address is the first load's value
    ("ld.global.b32 %r2, [%rd4];\n mul.wide.u32 %rd6, %r2, 4;\n add.s64 %rd7, %rd2, %rd6;\n"
     "ld.global.b32 %r4, [%rd7];\n st.global.b32 [%rd5], %r4;\n", 2),
    # two independent loads: one level
    ("ld.global.b32 %r2, [%rd4];\n ld.global.b32 %r4, [%rd5];\n add.f32 %r5, %r2, %r4;\n"
     "st.global.b32 [%rd5], %r5;\n", 1),
    # a loaded value staged through shared memory, a barrier, then a load: the barrier waits
    ("ld.global.b32 %r2, [%rd4];\n st.shared.b32 [%r1], %r2;\n bar.sync 0;\n"
     "ld.global.b32 %r4, [%rd5];\n st.global.b32 [%rd5], %r4;\n", 2),
    # a barrier nothing loaded reaches does not wait for the load in flight
    ("ld.global.b32 %r2, [%rd4];\n bar.sync 0;\n ld.global.b32 %r4, [%rd5];\n"
     "add.f32 %r5, %r2, %r4;\n st.global.b32 [%rd5], %r5;\n", 1),
    # a store of nothing loaded holds the load back but costs no trip
    ("st.global.b32 [%rd4], %r1;\n ld.global.b32 %r4, [%rd5];\n st.global.b32 [%rd5], %r4;\n", 1),
    # a guarded load (the guard a loaded predicate) after a vector load
    ("ld.global.v2.b32 {%r2, %r3}, [%rd4];\n setp.lt.s32 %p1, %r3, 0;\n"
     "@!%p1 ld.global.b32 %r4, [%rd5];\n st.global.b32 [%rd5], %r4;\n", 2),
])
def test_straight_line_chains(body, want):
    c = chain(body)
    assert (c.tile, c.epilogue, c.fill, c.prologue, c.loops) == (want, want, 0, 0, ())


def test_issue_slots_expand_the_correctly_rounded_operations():
    c = chain("ld.global.b32 %r2, [%rd4];\n sqrt.rn.f32 %r3, %r2;\n div.rn.f32 %r4, %r3, %r2;\n"
              "ex2.approx.f32 %r5, %r4;\n bar.warp.sync -1;\n bar.sync 0;\n"
              "st.global.b32 [%rd5], %r5;\n")
    # the head, the load, sqrt and div (MUFU + 9 slots each), ex2 (MUFU), bar.sync, the store and
    # ret; bar.warp.sync issues nothing
    alu = HEAD_SLOTS + 1 + ci.SQRT_RN_F32[1] + ci.DIV_RN_F32[1] + 1 + 1 + 1
    assert c.ops == Ops(alu, 3, div_rn=1, sqrt_rn=1, bars=1)


ONE_STAGE = """	mov.u32 %r10, 0;
$L__BB0_1:
	ld.global.b32 %r2, [%rd4];
	add.f32 %r10, %r10, %r2;
	add.s64 %rd4, %rd4, 512;
	add.s32 %r11, %r11, 1;
	setp.lt.s32 %p1, %r11, 8;
	@%p1 bra $L__BB0_1;
	st.global.b32 [%rd5], %r10;
	ld.global.b32 %r4, [%rd5];
	st.global.b32 [%rd4], %r4;
"""

PIPELINED = """	cp.async.cg.shared.global [ %r1 + 0 ], [ %rd4 + 0 ], 0x10, %r1;
	cp.async.commit_group;
	cp.async.cg.shared.global [ %r1 + 0 ], [ %rd4 + 0 ], 0x10, %r1;
	cp.async.commit_group;
$L__BB0_1:
	cp.async.wait_group 1;
	bar.sync 0;
	ld.shared.b32 %r2, [%r1];
	add.f32 %r10, %r10, %r2;
	bar.sync 0;
	cp.async.cg.shared.global [ %r1 + 0 ], [ %rd4 + 0 ], 0x10, %r1;
	cp.async.commit_group;
	add.s32 %r11, %r11, 1;
	setp.lt.s32 %p1, %r11, 8;
	@%p1 bra $L__BB0_1;
	cp.async.wait_group 0;
	bar.sync 0;
	ld.global.b32 %r4, [%rd5];
	add.f32 %r5, %r4, %r10;
	st.global.b32 [%rd5], %r5;
"""


def test_a_loop_that_loads_and_uses_in_one_trip_costs_a_trip_per_trip():
    """Each trip's load issues after the last trip's add used its value (no hoisting across the
    back edge): 1 per trip; the tile sees the first trip (fill 1), then the store of the sum and
    the load after it (epilogue 1)."""
    c = chain(ONE_STAGE)
    assert [(lp.trip, lp.inner, lp.pipelined) for lp in c.loops] == [(1.0, True, False)]
    assert (c.tile, c.before, c.fill, c.epilogue, c.per_trip) == (2, 0, 1, 1, 1.0)


def test_a_pipelined_loop_waits_for_copies_issued_two_trips_earlier():
    """Two groups in flight before the loop; each trip waits for the older (wait_group 1) and
    issues the next after its barrier: a trip's data was copied two trips before it, so the
    chain grows one level every two trips (0.5), and the loop counts once (its fill) in the
    tile; the load after its last barrier is the epilogue's one trip."""
    c = chain(PIPELINED)
    assert [(lp.trip, lp.pipelined) for lp in c.loops] == [(0.5, True)]
    assert (c.tile, c.fill, c.epilogue, c.per_trip) == (2, 1, 1, 0.0)


def test_parse_guards_vectors_and_scoped_inline_asm():
    ins = parse_instr("@!%p3 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd7 + 16 ]")
    assert (ins.op, ins.dests, ins.srcs) == ("ld.global.v4.b32", ("%r1", "%r2", "%r3", "%r4"),
                                             ("%p3", "%rd7"))
    ins = parse_instr("st.global.v2.b32 [ %rd8 + 0 ], { %r5, %r6 }")
    assert (ins.dests, ins.srcs) == ((), ("%rd8", "%r5", "%r6"))
    ins = parse_instr("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1,%r2}, %rd1, %rd2, 0, 1, 1, 0, 0")
    assert ins.dests == ("%r1", "%r2") and {"%r1", "%r2", "%rd1", "%rd2"} <= set(ins.srcs)
    assert parse_instr(".reg .pred %p<2>") is None
    body = entry_bodies(HEAD + "{ .reg .pred %q; setp.ne.s32 %q, %r1, 0; }\n\tret;\n}\n")["k"]
    ops = [i.op for b in blocks_of(body) for i in b.instrs]
    assert ops[-2:] == ["setp.ne.s32", "ret"]


HEAD_DW = "weight_grad_50d519cc4b"      # the head's dW (one product), 128×128 on 4 warps
HALF_DW = "weight_grad_bc894a85e4"      # a layer half's (two products), the same tile
SWIGLU_BWD = "matmul_2e81b54cef"        # matmul EPI 3, 128×128 on 8 warps


def test_loops_are_found_by_dominators_not_text_order():
    """weight_grad's tile loop: its latch block (the tile's end) comes first in the text, its
    header after it; the epilogue's first block is in the tile loop, not in the K loop."""
    body = entry_bodies((PTX / f"{HEAD_DW}.ptx").read_text())["weight_grad"]
    blocks = blocks_of(body)
    _, loops = natural_loops(blocks)
    labels = [blocks[lp.header].label for lp in loops]
    assert labels == ["$L__BB0_4", "$L__BB0_2"]      # the K loop inside the tile's
    latch = loops[1].latches[0]
    assert blocks[latch].label == "$L__BB0_37" and latch < loops[1].header
    epilogue = next(i for i, b in enumerate(blocks) if b.label == "$L__BB0_5")
    assert epilogue in loops[1].body and epilogue not in loops[0].body


def _ptx_lines(name: str, pattern: str, start: str, end: str) -> list[str]:
    """Lines of a committed PTX file matching `pattern` between two labels (a hand count)."""
    text = (PTX / name).read_text()
    part = text[text.index(start):text.index(end)]
    return [ln for ln in part.splitlines() if re.search(pattern, ln.split("//")[0])]


def _runs(lines: list[str]) -> list[tuple[str, int]]:
    """(kind, count) of consecutive global loads ("ld") and stores ("st") in program order."""
    out: list[tuple[str, int]] = []
    for ln in lines:
        kind = "ld" if re.search(r"\bld\.global", ln) else "st"
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + 1)
        else:
            out.append((kind, 1))
    return out


def test_weight_grad_epilogue_loads_each_piece_before_its_stores():
    """Read off the PTX by hand: the epilogue ($L__BB0_5 to the tile loop's exit, one tile) takes
    16 column pieces of 8, each in a block of its own (skipped past column N); in each, P, M and
    V are loaded (2 vector loads each: 2 rows a thread at 4 warps) before its 6 plane stores and
    2 w16 stores — so each piece's loads wait only for the last piece's stores: one dependent
    trip a piece, 16 a tile; the K loop's fill one more; the doorbell, once per program, before
    the tile loop.  (Before the epilogue loaded first: 3 a column eighth, 24 a tile.)"""
    for key in (HEAD_DW, HALF_DW):
        mem = _ptx_lines(f"{key}.ptx", r"\b(ld|st)\.global", "$L__BB0_5:", "$L__BB0_38:")
        assert _runs(mem) == [("ld", 6), ("st", 8)] * 16, key
        c = chain_of(key)
        assert (c.epilogue, c.fill, c.tile, c.prologue) == (16, 1, 17, 1), key
        assert [lp.pipelined for lp in c.loops if lp.inner] == [True]


def test_weight_grad_epilogue_streams_pmv_past_l2():
    """P, M and V are read with an L2 evict-first policy and written streaming (`.cs`), so they
    leave L2 before the main lane's operands; the bf16 copy is a plain store."""
    text = (PTX / f"{HEAD_DW}.ptx").read_text()
    part = text[text.index("$L__BB0_5:"):text.index("$L__BB0_38:")]
    loads = re.findall(r"\bld\.global\S*", part)
    stores = re.findall(r"\bst\.global\S*", part)
    assert set(loads) == {"ld.global.L1::evict_first.L2::cache_hint.v4.b32"} and len(loads) == 96
    assert stores.count("st.global.cs.v4.b32") == 96 and stores.count("st.global.v2.b32") == 32
    assert "createpolicy.fractional.L2::evict_first.b64" in part


def test_weight_grad_epilogue_instructions():
    """Per thread per 128×128 tile (128 threads, 128 elements each): one sqrt_rn and two div_rn
    per element (ptxas' MUFU + 9 slots each); one barrier (the K loop's last wait: the pieces
    reach their layout by shuffles, not through shared memory — 64 with the old epilogue); and about
    the issue slots per element of the old kernel's machine-code fast path (3,328 a thread of 64
    elements, counted in nvdisasm's listing: inputs.DIV_RN_F32's note), the shuffles and the
    piece branches within 10 % of it."""
    for key in (HEAD_DW, HALF_DW):
        c = chain_of(key)
        bars = _ptx_lines(f"{key}.ptx", r"\bbar\.sync", "$L__BB0_5:", "$L__BB0_38:")
        assert (c.ops.sqrt_rn, c.ops.div_rn, c.ops.mufu) == (128, 256, 384), key
        assert c.ops.bars == len(bars) == 1, key
        assert abs((c.ops.alu + c.ops.mufu) / 128 - 3328 / 64) / (3328 / 64) < 0.10, key


def test_swiglu_backward_epilogue_loads_its_ab_a_piece_ahead():
    """matmul EPI 3 (the SwiGLU backward): 8 column pieces of 16; the [a|b] of pieces 0 and 1
    (2 vector loads each) come before piece 0's [da|db] stores, then piece i + 1's before piece
    i's stores.  By hand: pieces 0, 1 load at the fill's level, piece 2 after piece 0's stores
    (one trip later), piece 3 after piece 1's (whose data came with piece 0's), … : a trip every
    two pieces, 4 after the K loop's fill (8 with the old loop: each piece after the last one's
    stores)."""
    mem = _ptx_lines(f"{SWIGLU_BWD}.ptx", r"\b(ld|st)\.global", "$L__BB0_3:", "ret;")
    assert _runs(mem) == [("ld", 4)] + [("st", 2), ("ld", 2)] * 6 + [("st", 4)]
    c = chain_of(SWIGLU_BWD)
    assert (c.fill, c.epilogue, c.tile) == (1, 4, 5)


def test_simple_kernels_by_hand():
    """rmsnorm_rows: 24 scalar loads of the rows' partial sums of squares and 4 vector loads of
    the rows, all addressed from the thread and block ids, every one before the first store or
    barrier: one trip.  cast_bf16: two vector loads, one store: one."""
    loads = _ptx_lines("rmsnorm_rows_4957f9c074.ptx", r"\bld\.global", "{", "ret;")
    first_store = _ptx_lines("rmsnorm_rows_4957f9c074.ptx", r"\bst\.global|\bbar\.sync", "{", "ret;")
    text = (PTX / "rmsnorm_rows_4957f9c074.ptx").read_text()
    assert len(loads) == 28 and text.index(first_store[0]) > text.index(loads[-1])
    assert chain_of("rmsnorm_rows_4957f9c074").tile == 1
    assert chain_of("cast_bf16_eefd24c995").tile == 1
    assert chain_of("cast_bf16_eefd24c995").loops == ()


def test_every_committed_kernel_has_a_chain():
    for profile in ("coppelius", "tiny"):
        chains = kernel_chains(profile, "sm_90a")
        assert chains and all(c.tile >= 1 for c in chains.values()), profile
    with pytest.raises(KeyError, match="no PTX"):
        chain_of("matmul_0000000000")


MMA_SYNC = ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%r10, %r11, %r12, %r13}, "
            "{%r2, %r3, %r4, %r5}, {%r6, %r7}, {%r10, %r11, %r12, %r13};\n")
WGMMA = ("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r10, %r11, %r12, %r13}, "
         "%rd6, %rd7, 1, 1, 1, 0, 0;\n")


@pytest.mark.parametrize("body,want", [
    (MMA_SYNC, True), (WGMMA, False), (MMA_SYNC + WGMMA, False),
    ("ld.global.b32 %r2, [%rd4];\n st.global.b32 [%rd5], %r2;\n", False)])
def test_a_kernel_multiplying_with_mma_sync_alone_is_marked(body, want):
    assert chain(body).mma_sync is want


def test_committed_kernels_multiply_with_wgmma_on_sm_90a_and_mma_sync_on_sm_80():
    hopper = kernel_chains("coppelius", "sm_90a")
    assert not [k for k, c in hopper.items() if c.mma_sync]
    ampere = kernel_chains("coppelius", "sm_80")
    products = [k for k in ampere if k.startswith(("matmul", "weight_grad", "attention"))]
    assert products and all(ampere[k].mma_sync for k in products)


def test_wgmma_counted_per_trip_of_the_loop_and_in_the_straight_line_code():
    # the committed dK/dV backward: 4 products a trip (S, dV, dP, dK) of 4 k16 steps each inside
    # its trip loop, and before it the one product of zeros that starts dk and dv
    chains = kernel_chains("coppelius", "sm_90a")
    dkdv = [c for k, c in chains.items() if re.fullmatch(r"attention_bwd_[0-9a-f]{10}", k)]
    assert len(dkdv) == 1 and (dkdv[0].wgmma_trip, dkdv[0].wgmma_tail) == (16, 1)
    assert chain(WGMMA + WGMMA).wgmma_tail == 2 and chain(WGMMA).wgmma_trip == 0


def test_each_kind_of_loop_has_its_own_per_trip_figure():
    """attention_bwd_dq runs two kinds of program in one grid: dQ's loop multiplies, the merge's
    sums partials.  per_trip_of charges each kind its own loop: in the committed 2-stage build both
    wait an L2 round trip a trip; a loop that does not multiply is never counted as one that does
    (a loop with no mma: 0 for mma=True)."""
    chains = kernel_chains("coppelius", "sm_90a")
    (dq,) = [c for k, c in chains.items() if re.fullmatch(r"attention_bwd_dq_[0-9a-f]{10}", k)]
    inner = [lp for lp in dq.loops if lp.inner]
    assert sorted(lp.mma for lp in inner) == [False, True]
    assert (dq.per_trip_of(mma=True), dq.per_trip_of(mma=False), dq.per_trip) == (1.0, 1.0, 1.0)
    c = chain(ONE_STAGE)
    assert [lp.mma for lp in c.loops] == [False]
    assert (c.per_trip_of(mma=False), c.per_trip_of(mma=True)) == (1.0, 0.0)
