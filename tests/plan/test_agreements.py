"""Constants that two places must agree on, checked: the kernels (and the values the launch lists
bake into them) against plan/profiles.py, the reference model and staging/layout.py."""
from __future__ import annotations

import ast
import math
import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from coppelius.backends.interpret import TORCH_DTYPES
from coppelius.plan import launches, profiles
from coppelius.plan import reference as ref
from coppelius.plan.reference import numerics as reference_numerics
from coppelius.plan.reference import stages as reference_stages
from coppelius.plan.buffers import DTYPE_BYTES
from coppelius.plan.kernels import matmul, meta, norms, rotary
from coppelius.plan.kernels.adamw import cast_bf16
from coppelius.staging import layout as L
from tests.support.paths import ROOT

PROFILES = profiles.names()


def _launches(profile, function: str):
    found = [x for s in launches.submissions(profile) for x in s.launches if x.function == function]
    assert found, f"no {function} launch in {profile.name}"
    return found


def test_rms_eps_is_one_value_everywhere():
    assert profiles.RMS_EPS == 1e-6                                    # CONTRACT §3
    assert meta.RMS_EPS == profiles.RMS_EPS
    assert norms.RMS_EPS.value == meta.RMS_EPS                         # the row kernels' constexpr
    assert reference_numerics.RMS_EPS == np.float32(profiles.RMS_EPS)
    assert reference_stages.RMS_EPS is reference_numerics.RMS_EPS


def test_rotary_base_is_one_value_everywhere():
    assert profiles.ROPE_BASE == 10000.0                               # CONTRACT §3
    # the kernel spells the base as its float64 natural log: exp(-2i/d · ln 10000)
    assert rotary.LN_ROPE_BASE.value == math.log(profiles.ROPE_BASE)
    # the reference's table: angle = pos · base^(-2i/d), float64, rounded once
    cos, sin = ref.rotary_tables(type("P", (), {"context": 3, "head_dim": 8})())
    for i in range(4):
        angle = 2 * profiles.ROPE_BASE ** (-2.0 * i / 8)
        assert (cos[2, i], sin[2, i]) == (np.float32(math.cos(angle)), np.float32(math.sin(angle))), i


@pytest.mark.parametrize("name", PROFILES)
def test_attention_scale_is_the_reference_scale(name):
    prof = profiles.get(name)
    want = float(ref.attention_scale(prof.head_dim))
    for launch in _launches(prof, "attention_fwd") + _launches(prof, "attention_bwd"):
        c = dict(launch.constexprs)
        assert c["SCALE"] == want, f"{launch.label}: SCALE {c['SCALE']!r} != reference {want!r}"
        assert (c["HEADS"], c["KV_HEADS"], c["HEAD_DIM"]) == (prof.heads, prof.kv_heads, prof.head_dim)
    if name == "coppelius":
        assert want == 0.125                                           # CONTRACT §3: 1/8 for d = 64


@pytest.mark.parametrize("name", PROFILES)
@pytest.mark.parametrize("t", [1, 7, 10000])
def test_adamw_constants_are_the_reference_learners(name, t):
    prof = profiles.get(name)
    # every launch that applies AdamW (the weight-gradient launches, embed_grad and, for E's
    # absent rows, embed_decay)
    updates = (_launches(prof, "weight_grad") + _launches(prof, "embed_grad")
               + _launches(prof, "embed_decay"))
    assert len(_launches(prof, "embed_decay")) == 1
    want = ref.adamw_constants(prof, t)
    lr = prof.learner
    for launch in updates:
        c = dict(launch.constexprs)
        for kernel_name, ref_name in (("DECAY", "decay"), ("BETA1", "beta1"),
                                      ("ONE_MINUS_BETA1", "one_minus_beta1"), ("BETA2", "beta2"),
                                      ("ONE_MINUS_BETA2", "one_minus_beta2"), ("EPS", "eps")):
            assert np.float32(c[kernel_name]) == want[ref_name], (launch.label, kernel_name)
            assert c[kernel_name] == float(np.float32(c[kernel_name])), f"{kernel_name} is not fp32"
        # the bias corrections are formed in float64 from these (NUMERICS.md §AdamW)
        assert (c["LR"], c["BETA1_F64"], c["BETA2_F64"]) == (float(lr.lr), float(lr.beta1),
                                                             float(lr.beta2))
        assert np.float32(c["LR"] / (1.0 - c["BETA1_F64"] ** t)) == want["step_size"]
        assert np.float32(math.sqrt(1.0 - c["BETA2_F64"] ** t)) == want["bc2_sqrt"]
        assert launch.arg("t_base") == launches.RunScalar("t_base", "i64"), launch.label


