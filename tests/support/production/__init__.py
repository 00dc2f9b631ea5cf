"""Production launches in Triton's interpreter, a chosen sample of programs each.

One `Case` per launch (a `coppelius.plan.launches.Launch`, unchanged: its function, constexprs, grid and
arguments).  Every buffer the launch names is a full-size, lazily allocated anonymous mapping
(plan/buffers.py sizes, a 64 KiB guard either side: memory.py), so each BufferRef offset is
honoured as on the GPU (the pointer is base + offset) while only the pages a case touches cost
memory; staging is one 8 MiB region poisoned with coppelius.staging.layout.POISON_BYTE.  A case runs in five
steps (harness.check_launch):

  1. the registry entry's `setup` writes random inputs (`case.input`) and declares the outputs
     (`case.output`, with the tolerance of each) in the logical shapes the kernel addresses;
  2. `programs` picks the program ids to run (the first, the last, a few between, and the ones that
     reach masks and boundaries);
  3. `expect(case, pid)` yields, for one program, each output region it owns (derived from the
     kernel's program → tile mapping, written once in programs.py: `matmul_tile`,
     `attention_split_of`, `rmsnorm_bwd_gain_program`, `weight_grad_program`) with the numpy
     oracle's values there;
  4. watched memory is poisoned (device buffers 0xFF, NaN / -1; staging 0xA5) except the inputs,
     whose bytes are kept: a whole buffer when it is ≤ 64 MiB (staging always), else each input
     and output region (or, for outputs over 64 MiB — the P/M/V planes, the w16 cast — each owned
     run) with GUARD_ELEMENTS either side.  A write far outside those windows of a large buffer
     (pmv, w16, ab) is not seen; the owned region staying poison still is (checks.prepare);
  5. `run_programs` executes only the chosen programs; then every owned element must hold the
     oracle's value within its tolerance and be written (not poison: an output that is also an
     input, e.g. ACCUMULATE, is judged by its value), and every other watched byte must hold what
     it held before (no stray writes).  Failures name the element and where it is (checks.verify).

The oracles, one module per kernel family: matmul.py, attention.py, norms.py, embed.py,
learner.py (weight_grad and the reference learner the fused AdamW updates share), rows.py
(cross_entropy, predictions, copy_f32, cast_bf16).  Adding a kernel family:

    @oracle("my_function")          # the Triton function name, Launch.function
    class _MyFunction:
        def setup(self, case): ...  # case.scalar("M"), case.const("BLOCK_M"), case.input(...), case.output(...)
        def programs(self, case): return sample(case.launch.grid[0], <pids that hit edges>)
        def expect(self, case, pid): yield "c_ptr", (rows, cols), want   # ints / unit-step slices

and import its module below.  `case.input(name, shape | values=, at=)` writes at the argument's
offset (+ `at` elements) and returns what the kernel reads (bf16-rounded for bf16 buffers), kept
in `case.data`; `case.cache` holds oracle intermediates; `case.hint` carries programs chosen in
setup when the inputs depend on them (cast, the fused updates: only the sampled chunks of the
57.7 M-element planes are written); `case.run_scalars["t_base"]` gives RunScalar values.  An entry that cannot
run in the interpreter goes to harness.SKIPPED with its reason.  A production launch whose
function is in neither fails tests/plan/test_production_launches.py.  Program → tile mappings get a
small-shape test there (each program run alone writes exactly what the mapping says).
"""
from tests.support.production import attention, embed, learner, matmul, norms, rows  # noqa: F401  (each registers its oracles)
