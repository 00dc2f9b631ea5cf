"""The level machine of the round-trip pass (ptx_chain.py: the rules are in its docstring): the
levels of registers, of memory ordering, of shared memory and of cp.async groups along one path,
one PTX instruction at a time."""
from __future__ import annotations

from tools.cost.ptx_parse import Instr


def _is_global_load(op: str) -> bool:
    return op.startswith(("ld.", "ldu.")) and ".global" in op


def _is_global_store(op: str) -> bool:
    return op.startswith(("st.", "red.", "atom.")) and ".global" in op


class State:
    """Levels along one path: registers, ordering, shared memory, cp.async groups."""

    def __init__(self):
        self.regs: dict[str, int] = {}
        self.order = 0             # loads may not issue below this (stores, barriers, fences)
        self.smem = 0              # level of what shared-memory reads see
        self.mem = 0               # highest issue level of any memory instruction so far
        self.top = 0               # highest level any value or load result reached
        self.groups: list[tuple[int, int]] = []    # committed cp.async groups: (id, ready level)
        self.open = None           # ready level of copies not yet committed
        self.loads = 0             # global loads (and async copies) walked
        self.issued = 0            # highest level any instruction so far issued at

    def copy(self) -> "State":
        s = State.__new__(State)
        s.__dict__ = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                      for k, v in self.__dict__.items()}
        return s

    def join(self, other: "State") -> "State":
        """The worse of two paths, field by field (a join of the CFG)."""
        s = self.copy()
        for r, lv in other.regs.items():
            s.regs[r] = max(lv, s.regs.get(r, 0))
        s.order, s.smem = max(s.order, other.order), max(s.smem, other.smem)
        s.mem, s.top = max(s.mem, other.mem), max(s.top, other.top)
        ids = dict(s.groups)
        for gid, lv in other.groups:
            ids[gid] = max(lv, ids.get(gid, 0))
        s.groups = sorted(ids.items())
        s.open = max(x for x in (s.open, other.open) if x is not None) \
            if (s.open, other.open) != (None, None) else None
        s.loads, s.issued = max(s.loads, other.loads), max(s.issued, other.issued)
        return s

    @property
    def level(self) -> int:
        """The highest level reached on this path (values, loads, barriers; a copy in flight
        counts once it is waited for)."""
        return max(self.top, self.order, self.smem)

    def at(self, regs) -> int:
        return max((self.regs.get(r, 0) for r in regs), default=0)

    def step(self, ins: Instr, next_gid) -> None:
        """Advance over one instruction; `issued` keeps the highest level any issued at."""
        self.issued = max(self.issued, self._step(ins, next_gid))

    def in_order(self) -> None:
        """A loop boundary (entry, exit, back edge): ptxas does not hoist a load across it, so the
        loads after it issue no earlier than every instruction before it."""
        self.order = max(self.order, self.issued)

    def _step(self, ins: Instr, next_gid) -> int:
        op = ins.op
        src = self.at(ins.srcs)
        if _is_global_load(op):
            issue = src if ".nc" in op else max(src, self.order)
            self._define(ins.dests, issue + 1)
            self.mem, self.loads = max(self.mem, issue), self.loads + 1
            return issue
        if op.startswith("cp.async.") and ".shared.global" in op:
            issue = max(src, self.order)
            self.open = max(issue + 1, self.open or 0)
            self.mem, self.loads = max(self.mem, issue), self.loads + 1
            return issue
        if op.startswith("cp.async.commit_group"):
            self.groups.append((next_gid(), self.open if self.open is not None else self.mem))
            self.open = None
            return src
        if op.startswith(("cp.async.wait_group", "cp.async.wait_all")):
            keep = int(ins.operands) if op.startswith("cp.async.wait_group") else 0
            done = self.groups[:len(self.groups) - keep] if keep else self.groups
            self.smem = max([self.smem] + [lv for _, lv in done])
            self.groups = self.groups[len(done):]
            return self.smem
        if _is_global_store(op):
            issue = max(src, self.order)
            self.order, self.mem = issue, max(self.mem, issue)
            if op.startswith("atom."):
                self._define(ins.dests, issue + 1)
            return issue
        if op.startswith(("bar.sync", "barrier.sync", "bar.red", "barrier.red", "bar.arrive")):
            lv = max(self.order, self.mem, self.smem, src)
            self.order = self.smem = lv
            self._define(ins.dests, lv)
            return lv
        if op.startswith(("fence", "membar")) and not op.startswith("fence.proxy"):
            self.order = max(self.order, self.mem, self.top)   # earlier accesses land first
            return self.order
        if op.startswith(("st.shared", "stmatrix")):
            self.smem, self.mem = max(self.smem, src), max(self.mem, src)
            return src
        if op.startswith(("ld.shared", "ldmatrix", "wgmma.mma_async")):
            lv = max(src, self.smem)
            self.mem = max(self.mem, lv)
            self._define(ins.dests, lv)
            return lv
        self._define(ins.dests, src)
        return src

    def _define(self, regs, lv: int) -> None:
        for r in regs:
            self.regs[r] = lv
        self.top = max(self.top, lv)
