"""The production-launch registry and its runner: one oracle per Triton function, the reasons
for the launches that have none, and check_launch, which sets a case up, runs its sampled
programs and raises on any failure.  The named tolerances an output is declared with are here,
their values tests/support/tolerances.py's."""
from __future__ import annotations

from dataclasses import dataclass

from tests.support import tolerances

from coppelius.plan import launches

from tests.support.production import checks
from tests.support.production.case import Case


@dataclass(frozen=True)
class Tol:
    """A named tolerance: |got − want| ≤ rel · max|want|, the max over every region of that output
    the sampled programs own, as the kernel tests take it over the expected array (0: bit-exact)."""
    name: str
    rel: float


def _named(name: str) -> Tol:
    return Tol(name, getattr(tolerances, name))


EXACT = _named("EXACT")
T_SAME = _named("SAME_OPERANDS")
T_ULP = _named("ONE_BF16_ULP")
T_ELEM = _named("ELEMENTWISE")
T_ATT_OUT = _named("ATTENTION_OUT")
T_ATT_GRAD = _named("ATTENTION_GRAD")
T_ATT_GRAD16 = _named("ATTENTION_GRAD16")
T_ADAMW = _named("ADAMW_REL")
T_LSE = _named("LSE")
T_GAIN_SUM = _named("GAIN_SUM")
T_Z16 = _named("SWIGLU_Z16")
T_DELTA = _named("DELTA_SUM")

REGISTRY: dict[str, object] = {}
SKIPPED = {
    launches.RELEASE: "hand-written PTX (plan/kernels/release.ptx), not Triton: the interpret backend "
               "emulates it in Python; its semaphore records are checked by the host tests",
    launches.STAGE_IN: "hand-written PTX (plan/kernels/release_stage_in.ptx), not Triton: the interpret "
                "backend emulates it; tests/staging/test_staging_reads.py and test_agreements.py check "
                "what it loads and the layout it copies",
}


def oracle(function: str):
    """Register the decorated class (instantiated once) as the oracle of Triton `function`."""
    def register(cls):
        if function in REGISTRY:
            raise ValueError(f"two oracles for {function!r}")
        REGISTRY[function] = cls()
        return cls
    return register


class UnknownKernel(LookupError):
    pass


def check_launch(launch, specs, profile=None, seed: int | None = None, pids=None) -> dict:
    """Run one launch's sampled programs and check them; raises AssertionError listing every
    failure.  `pids` overrides the entry's sample.  Returns {"programs": n, "pids": [...],
    "run_s": interpreter seconds}."""
    entry = REGISTRY.get(launch.function)
    if entry is None:
        raise UnknownKernel(
            f"{launch.kernel} ({launch.label}): no oracle for Triton function {launch.function!r} "
            f"in tests/support/production/ REGISTRY — add one (production/__init__.py says how)")
    case = Case(launch, specs, profile, seed)
    entry.setup(case)
    case.pids = list(entry.programs(case) if pids is None else pids)
    checks.prepare(case, entry)
    seconds = case.run()
    failures = checks.verify(case)
    if any(failures.values()):
        shown = []
        for kind, lines in failures.items():
            shown += lines[:6] + ([f"... {len(lines) - 6} more {kind}"] if len(lines) > 6 else [])
        raise AssertionError(f"{launch.kernel} ({launch.label}), programs {case.pids}:\n  "
                             + "\n  ".join(shown))
    return {"programs": len(case.pids), "run_s": seconds, "pids": case.pids}
