"""Small driver programs through the real cuda-bindings, one per rule the stub driver enforces.

    python tests/support/stub_cuda/scenarios.py NAME

runs scenario NAME against whatever libcuda.so.1 the environment loads (tests/support/stub_driver.py's
env()) and prints {step: CUresult or value} as JSON.  Each scenario makes the call the rule is
about next to a control call that differs only in the respect the rule checks, so a rule that
fired on everything would fail its test as surely as one that never fired.  The kernels are a
tiny hand-written PTX entry of our own, and plan/kernels/release.ptx for a graph replay.
"""
from __future__ import annotations

import ctypes
import json
import sys
import threading
from pathlib import Path

from cuda.bindings import driver as d
ROOT = Path(__file__).resolve().parents[3]    # run as a script: the checkout root

PROBE_THREADS = 32
PROBE_PTX = b"""
.version 8.0
.target sm_90
.address_size 64

.visible .entry probe(
\t.param .u64 .ptr .global .align 16 probe_param_0,
\t.param .u32 probe_param_1
)
.reqntid 32
{
\tgriddepcontrol.wait;
\tret;
}

.visible .entry probe_nowait(
\t.param .u64 .ptr .global .align 16 probe_nowait_param_0,
\t.param .u32 probe_nowait_param_1
)
.reqntid 32
{
\tret;
}
"""
ALLOCATION = 256                # bytes of the probe's buffer
ALIGN = 16                      # probe_param_0's .align
OPT_IN = 64 * 1024              # beyond the 48 KiB a launch gets without the opt-in
DOORBELL_VALUE = 0x5EED
LOG_BYTES = 4096
REFUSED_PTX = {"target": PROBE_PTX.replace(b"sm_90", b"sm_100a"),
               "version": PROBE_PTX.replace(b".version 8.0", b".version 9.9")}


def code(ret) -> int:
    return int(ret[0] if isinstance(ret, tuple) else ret)


def value(ret):
    """A call's values (None, one, or a tuple), raising on a CUresult other than success."""
    if code(ret) != 0:
        raise RuntimeError(f"{d.CUresult(code(ret)).name}")
    values = ret[1:] if isinstance(ret, tuple) else ()
    return None if not values else values[0] if len(values) == 1 else values


class Session:
    """Device 0's primary context, a stream, the probe function and a device buffer."""

    def __init__(self):
        value(d.cuInit(0))
        self.device = value(d.cuDeviceGet(0))
        value(d.cuCtxSetCurrent(value(d.cuDevicePrimaryCtxRetain(self.device))))
        self.stream = self.new_stream()
        self.function = self.load(PROBE_PTX, b"probe")
        self.buffer = int(value(d.cuMemAlloc(ALLOCATION)))

    @staticmethod
    def new_stream():
        return value(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING))

    def load(self, ptx: bytes, entry: bytes):
        self._image = ctypes.create_string_buffer(ptx + b"\0")
        module = value(d.cuModuleLoadDataEx(ctypes.addressof(self._image), 0, [], []))
        return value(d.cuModuleGetFunction(module, entry))

    @staticmethod
    def params(*values):
        """The kernelParams array for ctypes values (kept alive on the array)."""
        array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        array.values = values
        return array

    def launch(self, pointer=None, threads=PROBE_THREADS, shared=0, stream=None, function=None,
               params=None, programmatic=False) -> int:
        params = params or self.params(ctypes.c_uint64(self.buffer if pointer is None
                                                       else pointer), ctypes.c_uint32(7))
        stream = self.stream if stream is None else stream
        if not programmatic:
            return code(d.cuLaunchKernel(function or self.function, 1, 1, 1, threads, 1, 1,
                                         shared, stream, ctypes.addressof(params), 0))
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = d.CUlaunchConfig()
        config.gridDimX = config.gridDimY = config.gridDimZ = 1
        config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
        config.sharedMemBytes, config.hStream = shared, stream
        config.attrs, config.numAttrs = [attr], 1
        return code(d.cuLaunchKernelEx(config, function or self.function,
                                       ctypes.addressof(params), 0))

    def sync(self, stream=None) -> int:
        return code(d.cuStreamSynchronize(self.stream if stream is None else stream))

    def event(self, timing=True):
        F = d.CUevent_flags
        return value(d.cuEventCreate(F.CU_EVENT_DEFAULT if timing else F.CU_EVENT_DISABLE_TIMING))

    def begin(self, stream=None) -> int:
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        return code(d.cuStreamBeginCapture(self.stream if stream is None else stream, mode))


def block_size(s: Session) -> dict:
    return {"wrong": s.launch(threads=2 * PROBE_THREADS), "right": s.launch(), "sync": s.sync()}