@pytest.mark.parametrize("name", PROFILES)
def test_decay_follows_the_parameter_table(name):
    """weight_grad decays every parameter it updates; embed_grad decays E and not the gains: the
    profile's decay flags say the same."""
    prof = profiles.get(name)
    decays = {q.name: q.decay for q in prof.parameters}
    by_offset = {q.offset: q.name for q in prof.parameters}
    for launch in _launches(prof, "weight_grad"):
        for j in range(dict(launch.constexprs)["PRODUCTS"]):
            assert decays[by_offset[launch.arg(f"p{j}_ptr").offset]], launch.label
    (grad,) = _launches(prof, "embed_grad")
    (decay,) = _launches(prof, "embed_decay")                          # E's absent rows
    assert by_offset[grad.arg("e_ptr").offset] == by_offset[decay.arg("e_ptr").offset] == "embed"
    assert decays["embed"]
    gains = {by_offset[grad.arg(a).offset] for a in ("gain0_ptr", "gain1_ptr")}
    assert gains == {n for n, d in decays.items() if not d}, "the undecayed parameters"


@pytest.mark.parametrize("name", PROFILES)
def test_prediction_rows_are_the_profiles_and_the_layouts(name):
    prof = profiles.get(name)
    assert L.PREDICTION_COUNT == L.RECORD_FORWARD_ROWS == len(profiles.PREDICTION_ROWS)
    assert all(0 <= r < prof.context for r in profiles.PREDICTION_ROWS)
    for launch in _launches(prof, "predictions"):
        c = dict(launch.constexprs)
        assert (c["ROW0"], c["ROW1"], c["ROW2"]) == profiles.PREDICTION_ROWS
        assert launch.grid == (L.PREDICTION_COUNT, 1, 1)


@pytest.mark.parametrize("name", PROFILES)
def test_window_sizes_are_the_layouts(name):
    prof = profiles.get(name)
    for grad in _launches(prof, "embed_grad") + _launches(prof, "embed_decay"):   # both write w1
        assert dict(grad.constexprs)["W1_WORDS"] == L.LOSS_WINDOW_WORDS, grad.label
    copies = {x.label: x for x in _launches(prof, "copy_f32")}
    assert copies["w2"].arg("N").value == copies["w3"].arg("N").value == L.LOSS_WINDOW_WORDS
    for label, x in copies.items():
        if label.startswith("record.row"):
            assert x.arg("N").value == prof.vocab, label                # one logits row


def test_epilogue_codes_are_the_kernels():
    codes = {n: getattr(meta, n) for n in ("EPI_F32", "EPI_BF16", "EPI_RESIDUAL", "EPI_SWIGLU_BWD")}
    assert len(set(codes.values())) == len(codes), "epilogue codes collide"
    for n, v in codes.items():
        assert getattr(matmul, n).value == v, n


def test_dtype_sizes_are_the_element_sizes():
    """The plan's element sizes are those of the torch dtypes the interpret backend gives each
    buffer (u32 words viewed as int32: the same 4 bytes)."""
    assert set(TORCH_DTYPES) == set(DTYPE_BYTES)
    for name, dtype in TORCH_DTYPES.items():
        assert DTYPE_BYTES[name] == torch.empty((), dtype=dtype).element_size(), name


