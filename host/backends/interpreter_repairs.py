"""What the interpret backend changes in Triton's interpreter, and why: one place, applied once.

Triton 3.9's interpreter evaluates a kernel with numpy.  Left alone it would disagree with the GPU
in two places, give different bits on different CPUs in four, and spend most of its time in one
check that it throws away.  Each repair touches the interpreter only; the kernels are never
changed for it, and none moves a rounding point of docs/NUMERICS.md.

Agreement with the GPU:
  * fp32 → bf16 conversion truncates (even with rounding "rtne"); the GPU rounds to nearest even:
    `bf16_bits`, the reference's one definition of the rounding;
  * tl.dot on bf16 operands multiplies their raw uint16 bits: the operands are widened first.

The same bits on every CPU (docs/NUMERICS.md, "CPU-side arithmetic"):
  * tl.dot is numpy's matmul, i.e. OpenBLAS sgemm, whose summation order depends on the kernel
    family OpenBLAS picks for the CPU and on its threads: `ordered_dot` adds the K products to the
    accumulator one k at a time, in k order, each addition rounded to fp32 (a bf16 × bf16 product
    is exact in fp32, so only the additions round);
  * tl.sum of floats is numpy's pairwise sum, whose blocking numpy chooses: `folded_sum` halves
    the axis instead (element i plus element i + n/2, again until one is left), the shape of a
    GPU's shuffle tree;
  * tl.exp, exp2, log, log2, sin and cos are numpy's, whose SIMD paths (AVX2, AVX-512) and libm
    fallbacks round differently: `coppelius.plan.reference.elementary`, built from IEEE basic
    operations only;
  * tl.erf is libm's: refused (no kernel uses it; add a definition to elementary first).
  Left as they are, because IEEE 754 fixes their bits on every CPU: + − × ÷, sqrt (tl.sqrt,
  sqrt_rn), rsqrt (1 / sqrt: two correctly rounded operations), fma (the interpreter's C fma),
  min/max, comparisons, conversions, integer sums (modular), cumsum (sequential by definition).

Speed (the bits cannot change: the same values are computed):
  * the integer-overflow sanitizer computes an int64 copy of every integer add, sub and mul, two
    comparisons and an `and`, then hands them to `device_assert`, which drops them unless the
    kernel is compiled with debug (it is not, here or on the GPU): switched off, a one-step tiny
    run went from 46.7 s to 31.3 s here;
  * `_get_np_dtype` builds a dictionary of fourteen dtypes at each of its ~360,000 calls a step:
    cached;
  * Triton patches triton.language again at every device-function call (below).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import triton.language as tl
from triton.runtime import interpreter as _interp

from coppelius.plan.reference import elementary
from coppelius.plan.reference.numerics import bf16_bits, bf16_bits_to_f32

# the interpreter's builder methods for the elementary functions → the project's definitions
ELEMENTARY = {"create_exp": "exp", "create_exp2": "exp2", "create_log": "log",
              "create_log2": "log2", "create_sin": "sin", "create_cos": "cos"}


def ordered_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """acc + a @ b with the K products added to acc one k at a time, in k order, each addition
    rounded to acc's dtype: (…, M, K) @ (…, K, N) + (…, M, N).  The bits are the same on every CPU,
    and the same whether a kernel's K loop hands the accumulator over in one block or in many."""
    out = np.array(acc, dtype=acc.dtype, copy=True)
    product = np.empty_like(out)
    a = a.astype(out.dtype, copy=False)
    b = b.astype(out.dtype, copy=False)
    for k in range(a.shape[-1]):
        np.multiply(a[..., :, k:k + 1], b[..., k:k + 1, :], out=product)
        np.add(out, product, out=out)
    return out


def folded_sum(data: np.ndarray, axis: int | None, keepdims: bool) -> np.ndarray:
    """The sum over `axis` (None: all) by halving: x[i] + x[i + h] for h = n // 2, an odd last
    element carried, until one row is left.  Floats only: integer sums are exact in any order."""
    x = np.asarray(data)
    if axis is None:
        x, axis_ = x.reshape(-1), 0
    else:
        axis_ = axis % x.ndim
    x = np.moveaxis(x, axis_, 0)
    while x.shape[0] > 1:
        n = x.shape[0]
        h = n // 2
        folded = x[:h] + x[h:2 * h]
        x = np.concatenate((folded, x[2 * h:]), axis=0) if n % 2 else folded
    total = x[0] if x.shape[0] else np.zeros(x.shape[1:], dtype=x.dtype)
    if not keepdims:
        return total
    if axis is None:
        return total.reshape((1,) * np.ndim(data))
    return np.expand_dims(total, axis_)


