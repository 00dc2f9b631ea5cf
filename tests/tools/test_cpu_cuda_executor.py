"""The CPU drivers' executor (tools/cpu_cuda/executor.py) on small kernels over memory made here:
masked lanes past an allocation are not accesses, an unmasked one is CUDA_ERROR_ILLEGAL_ADDRESS
naming the kernel, the parameter and the offset; a parameter the PTX was specialized as
divisible by 16 that is not fails the launch by name; a faulty launch flips bit 0 of the first
element it stores; the packed bytes decode at their natural sizes, and too few are refused."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from tools.cpu_cuda import executor as EX

DEVICE_BASE = 0x10_0000_0000          # device addresses of the toy memory: never host ones
BLOCK = 64


@triton.jit
def scaled_copy(src_ptr, dst_ptr, N, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs_n < N
    tl.store(dst_ptr + offs_n, tl.load(src_ptr + offs_n, mask=mask) * SCALE, mask=mask)


@triton.jit
def unmasked_copy(src_ptr, dst_ptr, BLOCK: tl.constexpr):
    offs_n = tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs_n, tl.load(src_ptr + offs_n))


class ArrayMemory(EX.Memory):
    """numpy arrays as the device's allocations, each at its own device address."""

    def __init__(self, *arrays):
        self.arrays = list(arrays)
        self.bases = []
        at = DEVICE_BASE
        for a in arrays:
            self.bases.append(at)
            at += (a.nbytes + 4095) // 4096 * 4096 + 4096      # a gap between allocations

    def region(self, device_ptr):
        for base, a in zip(self.bases, self.arrays):
            if base <= device_ptr < base + a.nbytes:
                return EX.Region(base, a.nbytes, a.ctypes.data)
        return None


def entry(function, *params, constexprs=None, divisible=()) -> EX.KernelEntry:
    return EX.KernelEntry(key=f"{function}_test", where="test", module=__name__, function=function,
                         constexprs=constexprs or {}, divisible_by_16=frozenset(divisible),
                         params=tuple(EX.Param(n, t, False) for n, t in params))


COPY = entry("scaled_copy", ("src_ptr", "*fp32"), ("dst_ptr", "*fp32"), ("N", "i32"),
             constexprs={"SCALE": 2.0, "BLOCK": BLOCK})


def run(memory, e, grid, values, **kw):
    ex = EX.Executor(memory, index={}, report=lambda text: None)
    ex.launch(e, grid, values, **kw)
    return ex


