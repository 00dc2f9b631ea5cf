"""A tiny checkpoint whose parameters are far from their initial values, for the export tests.

At initialization (matrices N(0, 0.02²), gains 1) attention is nearly uniform and the MLP nearly
linear, so a wrong transpose of Wq, a wrong rotary convention or swapped gate/up change the logits
by less than the bf16 tolerance (measured: 3e-3 of max|logit|, the same as the right mapping).  A
seeded perturbation makes every part of the model matter: the gains drawn around 1 (σ 0.3: the
embedding fold and the final norm), Wq and Wk ×8 (sharp attention: the head order and the rotary
convention), Wgate and Wup ×4 (SwiGLU's nonlinearity: gate before up).
"""
import numpy as np
import pytest

from coppelius import checkpoints as ckpt
from coppelius.plan import profiles as P
from coppelius.plan import reference as ref

SEED = 34
GAIN_SIGMA = 0.3
QK_SCALE = 8.0
GATE_UP_SCALE = 4.0
UPDATE_COUNT = 3            # any: the export records it


def perturbed_plane(profile) -> np.ndarray:
    rng = np.random.default_rng(SEED)
    plane = ref.init_parameters(profile)
    W = ref.unflatten(profile, plane)
    for name in ("g_embed", "g_final"):
        W[name][:] = 1 + GAIN_SIGMA * rng.standard_normal(W[name].shape).astype(np.float32)
    for i in range(profile.layers):
        for name, scale in (("wq", QK_SCALE), ("wk", QK_SCALE), ("wgate", GATE_UP_SCALE),
                            ("wup", GATE_UP_SCALE)):
            W[f"layers.{i}.{name}"][:] *= np.float32(scale)
    return plane


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """(path, P plane) of a tiny checkpoint holding the perturbed parameters."""
    prof = P.get("tiny")
    plane = perturbed_plane(prof)
    zeros = np.zeros_like(plane)
    path = tmp_path_factory.mktemp("export") / "tiny.ckpt"
    ckpt.publish(path, prof, plane, zeros, zeros, update_count=UPDATE_COUNT)
    return path, plane