def _convert_float(convert):
    def convert_float(data, src, dst, rounding_mode):
        truncating = rounding_mode == _interp._ir.ROUNDING_MODE.RTZ
        if src == tl.float32 and dst == tl.bfloat16 and not truncating:
            return bf16_bits(data)          # the reference's rounding, one definition
        if src == tl.bfloat16 and dst == tl.float32:
            return bf16_bits_to_f32(data)
        return convert(data, src, dst, rounding_mode)
    return convert_float


def _dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    def widened(h):
        return bf16_bits_to_f32(h.data) if h.dtype.scalar == tl.bfloat16 else h.data
    if d.data.dtype.kind != "f":
        raise NotImplementedError(f"tl.dot into {d.data.dtype}: the interpret backend defines "
                                  "float accumulators only (host/backends/interpreter_repairs.py)")
    return _interp.TensorHandle(ordered_dot(widened(a), widened(b), d.data), d.dtype.scalar)


def _elementary(name: str):
    function = elementary.FUNCTIONS[name]

    def create(self, arg):
        return _interp.TensorHandle(function(arg.data), arg.dtype.scalar)
    return create


def _refuse_erf(self, arg):
    raise NotImplementedError("tl.erf is libm's in the interpreter and would differ between CPUs: "
                              "give it a definition in coppelius.plan.reference.elementary first")


def _sum(self, input):
    data = input.handle.data
    if data.dtype.kind == "f":
        return self.to_tensor(folded_sum(data, self.axis, self.keep_dims), input.dtype)
    return self.to_tensor(np.sum(data, axis=self.axis, keepdims=self.keep_dims), input.dtype)


def _cached_np_dtype(lookup):
    cache: dict = {}
    pointer = np.dtype(np.uint64)       # the interpreter's pointers (pointer types do not hash)

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.block_type):          # block types do not hash either
            tt_dtype = tt_dtype.element_ty
        if isinstance(tt_dtype, tl.pointer_type):
            return pointer
        try:
            return cache[tt_dtype]
        except KeyError:
            cache[tt_dtype] = found = lookup(tt_dtype)
            return found
    return np_dtype


def _skip_nested_language_patches() -> None:
    """Triton 3.9's interpreter patches triton.language again at every device-function call
    (`inspect.getmembers` over tl, tl.tensor, tl.math) into a scope it never restores: 15,086
    patches in a one-step tiny run, 16 s of its 70 s (cProfile).  Inside a launch the launch's
    own patch already holds for its modules, and a nested one would set the same fn-independent
    wrappers, so a device function whose language modules the running launch has patched (tl;
    tl.core once triton.language's own helpers, cdiv, zeros, sum, have been called) skips it; any
    other call takes Triton's path.  The bits cannot change: the same wrappers run either way."""
    patch_lang, run_grid = _interp._patch_lang, _interp.GridExecutor.__call__
    launches: list[dict] = []               # the running launch: its modules, whether patched

    def languages(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}

    def maybe_patch_lang(fn):
        launch = launches[-1] if launches else None
        if launch is not None and launch["patched"] and languages(fn) <= launch["languages"]:
            return _interp._LangPatchScope()        # nothing to restore
        scope = patch_lang(fn)
        if launch is not None:                      # the launch's own patch comes first; then
            launch["patched"] = True                # tl.core, for triton.language's helpers
            launch["languages"] |= languages(fn)
        return scope

    def grid_call(self, *args, **kwargs):
        launches.append({"languages": languages(self.fn), "patched": False})
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            launches.pop()

    _interp._patch_lang = maybe_patch_lang
    _interp.GridExecutor.__call__ = grid_call


def apply() -> None:
    """Repair the interpreter (once per process; later calls do nothing)."""
    if getattr(_interp, "_coppelius_patched", False):
        return
    builder = _interp.InterpreterBuilder
    _interp._convert_float = _convert_float(_interp._convert_float)
    builder.create_dot = _dot
    for method, name in ELEMENTARY.items():
        setattr(builder, method, _elementary(name))
    builder.create_erf = _refuse_erf
    _interp.ReduceOps.sum = _sum
    _interp.interpreter_builder.options = dataclasses.replace(
        _interp.interpreter_builder.options, sanitize_overflow=False)
    _interp._get_np_dtype = _cached_np_dtype(_interp._get_np_dtype)
    _skip_nested_language_patches()
    _interp._coppelius_patched = True
