/* cuGetProcAddress_v2: how cuda-bindings 13.x finds every driver call.
 *
 * The bindings dlopen libcuda.so.1 (cuda.pathfinder: the system search, so LD_LIBRARY_PATH
 * serves), dlsym only cuGetProcAddress_v2, and ask it for each call by its base name and the
 * CUDA version whose ABI they were built for ("cuMemAlloc", 3020 → cuMemAlloc_v2; flags 0, or
 * per-thread-default-stream with CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1).  As the driver
 * does, the answer is the newest version of the name at or below the version asked; a version
 * whose ABI the stub does not implement is a NULL row, answered CUDA_ERROR_NOT_FOUND, so an old
 * ABI is never handed out for a newer one.  The stub has one default stream semantics, so the
 * per-thread flag gets the same functions. */
#define _GNU_SOURCE
#include <string.h>

#include "stub.h"

#define ROWS(X) \
    X("cuGetErrorString", 6000, cuGetErrorString) X("cuGetErrorName", 6000, cuGetErrorName) \
    X("cuInit", 2000, cuInit) X("cuDriverGetVersion", 2020, cuDriverGetVersion) \
    X("cuDeviceGet", 2000, cuDeviceGet) X("cuDeviceGetCount", 2000, cuDeviceGetCount) \
    X("cuDeviceGetName", 2000, cuDeviceGetName) \
    X("cuDeviceGetUuid", 9020, cuDeviceGetUuid) X("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2) \
    X("cuDeviceGetPCIBusId", 4010, cuDeviceGetPCIBusId) \
    X("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2) \
    X("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute) \
    X("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain) \
    X("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease_v2) \
    X("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2) \
    X("cuCtxSetCurrent", 4000, cuCtxSetCurrent) X("cuCtxGetCurrent", 4000, cuCtxGetCurrent) \
    X("cuCtxGetDevice", 2000, cuCtxGetDevice) X("cuCtxSynchronize", 2000, cuCtxSynchronize) \
    X("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx) \
    X("cuModuleGetFunction", 2000, cuModuleGetFunction) X("cuModuleUnload", 2000, cuModuleUnload) \
    X("cuFuncGetAttribute", 2020, cuFuncGetAttribute) \
    X("cuFuncSetAttribute", 9000, cuFuncSetAttribute) \
    X("cuMemGetInfo", 3020, cuMemGetInfo_v2) X("cuMemAlloc", 3020, cuMemAlloc_v2) \
    X("cuMemFree", 3020, cuMemFree_v2) X("cuMemHostAlloc", 2020, cuMemHostAlloc) \
    X("cuMemFreeHost", 2000, cuMemFreeHost) \
    X("cuMemHostGetDevicePointer", 3020, cuMemHostGetDevicePointer_v2) \
    X("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2) X("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2) \
    X("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2) X("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2) \
    X("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2) \
    X("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2) X("cuMemsetD8", 3020, cuMemsetD8_v2) \
    X("cuMemsetD8Async", 3020, cuMemsetD8Async) \
    X("cuStreamCreate", 2000, cuStreamCreate) X("cuStreamDestroy", 4000, cuStreamDestroy_v2) \
    X("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority) \
    X("cuStreamGetPriority", 5050, cuStreamGetPriority) \
    X("cuCtxGetStreamPriorityRange", 5050, cuCtxGetStreamPriorityRange) \
    X("cuStreamQuery", 2000, cuStreamQuery) X("cuStreamSynchronize", 2000, cuStreamSynchronize) \
    X("cuStreamWaitEvent", 3020, cuStreamWaitEvent) \
    X("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2) \
    X("cuStreamEndCapture", 10000, cuStreamEndCapture) \
    X("cuStreamIsCapturing", 10000, cuStreamIsCapturing) \
    X("cuEventCreate", 2000, cuEventCreate) X("cuEventRecord", 2000, cuEventRecord) \
    X("cuEventQuery", 2000, cuEventQuery) X("cuEventSynchronize", 2000, cuEventSynchronize) \
    X("cuEventDestroy", 4000, cuEventDestroy_v2) \
    X("cuEventElapsedTime", 2000, cuEventElapsedTime) \
    X("cuEventElapsedTime", 12080, cuEventElapsedTime_v2) \
    X("cuLaunchKernel", 4000, cuLaunchKernel) X("cuLaunchKernelEx", 11060, cuLaunchKernelEx) \
    X("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags) \
    X("cuGraphLaunch", 10000, cuGraphLaunch) X("cuGraphExecDestroy", 10000, cuGraphExecDestroy) \
    X("cuGraphDestroy", 10000, cuGraphDestroy) X("cuGraphGetNodes", 10000, cuGraphGetNodes) \
    X("cuGraphNodeGetType", 10000, cuGraphNodeGetType) \
    X("cuGraphKernelNodeGetAttribute", 11000, cuGraphKernelNodeGetAttribute) \
    X("cuGetProcAddress", 12000, cuGetProcAddress_v2)

/* newer ABIs of a name the stub serves, which it does not implement */
#define NEWER_ABIS(X) \
    X("cuCtxSynchronize", 13000) X("cuCtxGetDevice", 13000)

#define DECLARE(name, version, fn) CUresult fn();
#define ROW(name, version, fn) {name, version, (void *)fn},
#define NOT_IMPLEMENTED(name, version) {name, version, NULL},

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                             int *status);
ROWS(DECLARE)

static const struct { const char *name; int version; void *fn; } TABLE[] = {
    ROWS(ROW) NEWER_ABIS(NOT_IMPLEMENTED)};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags,
                             int *status)
{
    int best = -1, named = 0;
    if (!symbol || !pfn || flags > PROC_PER_THREAD_STREAM)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuGetProcAddress", "symbol %s, flags %llu",
                      symbol ? symbol : "(null)", (unsigned long long)flags);
    for (size_t i = 0; i < sizeof TABLE / sizeof TABLE[0]; i++) {
        if (strcmp(TABLE[i].name, symbol) != 0)
            continue;
        named = 1;
        if (TABLE[i].version && TABLE[i].version <= version
            && (best < 0 || TABLE[i].version > TABLE[best].version))
            best = (int)i;
    }
    *pfn = best >= 0 ? TABLE[best].fn : NULL;
    if (status)
        *status = *pfn ? PROC_SUCCESS : named && best < 0 ? PROC_VERSION_NOT_SUFFICIENT
                                                          : PROC_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;   /* not a violation: the bindings ask all */
}
