/* A stub libnvidia-ml.so.1 for the real nvidia-ml-py (pynvml): the calls `coppelius node`'s
 * telemetry makes, answered for the same GPUs the stub libcuda.so.1 shows
 * (tests/support/stub_cuda/devices.c): COPPELIUS_STUB_DEVICES physical GPUs, GPU K with the UUID
 * "GPU-636f7070-656c-6975-732d-6770" followed by K in 8 hex digits.  Readings are fixed functions
 * of K (README.md); COPPELIUS_STUB_NVML_ECC=K gives GPU K one volatile uncorrected ECC error and a
 * pending row remap; COPPELIUS_STUB_NVML_SLOWDOWN=K sets its HW-slowdown throttle reason.  Every
 * other function pynvml asks for is absent (pynvml then raises NVMLError_FunctionNotFound). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct stub_gpu *nvmlDevice_t;

enum { NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
       NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6 };
enum { NVML_TEMPERATURE_GPU = 0 };
enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
#define THROTTLE_HW_SLOWDOWN 0x8ull
#define MAX_GPUS 16
#define UUID_PREFIX "GPU-636f7070-656c-6975-732d-6770"
#define BASE_TEMPERATURE_C 40
#define BASE_POWER_MW 300000u
#define SM_CLOCK_MHZ 1980u
#define MEM_CLOCK_MHZ 3201u

struct stub_gpu { int index; };
static struct stub_gpu gpus[MAX_GPUS];
static int initialized, count;

static int env_index(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : -1;
}

nvmlReturn_t nvmlInitWithFlags(unsigned flags)
{
    (void)flags;
    const char *n = getenv("COPPELIUS_STUB_DEVICES");
    count = n ? atoi(n) : 1;
    if (count < 1 || count > MAX_GPUS)
        count = 1;
    for (int k = 0; k < count; k++)
        gpus[k].index = k;
    initialized = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t check(nvmlDevice_t d, const void *out)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!d || d < gpus || d >= gpus + count || !out)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n)
{
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    size_t prefix = strlen(UUID_PREFIX);
    if (!initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strncmp(uuid, UUID_PREFIX, prefix) != 0 || strlen(uuid) != prefix + 8)
        return NVML_ERROR_NOT_FOUND;
    int k = (int)strtol(uuid + prefix, NULL, 16);
    if (k < 0 || k >= count)
        return NVML_ERROR_NOT_FOUND;
    *device = &gpus[k];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned *temp)
{
    nvmlReturn_t r = check(d, temp);
    if (r == NVML_SUCCESS && sensor != NVML_TEMPERATURE_GPU)
        r = NVML_ERROR_NOT_SUPPORTED;
    if (r == NVML_SUCCESS)
        *temp = BASE_TEMPERATURE_C + (unsigned)d->index;
    return r;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned *milliwatts)
{
    nvmlReturn_t r = check(d, milliwatts);
    if (r == NVML_SUCCESS)
        *milliwatts = BASE_POWER_MW + 1000u * (unsigned)d->index;
    return r;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned *mhz)
{
    nvmlReturn_t r = check(d, mhz);
    if (r == NVML_SUCCESS)
        *mhz = type == NVML_CLOCK_MEM ? MEM_CLOCK_MHZ : SM_CLOCK_MHZ;
    return r;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons)
{
    nvmlReturn_t r = check(d, reasons);
    if (r == NVML_SUCCESS)
        *reasons = d->index == env_index("COPPELIUS_STUB_NVML_SLOWDOWN") ? THROTTLE_HW_SLOWDOWN : 0;
    return r;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(d, reasons);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter,
                                         unsigned long long *n)
{
    nvmlReturn_t r = check(d, n);
    int bad = d && d->index == env_index("COPPELIUS_STUB_NVML_ECC");
    if (r == NVML_SUCCESS)
        *n = counter == NVML_VOLATILE_ECC && type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? bad : 0;
    return r;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, int *pending)
{
    nvmlReturn_t r = check(d, pending);
    if (r == NVML_SUCCESS)
        *pending = 0;
    return r;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned *corrected, unsigned *uncorrected,
                                       unsigned *pending, unsigned *failure)
{
    nvmlReturn_t r = check(d, corrected);
    if (r == NVML_SUCCESS && (!uncorrected || !pending || !failure))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        int bad = d->index == env_index("COPPELIUS_STUB_NVML_ECC");
        *corrected = 0, *uncorrected = (unsigned)bad, *pending = (unsigned)bad, *failure = 0;
    }
    return r;
}