def shared_opt_in(s: Session) -> dict:
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    optin = value(d.cuDeviceGetAttribute(
        d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, s.device))
    return {"without": s.launch(shared=OPT_IN),
            "beyond_device": code(d.cuFuncSetAttribute(s.function, attr, optin + 1)),
            "opt_in": code(d.cuFuncSetAttribute(s.function, attr, OPT_IN)),
            "with": s.launch(shared=OPT_IN), "sync": s.sync()}


def pointer_past_allocation(s: Session) -> dict:
    inside = s.launch(pointer=s.buffer + ALLOCATION - ALIGN)
    synced = s.sync()
    return {"inside": inside, "inside_sync": synced,
            "past": s.launch(pointer=s.buffer + ALLOCATION), "past_sync": s.sync()}


def freed_before_replay(s: Session) -> dict:
    """A graph captured with a live buffer, replayed after the buffer was freed."""
    buffer = int(value(d.cuMemAlloc(ALLOCATION)))
    out = {"begin": s.begin(), "captured": s.launch(pointer=buffer)}
    graph = value(d.cuGraphInstantiate(value(d.cuStreamEndCapture(s.stream)), 0))
    out["replay"] = code(d.cuGraphLaunch(graph, s.stream))
    out["replay_sync"] = s.sync()
    out["free"] = code(d.cuMemFree(buffer))
    out["after_free"] = code(d.cuGraphLaunch(graph, s.stream))
    out["after_free_sync"] = s.sync()
    return out


def captured_bad_pointer(s: Session) -> dict:
    """Captured with a pointer past its allocation: logged at capture, which goes on."""
    return {"begin": s.begin(), "captured": s.launch(pointer=s.buffer + ALLOCATION),
            "end": code(d.cuStreamEndCapture(s.stream)), "sync": s.sync()}


def host_pointer(s: Session) -> dict:
    flags = d.CU_MEMHOSTALLOC_DEVICEMAP | d.CU_MEMHOSTALLOC_PORTABLE
    host = int(value(d.cuMemHostAlloc(ALLOCATION, flags)))
    device = int(value(d.cuMemHostGetDevicePointer(host, 0)))
    mapped = s.launch(pointer=device)
    synced = s.sync()
    return {"mapped": mapped, "mapped_sync": synced, "host": s.launch(pointer=host),
            "host_sync": s.sync()}