def test_stage_in_copies_the_layouts_record_into_staged():
    """release_stage_in.ptx bakes the record's size and the doorbell's place in `staged`: 256
    threads × 2 × 16 bytes = the input record, the targets half at +INPUTS_BYTES, the doorbell
    after the record; the launch runs that many threads and `staged` holds them."""
    from coppelius.plan.launches import builders as launch_builders
    from coppelius.plan.buffers import STAGED_DOORBELL, STAGED_INPUTS, STAGED_TARGETS, STAGED_WORDS
    kernels = ROOT / "plan" / "kernels"
    ptx = (kernels / "release_stage_in.ptx").read_text()
    threads = int(re.search(r"\.reqntid (\d+)", ptx).group(1))
    assert threads == launch_builders.STAGE_IN_WARPS * 32
    assert threads * 2 * 16 == L.INPUT_RECORD_BYTES == L.INPUTS_BYTES + L.TARGETS_BYTES
    targets = rf"ld\.relaxed\.sys\.global\.v4\.u32\s+\{{[^}}]*\}}, \[%rd10\+{L.INPUTS_BYTES}\]"
    assert re.search(targets, ptx)
    assert re.search(rf"st\.global\.u32\s+\[%rd8\+{L.INPUT_RECORD_BYTES}\]", ptx)
    assert L.INPUTS == 0 and L.TARGETS == L.INPUTS_BYTES             # one contiguous record
    assert (STAGED_INPUTS, STAGED_TARGETS, STAGED_DOORBELL) == (0, L.TARGETS // 4,
                                                                L.INPUT_RECORD_BYTES // 4)
    assert STAGED_WORDS > STAGED_DOORBELL
    for name in PROFILES:
        prof = profiles.get(name)
        assert prof.context * 4 == L.INPUTS_BYTES == L.TARGETS_BYTES, name
        for sub in launches.submissions(prof):
            first = sub.launches[0]
            assert first.arg("record_ptr").offset == L.INPUTS
            assert first.arg("staged_ptr") == launches.BufferRef("staged", 0, "u32")


# the split-K consumers and the constexpr that says how many partials they add
_PARTS_OF = {"rmsnorm_bwd": ("dy_ptr", "DY_PARTS"), "rmsnorm_bwd_gain": ("dy_ptr", "DY_PARTS"),
             "residual_norm": ("part_ptr", "PARTS")}


@pytest.mark.parametrize("name", PROFILES)
def test_every_split_k_consumer_adds_as_many_partials_as_its_producer_wrote(name):
    """A norm that adds split-K partials reads exactly the SPLIT_K its producer (the last launch
    before it on its lane that wrote that buffer) used: one fewer and a K range is lost, one more
    and it adds a stale partial — neither fails loudly on the GPU."""
    checked = 0
    for sub in launches.submissions(profiles.get(name)):
        last_split = {}                                  # buffer → SPLIT_K of its last writer
        for x in sub.launches:
            args, c = dict(x.args), dict(x.constexprs)
            if x.function in _PARTS_OF:
                arg, const = _PARTS_OF[x.function]
                buf = args[arg].buffer
                if buf in last_split:                    # the backward gain norm of dres: none
                    assert c[const] == last_split[buf], (
                        f"{name} {sub.name} {x.label}: adds {c[const]} partials of {buf}, its "
                        f"producer wrote {last_split[buf]}")
                    checked += 1
            if x.function == "matmul" and c.get("EPILOGUE") == meta.EPI_F32:
                last_split[args["c_ptr"].buffer] = c["SPLIT_K"]
    assert checked >= 3 * profiles.get(name).layers


# fp32 words whose bf16 rounding is easy to get wrong: ±0, ±inf, overflow to inf and its tie,
# subnormals and their ties, ties to even down and up, one ulp either side of a tie, NaNs of
# either sign with payloads that truncation would turn into inf
AWKWARD_WORDS = np.array([
    0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000,
    0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x807FFFFF, 0x3F808000, 0x3F818000,
    0x3F808001, 0x3F807FFF, 0xBF808000, 0x3F800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F80FFFF,
    0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF,
], dtype=np.uint32)


@triton.jit
def _bf16_to_f32(src_ptr, dst_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask).to(tl.float32), mask=mask)


def test_the_interpreters_bf16_conversions_are_the_references_bit_for_bit():
    """fp32 → bf16 in a kernel (the product's cast_bf16) under the interpret backend gives the
    bits reference_numerics.bf16 gives, on the awkward words and on random ones (N not a block
    multiple); bf16 → fp32 gives back exactly the value those bits stand for."""
    words = np.concatenate([AWKWARD_WORDS, np.random.default_rng(11).integers(
        0, 2 ** 32, 4099, dtype=np.uint32)])
    n = words.size
    out = torch.full((n + 5,), -1, dtype=torch.int16)
    cast_bf16[(triton.cdiv(n, 1024),)](torch.from_numpy(words.view(np.float32)),
                                      out.view(torch.bfloat16), n, BLOCK=1024)
    got, want = out.numpy()[:n].view(np.uint16), reference_numerics.bf16_bits(words.view(np.float32))
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (f"{bad.size} differ; first fp32 word {words[bad[0]]:#010x}: interpreter "
                           f"{got[bad[0]]:#06x}, reference {want[bad[0]]:#06x}")
    assert (out.numpy()[n:] == -1).all(), "the cast wrote past N"
    assert np.array_equal(want.astype(np.uint32) << 16, ref.bf16(words.view(np.float32)).view(np.uint32))
    back = torch.full((n,), float("nan"), dtype=torch.float32)
    _bf16_to_f32[(triton.cdiv(n, 1024),)](out[:n].view(torch.bfloat16), back, n, BLOCK=1024)
    assert np.array_equal(back.numpy().view(np.uint32), want.astype(np.uint32) << 16)
    assert np.array_equal(reference_numerics.bf16_bits_to_f32(want).view(np.uint32),
                          want.astype(np.uint32) << 16)


