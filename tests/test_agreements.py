"""Constants that two places must agree on, checked: the kernels (and the values the launch lists
bake into them) against plan/profiles.py, the reference model and staging/layout.py."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from host.backend_interpret import TORCH_DTYPES
from plan import launches, profiles
from plan import reference as ref
from plan import reference_numerics, reference_stages
from plan.buffers import DTYPE_BYTES
from plan.kernels import matmul, meta, norms, rotary
from staging import layout as SL

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
    assert SL.PREDICTION_COUNT == len(profiles.PREDICTION_ROWS)
    assert all(0 <= r < prof.context for r in profiles.PREDICTION_ROWS)
    for launch in _launches(prof, "predictions"):
        c = dict(launch.constexprs)
        assert (c["ROW0"], c["ROW1"], c["ROW2"]) == profiles.PREDICTION_ROWS
        assert launch.grid == (SL.PREDICTION_COUNT, 1, 1)


@pytest.mark.parametrize("name", PROFILES)
def test_window_sizes_are_the_layouts(name):
    prof = profiles.get(name)
    for grad in _launches(prof, "embed_grad") + _launches(prof, "embed_decay"):   # both write w1
        assert dict(grad.constexprs)["W1_WORDS"] == SL.LOSS_WINDOW_WORDS, grad.label
    copies = {x.label: x for x in _launches(prof, "copy_f32")}
    assert copies["w2"].arg("N").value == copies["w3"].arg("N").value == SL.LOSS_WINDOW_WORDS
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
    from pathlib import Path

    from plan import launch_builders
    from plan.buffers import STAGED_DOORBELL, STAGED_INPUTS, STAGED_TARGETS, STAGED_WORDS
    kernels = Path(__file__).resolve().parents[1] / "plan" / "kernels"
    ptx = (kernels / "release_stage_in.ptx").read_text()
    threads = int(re.search(r"\.reqntid (\d+)", ptx).group(1))
    assert threads == launch_builders.STAGE_IN_WARPS * 32
    assert threads * 2 * 16 == SL.INPUT_RECORD_BYTES == SL.INPUTS_BYTES + SL.TARGETS_BYTES
    targets = rf"ld\.relaxed\.sys\.global\.v4\.u32\s+\{{[^}}]*\}}, \[%rd10\+{SL.INPUTS_BYTES}\]"
    assert re.search(targets, ptx)
    assert re.search(rf"st\.global\.u32\s+\[%rd8\+{SL.INPUT_RECORD_BYTES}\]", ptx)
    assert SL.INPUTS == 0 and SL.TARGETS == SL.INPUTS_BYTES             # one contiguous record
    assert (STAGED_INPUTS, STAGED_TARGETS, STAGED_DOORBELL) == (0, SL.TARGETS // 4,
                                                                SL.INPUT_RECORD_BYTES // 4)
    assert STAGED_WORDS > STAGED_DOORBELL
    for name in PROFILES:
        prof = profiles.get(name)
        assert prof.context * 4 == SL.INPUTS_BYTES == SL.TARGETS_BYTES, name
        for sub in launches.submissions(prof):
            first = sub.launches[0]
            assert first.arg("record_ptr").offset == SL.INPUTS
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
