"""Programmatic dependent launch: the first statement of every kernel.

With PDL = True (the sm_90a build: tools/build_ptx.py sets it per target) a kernel's threads
first wait until the grids before it in its stream have finished and their memory is visible
(`griddepcontrol.wait`), then let the next grid launch (`griddepcontrol.launch_dependents`).  The
next kernel's launch and block dispatch then overlap this one instead of following it, and still
no kernel reads or writes global memory before its predecessors are done (the compiler may set
up a CTA's own shared memory before the wait: no other grid reaches it): the bits are a plain
launch's.
The host asks for the overlap per launch (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
host/driver/module.py); without it both instructions return at once.  PDL = False (sm_80, which has no
griddepcontrol, and the interpreter) compiles to nothing.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def await_previous_grid(PDL: tl.constexpr):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
