"""PTX as the round-trip pass (ptx_chain.py) reads it: each `.entry`'s instructions (guard, opcode,
destination and source registers), its basic blocks and their successors, and its natural loops
(dominators, back edges).  Only what the pass needs: `.func` bodies are skipped (a `call` is an
instruction like another), declarations and comments dropped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_ENTRY = re.compile(r"^\s*\.visible\s+\.entry\s+(\w+)\s*\(", re.M)
_LABEL = re.compile(r"^\s*(\$?[\w.$]+):")
_REG = re.compile(r"%[A-Za-z_][\w]*")
_BRACE = re.compile(r"[{}]")
_GUARD = re.compile(r"^@(!?)(%\w+)\s+")
# instructions that write memory, or nothing, rather than their first operand
_NO_DEST = ("st.", "stmatrix", "cp.async", "bar", "barrier", "fence", "membar", "bra", "ret",
            "exit", "griddepcontrol", "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group",
            "red.", "prefetch", "trap")


@dataclass(frozen=True)
class Instr:
    op: str                        # the opcode with its modifiers: "ld.global.v4.b32"
    dests: tuple[str, ...]         # registers written
    srcs: tuple[str, ...]          # registers read (the guard's predicate among them)
    operands: str = ""             # the operand text, for the branch target and group counts


@dataclass
class Block:
    label: str
    instrs: list[Instr] = field(default_factory=list)
    succs: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Loop:
    header: int
    body: frozenset[int]           # block indices, the header among them
    latches: tuple[int, ...]       # blocks with a back edge to the header


def entry_bodies(ptx: str) -> dict[str, str]:
    """entry name → the text of its body (between its braces)."""
    out = {}
    for m in _ENTRY.finditer(ptx):
        start = ptx.index("{", ptx.index(")", m.end()))
        depth = 0
        for b in _BRACE.finditer(ptx, start):
            depth += 1 if b.group() == "{" else -1
            if depth == 0:
                break
        out[m.group(1)] = ptx[start + 1:b.start()]
    if not out:
        raise ValueError("no .visible .entry in this PTX (is it a PTX file?)")
    return out


def _split_operands(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_instr(stmt: str) -> Instr | None:
    """One statement (no trailing ';'), or None for a declaration or an empty one."""
    s = stmt.strip().strip("{}").strip()
    if not s or s.startswith("."):
        return None
    srcs = []
    g = _GUARD.match(s)
    if g:
        srcs.append(g.group(2))
        s = s[g.end():]
    op, _, rest = s.partition(" ")
    op, rest = op.strip(), rest.strip()
    ops = _split_operands(rest)
    if op.startswith(_NO_DEST) or not ops:
        dests, reads = (), ops
    elif op.startswith("wgmma.mma_async"):        # the accumulators are read and written
        dests, reads = tuple(_REG.findall(ops[0])), ops
    else:
        dests, reads = tuple(_REG.findall(ops[0])), ops[1:]
    for o in reads:
        srcs += _REG.findall(o)
    return Instr(op, dests, tuple(srcs), rest)


def _statements(body: str):
    """(label or None, statement) in order, comments dropped."""
    for line in body.splitlines():
        line = line.split("//", 1)[0].strip()
        if not line:
            continue
        m = _LABEL.match(line)
        if m and not line.startswith("@"):
            yield m.group(1), None
            line = line[m.end():].strip()
        for stmt in line.split(";"):
            if stmt.strip():
                yield None, stmt


def blocks_of(body: str) -> list[Block]:
    """The body's basic blocks in text order, each with its successors (fallthrough, target)."""
    blocks = [Block("<entry>")]
    for label, stmt in _statements(body):
        if label is not None:
            if blocks[-1].instrs or blocks[-1].label != "<entry>":
                blocks.append(Block(label))
            else:
                blocks[-1].label = label
            continue
        ins = parse_instr(stmt)
        if ins is None:
            continue
        if blocks[-1].instrs and blocks[-1].instrs[-1].op.startswith(("bra", "ret", "exit")):
            blocks.append(Block(f"<after {len(blocks)}>"))
        blocks[-1].instrs.append(ins)
    index = {b.label: i for i, b in enumerate(blocks)}
    for i, b in enumerate(blocks):
        last = b.instrs[-1] if b.instrs else None
        if last is not None and last.op.startswith("bra"):
            target = last.operands.strip()
            if target not in index:
                raise ValueError(f"branch to unknown label {target!r} in block {b.label}")
            b.succs.append(index[target])
            unconditional = not last.srcs           # a guard reads its predicate
            if not unconditional and i + 1 < len(blocks):
                b.succs.append(i + 1)
        elif not (last is not None and last.op.startswith(("ret", "exit"))) and i + 1 < len(blocks):
            b.succs.append(i + 1)
    return blocks


def reverse_postorder(blocks: list[Block]) -> list[int]:
    seen, order = set(), []
    stack = [(0, iter(blocks[0].succs))]
    seen.add(0)
    while stack:
        node, it = stack[-1]
        nxt = next((s for s in it if s not in seen), None)
        if nxt is None:
            order.append(node)
            stack.pop()
        else:
            seen.add(nxt)
            stack.append((nxt, iter(blocks[nxt].succs)))
    return order[::-1]


def dominators(blocks: list[Block], rpo: list[int]) -> dict[int, set[int]]:
    preds = {i: [p for p in rpo if i in blocks[p].succs] for i in rpo}
    dom = {i: set(rpo) for i in rpo}
    dom[rpo[0]] = {rpo[0]}
    changed = True
    while changed:
        changed = False
        for i in rpo[1:]:
            new = set.intersection(*(dom[p] for p in preds[i])) | {i} if preds[i] else {i}
            if new != dom[i]:
                dom[i], changed = new, True
    return dom


def natural_loops(blocks: list[Block]) -> tuple[list[int], list[Loop]]:
    """(reverse postorder, the natural loops — one per header, innermost first)."""
    rpo = reverse_postorder(blocks)
    dom = dominators(blocks, rpo)
    latches: dict[int, list[int]] = {}
    for u in rpo:
        for v in blocks[u].succs:
            if v in dom[u]:
                latches.setdefault(v, []).append(u)
    loops = []
    for h, ls in latches.items():
        body, work = {h}, list(ls)
        while work:
            n = work.pop()
            if n not in body:
                body.add(n)
                work += [p for p in rpo if n in blocks[p].succs]
        loops.append(Loop(h, frozenset(body), tuple(ls)))
    return rpo, sorted(loops, key=lambda lp: len(lp.body))