@pytest.mark.parametrize("n", [1, 37, BLOCK, BLOCK + 1, 3 * BLOCK - 5])
def test_masked_lanes_past_the_end_are_no_access(n):
    """Allocations of exactly n floats (awkward sizes), the last program's masked lanes past
    their ends: no fault, every element scaled, the poison beyond untouched."""
    src = np.arange(n, dtype=np.float32) - 7.5
    dst = np.full(n + 16, np.nan, np.float32)          # 16 more: poisoned, outside the copy
    mem = ArrayMemory(src, dst)
    run(mem, COPY, ((n + BLOCK - 1) // BLOCK, 1, 1), [mem.bases[0], mem.bases[1], n])
    assert (dst[:n] == src * 2).all()
    assert np.isnan(dst[n:]).all()


def test_an_unmasked_read_past_the_end_is_an_illegal_address_naming_parameter_and_offset():
    src, dst = np.zeros(37, np.float32), np.zeros(BLOCK, np.float32)
    mem = ArrayMemory(src, dst)
    e = entry("unmasked_copy", ("src_ptr", "*fp32"), ("dst_ptr", "*fp32"),
              constexprs={"BLOCK": BLOCK})
    with pytest.raises(EX.LaunchFailed) as info:
        run(mem, e, (1, 1, 1), [mem.bases[0], mem.bases[1]])
    assert info.value.code == EX.CUDA_ERROR_ILLEGAL_ADDRESS
    report = info.value.report
    assert "unmasked_copy_test" in report and "parameter src_ptr" in report, report
    assert "offset +148 bytes" in report and "global read of 4 bytes" in report, report
    assert (dst == 0).all()                             # the faulting launch stored nothing


def test_a_pointer_outside_every_allocation_faults_when_used():
    dst = np.zeros(BLOCK, np.float32)
    mem = ArrayMemory(dst)
    with pytest.raises(EX.LaunchFailed) as info:
        run(mem, COPY, (1, 1, 1), [DEVICE_BASE - 4096, mem.bases[0], 4])
    assert info.value.code == EX.CUDA_ERROR_ILLEGAL_ADDRESS
    assert "src_ptr" in info.value.report and "no live allocation" in info.value.report


@pytest.mark.parametrize("name, values, code", [
    ("src_ptr", lambda b: [b[0] + 4, b[1], 32], EX.CUDA_ERROR_MISALIGNED_ADDRESS),
    ("N", lambda b: [b[0], b[1], 33], EX.CUDA_ERROR_INVALID_VALUE),
])
def test_divisible_by_16_is_checked_at_launch(name, values, code):
    src, dst = np.zeros(64, np.float32), np.zeros(64, np.float32)
    mem = ArrayMemory(src, dst)
    e = entry("scaled_copy", ("src_ptr", "*fp32"), ("dst_ptr", "*fp32"), ("N", "i32"),
              constexprs={"SCALE": 2.0, "BLOCK": BLOCK}, divisible=("src_ptr", "dst_ptr", "N"))
    with pytest.raises(EX.LaunchFailed) as info:
        run(mem, e, (1, 1, 1), values(mem.bases))
    assert info.value.code == code
    assert f"parameter {name}" in info.value.report and "not divisible by 16" in info.value.report
    run(mem, e, (1, 1, 1), [mem.bases[0], mem.bases[1], 32])      # aligned: runs


def test_a_faulty_launch_flips_bit_0_of_its_first_stored_element():
    src = np.arange(1, 9, dtype=np.float32)
    good, bad = np.zeros(8, np.float32), np.zeros(8, np.float32)
    for out, corrupt in ((good, False), (bad, True)):
        mem = ArrayMemory(src, out)
        run(mem, COPY, (1, 1, 1), [mem.bases[0], mem.bases[1], 8], corrupt=corrupt)
    assert good.view(np.uint32)[0] ^ bad.view(np.uint32)[0] == 1
    assert (good[1:] == bad[1:]).all()


def test_packed_bytes_decode_at_natural_sizes_and_too_few_are_refused():
    e = entry("scaled_copy", ("src_ptr", "*fp32"), ("N", "i32"), ("x", "fp32"), ("k", "i64"))
    blob = (np.uint64(0xABCDEF).tobytes() + np.int32(-5).tobytes() + np.float32(1.5).tobytes()
            + np.int64(1 << 40).tobytes())
    assert e.decode(blob) == [0xABCDEF, -5, 1.5, 1 << 40]
    with pytest.raises(EX.LaunchFailed, match="parameter bytes"):
        e.decode(blob[:-1])


def test_a_plain_interpreter_launch_in_the_same_process_is_not_checked():
    """The executor's checks apply to its own launches: the interpret backend's (torch tensors,
    untagged pointers) run as before in the same process."""
    run(ArrayMemory(np.zeros(8, np.float32), np.zeros(8, np.float32)), COPY, (1, 1, 1),
        [DEVICE_BASE, DEVICE_BASE + 8192, 8])
    src, dst = torch.arange(8, dtype=torch.float32), torch.zeros(8)
    scaled_copy[(1,)](src, dst, 8, SCALE=2.0, BLOCK=BLOCK)
    assert dst.tolist() == [2.0 * i for i in range(8)]


def test_the_manifest_index_finds_every_committed_entry_by_its_ptx_digest():
    index = EX.manifest_index()
    found = {e.key for entries in index.values() for e in entries}
    assert any(k.startswith("attention_fwd_") for k in found)
    some = next(iter(index))
    assert EX.image_sha256(b"") != some and len(some) == 64
    assert EX.POINTER_BYTES == ctypes.sizeof(ctypes.c_void_p)