# ---------------------------------------------------------------- one home per shared helper

def _defined(name: str) -> list[str]:
    """Every `def name` in host/, plan/, staging/ and tools/, as path:line."""
    root = ROOT
    return [f"{p.relative_to(root)}:{node.lineno}" for d in ("host", "plan", "staging", "tools")
            for p in sorted((root / d).rglob("*.py"))
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef) and node.name == name]


def test_cdiv_and_next_pow2_have_one_home():
    from coppelius.plan import attention_split
    from coppelius.plan import ints
    from coppelius.plan.launches import builders as launch_builders
    from coppelius.plan.launches import matmul as launch_matmul
    from coppelius.plan import tuning
    from tools.cost import work
    assert _defined("cdiv") == ["plan/ints.py:5"] and _defined("next_pow2") == ["plan/ints.py:10"]
    for module in (attention_split, tuning, launch_builders, launch_matmul, work):
        assert module.cdiv is ints.cdiv, module.__name__
    for a in (0, 1, 127, 128, 129, 2 ** 40 + 1):
        for b in (1, 3, 128):
            assert ints.cdiv(a, b) == math.ceil(a / b) == -(-a // b), (a, b)
    assert [ints.next_pow2(n) for n in (1, 2, 3, 352, 512, 513)] == [1, 2, 4, 512, 512, 1024]


def test_the_bf16_conversion_has_one_home():
    from coppelius.backends import interpreter_repairs
    assert interpreter_repairs.bf16_bits is reference_numerics.bf16_bits
    assert interpreter_repairs.bf16_bits_to_f32 is reference_numerics.bf16_bits_to_f32
    for name in ("_f32_to_bf16_bits", "_bf16_bits_to_f32", "f32_to_bf16_bits"):
        assert _defined(name) == [], name


@pytest.mark.parametrize("name", PROFILES)
def test_a_checkpoint_chunk_is_the_transfer_window(name):
    prof = profiles.get(name)
    assert profiles.CHUNK_BYTES == prof.chunk_bytes == L.TRANSFER_WINDOW_BYTES
    assert L.TRANSFER_WINDOW + L.TRANSFER_WINDOW_BYTES <= L.REGION_BYTES
    assert (prof.chunk_count - 1) * prof.chunk_bytes < prof.payload_bytes <= \
        prof.chunk_count * prof.chunk_bytes


def test_no_command_retypes_the_prediction_rows():
    """The rows are formatted from profiles.PREDICTION_ROWS wherever they are printed; the digits
    in a row ('255/511/1023', '255, 511, 1023') appear only where the tuple is defined."""
    root = ROOT
    rows = r"\D{1,3}".join(map(str, profiles.PREDICTION_ROWS))
    typed = [f"{p.relative_to(root)}:{i}" for d in ("host", "plan", "staging")
             for p in sorted((root / d).rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(rows, line)]
    assert typed == ["plan/profiles.py:" + str(next(
        i for i, line in enumerate((root / "plan" / "profiles.py").read_text().splitlines(), 1)
        if line.startswith("PREDICTION_ROWS =")))], typed


@pytest.mark.parametrize("name", PROFILES)
def test_each_submission_is_its_named_body_between_stage_in_and_release(name):
    """launches.BODIES is keyed by the layout's submission names, in its order; a submission is
    release_stage_in, its body, release; AdamW (t_base) only in the update's fused launches."""
    from coppelius.plan.launches.refs import Context
    prof = profiles.get(name)
    assert tuple(launches.BODIES) == L.SUBMISSIONS
    learners = {"weight_grad", "embed_grad", "embed_decay"}
    for sub in launches.submissions(prof):
        body = launches.BODIES[sub.name](Context(prof))
        assert sub.name == L.SUBMISSIONS[sub.index]
        assert [x.function for x in (sub.launches[0], sub.launches[-1])] == [launches.STAGE_IN,
                                                                            launches.RELEASE]
        assert [x.label for x in sub.launches[1:-1]] == [x.label for x in body], sub.name
        updating = {x.function for x in body if "t_base" in dict(x.args)}
        assert updating == (learners if sub.name == "update" else set()), (sub.name, updating)
