"""Profiles: parameter counts, every parameter offset, identity strings byte for byte
(CONTRACT §3–§4, §10)."""
import pytest

from coppelius.plan import profiles

COPPELIUS_IDENTITIES = {
    "state": b"coppelius-raw-pmv-f32-v1|parameter-order:p-then-m-then-v|payload=692465664",
    "learner": b"coppelius-objective:next-token-cross-entropy-mean|model=coppelius-v12288-t1024-d512-l9-h8-g4-f2752|halves=bf16-rne|adamw-decoupled-bias-corrected|lr=3|/=10000|beta1=9|/=10|beta2=95|/=100|decay=1|/=10|epsilon=1|/=100000000",
    "data": b"coppelius-token-stream|vocabulary=12288|context=1024|header=16|token=4",
    "initialization": b"coppelius-initialization:random-normal|seed=20260925",
}
TINY_IDENTITIES = {
    "state": b"coppelius-raw-pmv-f32-v1|parameter-order:p-then-m-then-v|payload=5999616",
    "learner": b"coppelius-objective:next-token-cross-entropy-mean|model=tiny-v512-t1024-d128-l2-h4-g2-f352|halves=bf16-rne|adamw-decoupled-bias-corrected|lr=3|/=10000|beta1=9|/=10|beta2=95|/=100|decay=1|/=10|epsilon=1|/=100000000",
    "data": b"coppelius-token-stream|vocabulary=512|context=1024|header=16|token=4",
    "initialization": b"coppelius-initialization:random-normal|profile=tiny|seed=20260925",
}


def expected_table(V, D, L, Hd, Gd, F):
    """An independent spelling of CONTRACT §3's parameter order: (name, shape, offset, decay)."""
    rows, off = [], 0
    def add(name, shape, decay):
        nonlocal off
        rows.append((name, shape, off, decay))
        n = 1
        for s in shape:
            n *= s
        off += n
    add("embed", (V, D), True)
    add("g_embed", (D,), False)
    for i in range(L):
        for nm, shp in (("wq", (Hd, D)), ("wk", (Gd, D)), ("wv", (Gd, D)), ("wo", (D, Hd)),
                        ("wgate", (F, D)), ("wup", (F, D)), ("wdown", (D, F))):
            add(f"layers.{i}.{nm}", shp, True)
    add("g_final", (D,), False)
    add("head", (V, D), True)
    return rows, off


@pytest.mark.parametrize("name,dims,count,payload,chunks", [
    ("coppelius", (12288, 512, 9, 512, 256, 2752), 57_705_472, 692_465_664, 166),
    ("tiny", (512, 128, 2, 128, 64, 352), 499_968, 5_999_616, 2),
])
def test_parameter_table(name, dims, count, payload, chunks):
    p = profiles.get(name)
    rows, total = expected_table(*dims)
    assert total == count
    assert p.parameter_count == count
    assert p.payload_bytes == payload
    assert p.chunk_count == chunks
    got = [(q.name, q.shape, q.offset, q.decay) for q in p.parameters]
    assert got == rows
    # the acceptance API unpacks (name, shape, offset)
    for (nm, shp, off), row in zip(p.parameters, rows):
        assert (nm, shp, off) == row[:3]


def test_coppelius_dimensions_and_policy():
    p = profiles.get("coppelius")
    assert (p.vocab, p.context, p.width, p.layers, p.heads, p.kv_heads, p.head_dim, p.hidden) == \
        (12288, 1024, 512, 9, 8, 4, 64, 2752)
    assert (p.steps, p.checkpoint_interval, p.seed, p.publications) == (10000, 1000, 20260925, 10)
    assert p.parameter("layers.8.wdown").offset == 6291456 + 512 + 8 * 5013504 + 5013504 - 512 * 2752
    assert p.parameter("head").offset == 57_705_472 - 6_291_456


def test_tiny_dimensions_and_policy():
    p = profiles.get("tiny")
    assert (p.vocab, p.context, p.width, p.layers, p.heads, p.kv_heads, p.head_dim, p.hidden) == \
        (512, 1024, 128, 2, 4, 2, 32, 352)
    assert (p.steps, p.checkpoint_interval, p.seed) == (8, 4, 20260925)


def test_learner_rationals():
    lr = profiles.get("coppelius").learner
    assert (lr.lr.numerator, lr.lr.denominator) == (3, 10000)
    assert (lr.beta1.numerator, lr.beta1.denominator) == (9, 10)
    assert (lr.beta2.numerator, lr.beta2.denominator) == (95, 100)   # unreduced, as the identity spells it
    assert (lr.decay.numerator, lr.decay.denominator) == (1, 10)
    assert (lr.epsilon.numerator, lr.epsilon.denominator) == (1, 100000000)
    assert float(lr.beta2) == 0.95


@pytest.mark.parametrize("name,expected", [("coppelius", COPPELIUS_IDENTITIES), ("tiny", TINY_IDENTITIES)])
def test_identities_byte_for_byte(name, expected):
    assert profiles.get(name).identities == expected


def test_profiles_differ_in_every_identity_but_share_none():
    a, b = profiles.get("coppelius").identities, profiles.get("tiny").identities
    for k in a:
        assert a[k] != b[k], k


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(KeyError, match="known: coppelius, tiny"):
        profiles.get("huge")


def test_importing_plan_profiles_imports_no_triton_or_torch():
    import subprocess, sys
    code = ("import sys, coppelius.plan.profiles, coppelius.staging.layout, coppelius.staging.records, coppelius.staging.views;"
            "bad=[m for m in ('triton','torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    subprocess.run([sys.executable, "-c", code], check=True)
