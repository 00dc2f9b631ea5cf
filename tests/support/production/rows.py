"""Oracles of the head's row kernels (plan/kernels/cross_entropy.py: cross_entropy, predictions)
and of the flat copies (copy_f32; cast_bf16, the P → w16 refresh of plan/kernels/adamw.py)."""
from __future__ import annotations

import numpy as np

from coppelius.plan import reference as ref

from tests.support.production.harness import EXACT, T_ELEM, T_ULP, oracle
from tests.support.production.programs import sample, span


@oracle("cross_entropy")
class _CrossEntropy:
    """ce (loss record and w0) and bf(dlogits): the reference cross_entropy(_backward) stages."""

    def setup(self, case):
        T, V, rows = case.scalar("T"), case.const("V"), case.const("ROWS")
        logits = case.input("logits_ptr", (T, V), scale=4.0)
        targets = case.rng.integers(0, V, T).astype(np.uint32)
        targets[0], targets[T - 1] = V - 1, 0
        case.input("targets_ptr", values=targets)
        case.input("inputs_ptr", values=np.roll(targets, 1))
        case.cache["ce"] = ref.cross_entropy(logits, targets)
        case.cache["dl"] = ref.bf16(ref.cross_entropy_backward(logits, targets))
        case.output("loss_ptr", (T,), T_ELEM)
        case.output("w0_ptr", (T,), T_ELEM)
        case.output("dlogits_ptr", (T, V), T_ULP)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        rows = span(pid, case.const("ROWS"), case.scalar("T"))
        yield "loss_ptr", (rows,), case.cache["ce"][rows]
        yield "w0_ptr", (rows,), case.cache["ce"][rows]
        yield "dlogits_ptr", (rows,), case.cache["dl"][rows]


@oracle("predictions")
class _Predictions:
    """pred[i] = {first index of the largest finite logit, all finite} of row ROW{i}."""

    def setup(self, case):
        V = case.const("V")
        rows = case.const("ROW0", "ROW1", "ROW2")
        for i, r in enumerate(rows):
            x = case.rng.standard_normal(V, dtype=np.float32)
            if i == 0:
                x[[7, 3000]] = 50.0                                   # a tie: the first index wins
            elif i == 1:
                x[11] = np.nan                                        # invalid row
                x[12] = 99.0
            else:
                x[V - 1] = 60.0                                       # the last column, past it masked
            case.input("logits_ptr", values=x, at=r * V, key=f"row{i}")
        case.output("pred_ptr", (len(rows), 2), EXACT)

    def programs(self, case):
        return list(range(case.launch.grid[0]))

    def expect(self, case, pid):
        x = case.data[f"row{pid}"]
        finite = np.isfinite(x)
        token = int(np.argmax(np.where(finite, x, -np.inf)))
        yield "pred_ptr", (pid,), np.array([token, int(finite.all())], np.uint32)


def _chunk(case, pid):
    n, blk = case.scalar("N"), case.const("BLOCK")
    return span(pid, blk, n)


@oracle("copy_f32")
class _Copy:
    """dst[0:N] = src[0:N], bit for bit."""

    def setup(self, case):
        n = case.scalar("N")
        case.input("src_ptr", (n,))
        case.output("dst_ptr", (n,), EXACT)

    def programs(self, case):
        return sample(case.launch.grid[0])

    def expect(self, case, pid):
        c = _chunk(case, pid)
        yield "dst_ptr", (c,), case.data["src_ptr"][c]


@oracle("cast_bf16")
class _Cast:
    """dst = bf(src): the reference bf16 (round to nearest even), bit for bit; only the sampled
    programs' chunks are written as inputs (N is 57.7 M)."""

    def setup(self, case):
        n = case.scalar("N")
        case.output("dst_ptr", (n,), EXACT)
        case.hint = sample(case.launch.grid[0])
        for pid in case.hint:
            c = _chunk(case, pid)
            case.input("src_ptr", (c.stop - c.start,), at=c.start, key=f"src{pid}")

    def programs(self, case):
        return case.hint

    def expect(self, case, pid):
        yield "dst_ptr", (_chunk(case, pid),), ref.bf16(case.data[f"src{pid}"])
