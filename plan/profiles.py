"""Profiles: model dimensions, run policy, learner rationals, the parameter table and identities.

`get(name)` is the one way in.  Everything here is plain data: importing it never imports Triton,
torch or the driver.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from coppelius.plan.ints import cdiv
from coppelius.staging.errors import UserError
from coppelius.staging.layout import TRANSFER_WINDOW_BYTES

SEED = 20260925                 # CONTRACT §2: fresh initialization draws from this
CHUNK_BYTES = TRANSFER_WINDOW_BYTES     # CONTRACT §10: a checkpoint chunk passes through the window
PLANES = 3                      # P, M, V
BYTES_PER_SCALAR = 4            # fp32 planes
ROPE_BASE = 10000.0             # CONTRACT §3
RMS_EPS = 1e-6                  # CONTRACT §3
INIT_STD = 0.02                 # CONTRACT §4
PREDICTION_ROWS = (255, 511, 1023)  # CONTRACT §6: the rows whose next token is predicted


@dataclass(frozen=True)
class Parameter:
    """One named tensor of the flat P plane: shape, element offset, whether AdamW decays it."""
    name: str
    shape: tuple[int, ...]
    offset: int                 # elements from the start of the plane
    decay: bool

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def end(self) -> int:
        return self.offset + self.size

    # acceptance checks unpack `(name, shape, offset)`
    def __iter__(self):
        return iter((self.name, self.shape, self.offset))

    def __getitem__(self, i):
        return (self.name, self.shape, self.offset)[i]

    def __len__(self):
        return 3


@dataclass(frozen=True)
class Rational:
    """An unreduced numerator/denominator pair: the identity spells 95/100, not 19/20."""
    numerator: int
    denominator: int

    def __float__(self) -> float:
        return self.numerator / self.denominator


@dataclass(frozen=True)
class Learner:
    """AdamW hyperparameters as exact rationals (CONTRACT §4); `float(x)` gives the value."""
    lr: Rational = Rational(3, 10000)
    beta1: Rational = Rational(9, 10)
    beta2: Rational = Rational(95, 100)
    decay: Rational = Rational(1, 10)
    epsilon: Rational = Rational(1, 100000000)


@dataclass(frozen=True)
class Profile:
    """One model, its run policy and its identities (CONTRACT §2–§3).

    Glossary: the letters docs/CONTRACT.md, docs/NUMERICS.md, the kernels and the launch lists use.
      V vocab      T context    D width      L layers
      H heads      G kv_heads   d head_dim   F hidden
    Derived: H·d = q_width, G·d = kv_width, W = (H + 2G)·d the fused q|k|v columns
    (coppelius.plan.buffers.qkv_width), N = parameter_count (elements of one P/M/V plane).
    """
    name: str                   # "coppelius" (production) or "tiny" (tests, CPU demos)
    model_tag: str              # names the model in the learner identity
    vocab: int                  # V: token ids 0..V-1; rows of the embedding E and the head
    context: int                # T: tokens per context; rows of every activation
    width: int                  # D: the residual stream's columns
    layers: int                 # L: transformer layers
    heads: int                  # H: query heads
    kv_heads: int               # G: key/value heads; query head h reads kv head h // (H/G)
    head_dim: int               # d: columns per head (rotary rotates pairs i, i + d/2)
    hidden: int                 # F: SwiGLU hidden width (Wgate and Wup are (F, D))
    steps: int                  # AdamW updates per run
    checkpoint_interval: int    # updates between checkpoint publications
    seed: int = SEED            # fresh initialization draws from it (CONTRACT §4)
    learner: Learner = field(default_factory=Learner)   # AdamW hyperparameters (CONTRACT §4)

    # ---- derived sizes ----
    @property
    def parameters(self) -> tuple[Parameter, ...]:
        return _parameter_table(self)

    @property
    def parameter_count(self) -> int:
        return self.parameters[-1].end

    @property
    def payload_bytes(self) -> int:
        return PLANES * BYTES_PER_SCALAR * self.parameter_count

    @property
    def chunk_bytes(self) -> int:
        return CHUNK_BYTES

    @property
    def chunk_count(self) -> int:
        return cdiv(self.payload_bytes, CHUNK_BYTES)

    @property
    def publications(self) -> int:
        return self.steps // self.checkpoint_interval

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def parameter(self, name: str) -> Parameter:
        for p in self.parameters:
            if p.name == name:
                return p
        raise KeyError(f"profile {self.name!r} has no parameter {name!r}")

    @property
    def identities(self) -> dict[str, bytes]:
        return _identities(self)


def _parameter_table(p: Profile) -> tuple[Parameter, ...]:
    rows: list[Parameter] = []
    offset = 0

    def add(name: str, shape: tuple[int, ...], decay: bool) -> None:
        nonlocal offset
        rows.append(Parameter(name, shape, offset, decay))
        offset += rows[-1].size

    D, F = p.width, p.hidden
    add("embed", (p.vocab, D), True)
    add("g_embed", (D,), False)
    for layer in range(p.layers):
        add(f"layers.{layer}.wq", (p.q_width, D), True)
        add(f"layers.{layer}.wk", (p.kv_width, D), True)
        add(f"layers.{layer}.wv", (p.kv_width, D), True)
        add(f"layers.{layer}.wo", (D, p.q_width), True)
        add(f"layers.{layer}.wgate", (F, D), True)
        add(f"layers.{layer}.wup", (F, D), True)
        add(f"layers.{layer}.wdown", (D, F), True)
    add("g_final", (D,), False)
    add("head", (p.vocab, D), True)
    return tuple(rows)


def _identity_part(name: str, value: int) -> str:
    return f"|{name}={value}"


def _identities(p: Profile) -> dict[str, bytes]:
    lr = p.learner
    model = (f"{p.model_tag}-v{p.vocab}-t{p.context}-d{p.width}-l{p.layers}"
             f"-h{p.heads}-g{p.kv_heads}-f{p.hidden}")
    learner = ("coppelius-objective:next-token-cross-entropy-mean"
               f"|model={model}|halves=bf16-rne|adamw-decoupled-bias-corrected"
               + _identity_part("lr", lr.lr.numerator) + _identity_part("/", lr.lr.denominator)
               + _identity_part("beta1", lr.beta1.numerator) + _identity_part("/", lr.beta1.denominator)
               + _identity_part("beta2", lr.beta2.numerator) + _identity_part("/", lr.beta2.denominator)
               + _identity_part("decay", lr.decay.numerator) + _identity_part("/", lr.decay.denominator)
               + _identity_part("epsilon", lr.epsilon.numerator)
               + _identity_part("/", lr.epsilon.denominator))
    state = ("coppelius-raw-pmv-f32-v1|parameter-order:p-then-m-then-v"
             + _identity_part("payload", p.payload_bytes))
    data = ("coppelius-token-stream" + _identity_part("vocabulary", p.vocab)
            + _identity_part("context", p.context) + _identity_part("header", 16)
            + _identity_part("token", 4))
    # the production string is the seed's, byte for byte; other profiles name themselves
    profile_part = "" if p.name == "coppelius" else f"|profile={p.name}"
    initialization = ("coppelius-initialization:random-normal" + profile_part
                      + _identity_part("seed", p.seed))
    return {k: v.encode("ascii") for k, v in
            (("state", state), ("learner", learner), ("data", data),
             ("initialization", initialization))}


COPPELIUS = Profile(name="coppelius", model_tag="coppelius", vocab=12288, context=1024, width=512,
                    layers=9, heads=8, kv_heads=4, head_dim=64, hidden=2752,
                    steps=10000, checkpoint_interval=1000)
TINY = Profile(name="tiny", model_tag="tiny", vocab=512, context=1024, width=128, layers=2,
               heads=4, kv_heads=2, head_dim=32, hidden=352, steps=8, checkpoint_interval=4)

PROFILES: dict[str, Profile] = {p.name: p for p in (COPPELIUS, TINY)}


class UnknownProfile(UserError, KeyError):
    """A profile name that is not in PROFILES: a refusal with a hint (and still a KeyError)."""


def get(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(f"unknown profile {name!r}; known: {', '.join(PROFILES)}",
                             "`coppelius profiles` lists them with their dimensions") from None


def names() -> list[str]:
    return list(PROFILES)