def misaligned(s: Session) -> dict:
    aligned = s.launch(pointer=s.buffer + ALIGN)
    synced = s.sync()
    return {"aligned": aligned, "aligned_sync": synced,
            "misaligned": s.launch(pointer=s.buffer + ALIGN // 2), "misaligned_sync": s.sync()}


def timing(s: Session) -> dict:
    out = {}
    for name, make in (("timing", True), ("untimed", False)):
        a, b = s.event(make), s.event(make)
        code(d.cuEventRecord(a, s.stream)), s.launch(), code(d.cuEventRecord(b, s.stream))
        s.sync()
        out[name] = code(d.cuEventElapsedTime(a, b))
    out["never_recorded"] = code(d.cuEventElapsedTime(s.event(), s.event()))
    return out


def sync_in_capture(s: Session) -> dict:
    return {"begin": s.begin(), "captured": s.launch(), "sync": s.sync(),
            "end": code(d.cuStreamEndCapture(s.stream)), "after": s.sync()}


def _fork(s: Session, join: bool) -> dict:
    side, fork, back = s.new_stream(), s.event(timing=False), s.event(timing=False)
    out = {"begin": s.begin(), "main": s.launch(),
           "fork": code(d.cuEventRecord(fork, s.stream)),
           "wait": code(d.cuStreamWaitEvent(side, fork, 0)),
           "side": s.launch(stream=side, programmatic=True)}
    if join:
        out["back"] = code(d.cuEventRecord(back, side))
        out["join"] = code(d.cuStreamWaitEvent(s.stream, back, 0))
        out["after_join"] = s.launch(programmatic=True)
    ret = d.cuStreamEndCapture(s.stream)
    out["end"] = code(ret)
    if join:
        graph = value(d.cuGraphInstantiate(ret[1], 0))
        out["replay"] = code(d.cuGraphLaunch(graph, s.stream))
        out["sync"] = s.sync()
    return out


def unjoined_capture(s: Session) -> dict:
    return _fork(s, join=False)


def joined_capture(s: Session) -> dict:
    return _fork(s, join=True)


def isolation(s: Session) -> dict:
    outside = s.event(timing=False)
    code(d.cuEventRecord(outside, s.stream))
    return {"begin": s.begin(), "wait": code(d.cuStreamWaitEvent(s.stream, outside, 0)),
            "end": code(d.cuStreamEndCapture(s.stream))}


def graph_release(s: Session) -> dict:
    """plan/kernels/release.ptx captured and replayed: the replay writes the semaphore record."""
    release = s.load((ROOT / "plan" / "kernels" / "release.ptx").read_bytes(), b"release")
    flags = d.CU_MEMHOSTALLOC_DEVICEMAP | d.CU_MEMHOSTALLOC_PORTABLE
    host = int(value(d.cuMemHostAlloc(ALLOCATION, flags)))
    device = int(value(d.cuMemHostGetDevicePointer(host, 0)))
    bell = ctypes.c_uint32.from_address(host)
    record = (ctypes.c_uint32 * 4).from_address(host + ALIGN)    # payload, 0, timestamp (u64)
    params = s.params(ctypes.c_uint64(device), ctypes.c_uint64(device + ALIGN))
    out = {"begin": s.begin(), "capture": s.launch(function=release, threads=1, params=params)}
    graph = value(d.cuGraphInstantiate(value(d.cuStreamEndCapture(s.stream)), 0))
    out["before_replay"] = record[0]
    bell.value = DOORBELL_VALUE
    out["replay"] = code(d.cuGraphLaunch(graph, s.stream))
    out["sync"] = s.sync()
    out["payload"], out["timestamp"] = record[0], record[2] | record[3] << 32
    return out


def programmatic_without_wait(s: Session) -> dict:
    nowait = s.load(PROBE_PTX, b"probe_nowait")
    return {"waits": s.launch(programmatic=True), "no_wait": s.launch(function=nowait,
                                                                       programmatic=True)}


def jit_refusal(s: Session) -> dict:
    """PTX the driver's JIT refuses, with its error log in the caller's buffer (as the host
    passes it: a bytearray through the bindings)."""
    O = d.CUjit_option
    out = {}
    for name, ptx in REFUSED_PTX.items():
        image = ctypes.create_string_buffer(ptx + b"\0")
        log = bytearray(LOG_BYTES)
        ret = d.cuModuleLoadDataEx(ctypes.addressof(image), 2, [O.CU_JIT_ERROR_LOG_BUFFER,
                                   O.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES], [log, LOG_BYTES])
        out[name], out[f"{name}_log"] = code(ret), bytes(log).split(b"\0")[0].decode()
    return out


def stream_priority(s: Session) -> dict:
    """A stream at the greatest priority the range reports, one beyond it (logged, clamped as
    the driver clamps), and a kernel captured on the first: its node carries the stream's
    priority, read back as the host reads it (cuGraphGetNodes, the node's PRIORITY attribute)."""
    flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING
    ret = d.cuCtxGetStreamPriorityRange()
    out = {"range": code(ret), "least": ret[1], "greatest": ret[2]}
    inside = d.cuStreamCreateWithPriority(flags, ret[2])
    outside = d.cuStreamCreateWithPriority(flags, ret[2] - 1)
    out.update(inside=code(inside), outside=code(outside),
               inside_priority=value(d.cuStreamGetPriority(inside[1])),
               outside_priority=value(d.cuStreamGetPriority(outside[1])),
               default_priority=value(d.cuStreamGetPriority(s.stream)))
    out.update(begin=s.begin(inside[1]), captured=s.launch(stream=inside[1]))
    graph = value(d.cuStreamEndCapture(inside[1]))
    use = d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
    out["instantiate"] = code(d.cuGraphInstantiate(graph, int(use)))
    count = value(d.cuGraphGetNodes(graph, 0))[1]
    nodes = value(d.cuGraphGetNodes(graph, count))[0]
    attr = d.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY
    out["nodes"] = count
    out["node_type"] = int(value(d.cuGraphNodeGetType(nodes[0])))
    out["node_priority"] = value(d.cuGraphKernelNodeGetAttribute(nodes[0], attr)).priority
    return out


def no_context(s: Session) -> dict:
    """A thread has no current context until it makes one current (a publisher thread)."""
    out = {}

    def work():
        out["without"] = code(d.cuMemAlloc(ALLOCATION))
        code(d.cuCtxSetCurrent(value(d.cuDevicePrimaryCtxRetain(s.device))))
        out["with"] = code(d.cuMemAlloc(ALLOCATION))
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return out


SCENARIOS = {f.__name__: f for f in (
    block_size, shared_opt_in, pointer_past_allocation, freed_before_replay,
    captured_bad_pointer, host_pointer, misaligned, timing,
    sync_in_capture, unjoined_capture, joined_capture, isolation, graph_release,
    programmatic_without_wait, jit_refusal, stream_priority, no_context)}


if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](Session())))
