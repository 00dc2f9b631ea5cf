"""Which programs of a launch run, and which tiles they own: the interpreter's grid narrowed to a
chosen sample, and each kernel family's program → work mapping, written once from the kernels."""
from __future__ import annotations

import contextlib

import coppelius.backends.interpret  # noqa: F401  (TRITON_INTERPRET=1 and the repaired interpreter)
import numpy as np
from triton.runtime import interpreter as _interp

from coppelius.plan.attention_split import AttentionSplit
from coppelius.plan.ints import cdiv


# ---------------------------------------------------------------- choosing programs

@contextlib.contextmanager
def _chosen_programs(grid, pids, ran):
    """Make the interpreter run `pids` (3-tuples) of `grid` when launched with grid (len(pids),).

    Triton 3.9.0's GridExecutor.__call__ calls the module-level `interpreter_builder.set_grid_dim`
    with the launch grid, then `set_grid_idx(x, y, z)` before each program, and program_id /
    num_programs read those.  Shadowing the two methods on the builder instance maps loop index x
    to pids[x] and reports the real grid, so the kernel sees exactly what the GPU would give that
    program.  `ran` records what executed; run_programs checks it, so a Triton that iterates the
    grid some other way fails loudly instead of running the wrong programs."""
    builder = _interp.interpreter_builder
    cls = type(builder)
    real_dim, real_idx = cls.set_grid_dim, cls.set_grid_idx

    def set_grid_dim(nx, ny, nz):
        if (nx, ny, nz) != (len(pids), 1, 1):
            raise RuntimeError(f"interpreter launched grid {(nx, ny, nz)}, expected ({len(pids)}, 1, 1)")
        real_dim(builder, *grid)

    def set_grid_idx(x, y, z):
        if (y, z) != (0, 0):
            raise RuntimeError(f"interpreter program ({x}, {y}, {z}) outside the sample grid")
        real_idx(builder, *pids[x])
        ran.append(pids[x])

    builder.set_grid_dim, builder.set_grid_idx = set_grid_dim, set_grid_idx
    try:
        yield
    finally:
        del builder.set_grid_dim, builder.set_grid_idx


def _pid3(pid) -> tuple[int, int, int]:
    t = (pid,) if isinstance(pid, (int, np.integer)) else tuple(pid)
    return tuple(int(v) for v in t) + (0,) * (3 - len(t))


def run_programs(fn, grid, pids, args, constexprs, num_warps: int = 4, num_stages: int = 3) -> None:
    """Run the programs `pids` (ints or tuples) of a launch of `fn` over `grid`, in that order.
    num_warps / num_stages go with the launch as on the GPU; the interpreter accepts and drops them
    (they shape the compiled code only: tests/tools/test_ptx.py and the manifest cover that)."""
    grid = tuple(grid) + (1,) * (3 - len(grid))
    chosen = [_pid3(p) for p in pids]
    for p in chosen:
        if not all(0 <= v < g for v, g in zip(p, grid)):
            raise ValueError(f"program {p} outside grid {grid}")
    ran: list = []
    with _chosen_programs(grid, chosen, ran):
        fn[(len(chosen),)](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
    if ran != chosen:
        raise RuntimeError(f"the interpreter ran programs {ran[:8]}, asked for {chosen[:8]}")


def sample(n: int, *extra: int) -> list[int]:
    """Program ids of a 1-D grid of n: the first, the last, a third and two thirds in, and `extra`."""
    bad = [e for e in extra if not 0 <= e < n]
    if bad:
        raise ValueError(f"programs {bad} outside a grid of {n}")
    return sorted({0, n - 1, n // 3, 2 * n // 3, *extra})


# ---------------------------------------------------------------- program → tile mappings

def span(i: int, size: int, limit: int) -> slice:
    """The elements of block i of `size` in a dimension of `limit` (the last block ragged)."""
    return slice(i * size, min((i + 1) * size, limit))


def matmul_tile(pid: int, M: int, N: int, BM: int, BN: int, GROUP_M: int) -> tuple[int, int]:
    """(pid_m, pid_n) of program pid: plan/kernels/matmul.py `_tile_ids`, grouped ordering."""
    tiles_m, tiles_n = cdiv(M, BM), cdiv(N, BN)
    per_group = GROUP_M * tiles_n
    first_m = pid // per_group * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    return first_m + pid % per_group % size_m, pid % per_group // size_m


def matmul_pid(pid_m: int, pid_n: int, M: int, N: int, BM: int, BN: int, GROUP_M: int) -> int:
    """The program that owns tile (pid_m, pid_n): the inverse of matmul_tile."""
    tiles_m, tiles_n = cdiv(M, BM), cdiv(N, BN)
    first_m = pid_m // GROUP_M * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    return first_m * tiles_n + pid_n * size_m + pid_m - first_m


def matmul_split(pid: int, M: int, N: int, K: int, BM: int, BN: int, BK: int, S: int):
    """(tile pid, K range) of program pid of a split-K matmul: plan/kernels/matmul.py — program
    split · tiles + tile sums chunks [split · per, (split + 1) · per) of cdiv(K, BK)."""
    tiles = cdiv(M, BM) * cdiv(N, BN)
    split, per = pid // tiles, cdiv(cdiv(K, BK), S) * BK
    return pid % tiles, slice(min(K, split * per), min(K, (split + 1) * per)), split


def weight_grad_program(pid: int, tiles: list[int], programs: int) -> list[tuple[int, int]]:
    """The (product j, tile) pairs program pid runs, in order: tiles pid, pid + programs, … of
    the products' tiles numbered in turn (plan/kernels/weight_grad.py)."""
    out = []
    for t in range(pid, sum(tiles), programs):
        j = 0
        while t >= tiles[j]:
            t -= tiles[j]
            j += 1
        out.append((j, t))
    return out


def attention_split_of(case) -> AttentionSplit:
    """The attention launch's program → work mapping (plan/attention_split.py, which the kernels'
    id decode follows) from its T and constexprs; BLOCK_N is the launch's own key block (the
    forward's, or the backward's)."""
    c = dict(case.launch.constexprs)
    return AttentionSplit(case.scalar("T"), c["BLOCK_M"], c["BLOCK_N"], c["HEADS"],
                          c.get("KV_HEADS", c["HEADS"]), c["BLOCK_N"], c.get("BWD_CHUNK", 1))


def rmsnorm_bwd_gain_program(pid: int, T: int, BLOCK_R: int):
    """("rows", row block) for the first cdiv(T, BLOCK_R) programs, then ("gain", column block)."""
    row_programs = cdiv(T, BLOCK_R)
    return ("rows", pid) if pid < row_programs else ("gain", pid - row_programs)
