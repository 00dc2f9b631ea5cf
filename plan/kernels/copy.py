"""Writers: copy fp32 words from a device buffer to staging (record parts, w1, w2, w3)."""
import triton
import triton.language as tl
from coppelius.plan.kernels.grid_dependency import await_previous_grid


@triton.jit
def copy_f32(src_ptr, dst_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """dst[0:N] = src[0:N] (fp32 words)."""
    await_previous_grid(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask, other=0.0), mask=mask)
