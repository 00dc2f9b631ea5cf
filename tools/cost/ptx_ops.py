"""Instructions per thread of a stretch of PTX, as the SM issues them: each PTX instruction one
issue slot, except the correctly rounded fp32 division and square root, which ptxas expands into a
MUFU seed, Newton steps and a range check that branches to a slow-path call (inputs.DIV_RN_F32,
SQRT_RN_F32: counted from the machine code), and the approximate transcendentals, one MUFU each.
The cost model charges `alu` at ALU_PER_CLK and `mufu` at MUFU_PER_CLK lanes per clock per SM, and
each CTA-wide barrier (`bars`) as a dependent wait (PHASE).
"""
from __future__ import annotations

from dataclasses import dataclass

from tools.cost.inputs import DIV_RN_F32, SQRT_RN_F32

MUFU_OPS = ("ex2.approx", "lg2.approx", "rcp.approx", "rsqrt.approx", "sin.approx",
            "cos.approx", "tanh.approx", "sqrt.approx", "div.approx", "div.full")
NOT_ISSUED = ("bar.warp.sync",)
BARRIERS = ("bar.sync", "barrier.sync", "bar.red", "barrier.red")         # a convergence hint: no instruction of its own here


@dataclass(frozen=True)
class Ops:
    """Issue slots per thread: `alu` on the integer/fp32 pipes, `mufu` on the special-function
    unit; `div_rn` and `sqrt_rn` of them the expanded fp32 operations."""
    alu: int = 0
    mufu: int = 0
    div_rn: int = 0
    sqrt_rn: int = 0
    bars: int = 0                  # CTA-wide barriers (bar.sync): a dependent wait each

    def __add__(self, o: "Ops") -> "Ops":
        return Ops(self.alu + o.alu, self.mufu + o.mufu, self.div_rn + o.div_rn,
                   self.sqrt_rn + o.sqrt_rn, self.bars + o.bars)


def op_cost(op: str) -> Ops:
    """The issue slots of one PTX instruction."""
    if op.startswith(NOT_ISSUED):
        return Ops()
    if op.startswith("div.rn.f32"):
        return Ops(DIV_RN_F32[1], DIV_RN_F32[0], div_rn=1)
    if op.startswith("sqrt.rn.f32"):
        return Ops(SQRT_RN_F32[1], SQRT_RN_F32[0], sqrt_rn=1)
    if op.startswith(MUFU_OPS):
        return Ops(0, 1)
    if op.startswith(BARRIERS):
        return Ops(1, 0, bars=1)
    return Ops(1, 0)


def count_ops(instrs) -> Ops:
    total = Ops()
    for ins in instrs:
        total = total + op_cost(ins.op)
    return total
