/* The stub's state, lock, violation log, handles, and the device / context calls. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stub.h"

#define LOG_ENV "COPPELIUS_STUB_LOG"        /* file the violations are appended to */
#define CC_ENV "COPPELIUS_STUB_CC"          /* "8.6": the stub device's compute capability */
#define DRIVER_ENV "COPPELIUS_STUB_DRIVER_VERSION"
#define QUIET_ENV "COPPELIUS_STUB_QUIET"    /* "1": violations to the log file only */
#define LINE_BYTES 1024
#define HANDLE_TAG 0x5100u          /* handle = (tag + kind) << 40 | gen << 20 | index + 1 */
#define INDEX_BITS 20
#define TOTAL_MEMORY (141ull << 30)

struct stub G = { .lock = PTHREAD_MUTEX_INITIALIZER };
static __thread uint32_t current_ctx_gen;   /* the primary context bound to this thread, or 0 */

/* opt-in shared memory per block by compute capability (CUDA programming guide, bytes) */
static const struct { int cc, optin; } SHARED_OPTIN[] = {
    {80, 166912}, {86, 101376}, {87, 166912}, {89, 101376}, {90, 232448}, {100, 232448},
    {120, 101376}};

void lock(void) { pthread_mutex_lock(&G.lock); }
void unlock(void) { pthread_mutex_unlock(&G.lock); }

uint64_t now_ns(int clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

const char *error_name(CUresult code)
{
    static const struct { CUresult code; const char *name; } NAMES[] = {
        {0, "CUDA_SUCCESS"}, {1, "CUDA_ERROR_INVALID_VALUE"}, {2, "CUDA_ERROR_OUT_OF_MEMORY"},
        {3, "CUDA_ERROR_NOT_INITIALIZED"}, {101, "CUDA_ERROR_INVALID_DEVICE"},
        {200, "CUDA_ERROR_INVALID_IMAGE"}, {201, "CUDA_ERROR_INVALID_CONTEXT"},
        {218, "CUDA_ERROR_INVALID_PTX"}, {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
        {400, "CUDA_ERROR_INVALID_HANDLE"}, {401, "CUDA_ERROR_ILLEGAL_STATE"},
        {500, "CUDA_ERROR_NOT_FOUND"}, {600, "CUDA_ERROR_NOT_READY"},
        {700, "CUDA_ERROR_ILLEGAL_ADDRESS"}, {716, "CUDA_ERROR_MISALIGNED_ADDRESS"},
        {719, "CUDA_ERROR_LAUNCH_FAILED"}, {801, "CUDA_ERROR_NOT_SUPPORTED"},
        {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"},
        {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}, {902, "CUDA_ERROR_STREAM_CAPTURE_MERGE"},
        {903, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED"}, {904, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED"},
        {905, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION"}, {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"},
        {907, "CUDA_ERROR_CAPTURED_EVENT"}, {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD"}};
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++)
        if (NAMES[i].code == code)
            return NAMES[i].name;
    return NULL;
}

/* one line, appended with a single write so that processes sharing the log do not interleave */
static void log_line(const char *line, int to_stderr)
{
    const char *path = getenv(LOG_ENV);
    if (path && *path) {
        int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ssize_t ignored = write(fd, line, strlen(line));
            (void)ignored;
            close(fd);
        }
    }
    const char *quiet = getenv(QUIET_ENV);
    if (to_stderr && !(quiet && *quiet == '1'))
        fputs(line, stderr);
}

static void violation(CUresult code, const char *call, const char *fmt, va_list ap)
{
    char msg[LINE_BYTES - 160], line[LINE_BYTES];
    vsnprintf(msg, sizeof msg, fmt, ap);
    const char *name = error_name(code);
    snprintf(line, sizeof line, "VIOLATION pid=%d %s: %s -> %s\n", (int)getpid(), call, msg,
             name ? name : "?");
    G.stats.violations++;
    log_line(line, 1);
}

CUresult refuse(CUresult code, const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    violation(code, call, fmt, ap);
    va_end(ap);
    return code;
}

/* an error the device reports later (a kernel touching memory it must not): sticky */
CUresult fault(CUresult code, const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    violation(code, call, fmt, ap);
    va_end(ap);
    if (G.sticky == CUDA_SUCCESS)
        G.sticky = code;
    return code;
}

static void write_stats(void)
{
    char line[LINE_BYTES];
    snprintf(line, sizeof line, "STATS pid=%d launches=%lu captured=%lu programmatic=%lu "
             "graph_launches=%lu released=%lu staged=%lu copied_kernels=%lu copies=%lu "
             "copy_bytes=%lu memsets=%lu violations=%lu priority_nodes=%lu "
             "node_priority_graphs=%lu executed=%lu corrupted=%lu\n", (int)getpid(),
             G.stats.launches, G.stats.captured, G.stats.programmatic, G.stats.graph_launches,
             G.stats.released, G.stats.staged, G.stats.copied_kernels, G.stats.copies,
             G.stats.copy_bytes, G.stats.memsets, G.stats.violations, G.stats.priority_nodes,
             G.stats.node_priority_graphs, G.stats.executed, G.stats.corrupted);
    log_line(line, 0);
}

/* ---- handles: tables of slots; a handle names its kind, slot and the slot's generation */
void *handle_table(int kind, size_t *elem, int *cap)
{
    switch (kind) {
    case H_MODULE: *elem = sizeof G.modules[0]; *cap = MAX_MODULES; return G.modules;
    case H_FUNCTION: *elem = sizeof G.functions[0]; *cap = MAX_FUNCTIONS; return G.functions;
    case H_STREAM: *elem = sizeof G.streams[0]; *cap = MAX_STREAMS; return G.streams;
    case H_EVENT: *elem = sizeof G.events[0]; *cap = MAX_EVENTS; return G.events;
    case H_GRAPH: *elem = sizeof G.graphs[0]; *cap = MAX_GRAPHS; return G.graphs;
    case H_EXEC: *elem = sizeof G.execs[0]; *cap = MAX_GRAPHS; return G.execs;
    default: return NULL;
    }
}

static struct slot *slot_at(int kind, int index)
{
    size_t elem;
    int cap;
    unsigned char *base = handle_table(kind, &elem, &cap);
    return base && index >= 0 && index < cap ? (struct slot *)(base + elem * index) : NULL;
}

CUhandle handle_of(int kind, int index)
{
    struct slot *s = slot_at(kind, index);
    uint64_t h = ((uint64_t)(HANDLE_TAG + kind) << 40)
                 | ((uint64_t)(s->gen & 0xFFFFF) << INDEX_BITS) | (uint64_t)(index + 1);
    return (CUhandle)(uintptr_t)h;
}

int slot_new(int kind, CUhandle *out)
{
    size_t elem;
    int cap;
    unsigned char *base = handle_table(kind, &elem, &cap);
    for (int i = 0; i < cap; i++) {
        struct slot *s = (struct slot *)(base + elem * i);
        if (!s->live) {
            uint32_t gen = s->gen + 1;
            memset(s, 0, elem);
            s->live = 1;
            s->gen = gen;
            *out = handle_of(kind, i);
            return i;
        }
    }
    return -1;
}

void *slot_get(int kind, CUhandle h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    if ((v >> 40) != HANDLE_TAG + (unsigned)kind)
        return NULL;
    int index = (int)(v & ((1u << INDEX_BITS) - 1)) - 1;
    struct slot *s = slot_at(kind, index);
    if (!s || !s->live || (s->gen & 0xFFFFF) != ((v >> INDEX_BITS) & 0xFFFFF))
        return NULL;
    return s;
}

void slot_free(int kind, CUhandle h)
{
    struct slot *s = slot_get(kind, h);
    if (s)
        s->live = 0;
}

/* ---- init, device, primary context */
static void configure(void)
{
    const char *cc = getenv(CC_ENV), *dv = getenv(DRIVER_ENV);
    G.cc_major = 9, G.cc_minor = 0;
    if (cc && sscanf(cc, "%d.%d", &G.cc_major, &G.cc_minor) != 2)
        G.cc_major = 9, G.cc_minor = 0;
    G.driver_version = dv ? atoi(dv) : STUB_DRIVER_VERSION;
    G.shared_optin = STATIC_SHARED_LIMIT;
    for (size_t i = 0; i < sizeof SHARED_OPTIN / sizeof SHARED_OPTIN[0]; i++)
        if (SHARED_OPTIN[i].cc == 10 * G.cc_major + G.cc_minor)
            G.shared_optin = SHARED_OPTIN[i].optin;
    snprintf(G.name, sizeof G.name, G.cc_major == 9 && G.cc_minor == 0
             ? "NVIDIA H200 (Coppelius stub driver)" : "Coppelius stub driver sm_%d%d",
             G.cc_major, G.cc_minor);
    G.active = -1;
    configure_devices();
}

CUresult cuInit(unsigned flags)
{
    if (flags != 0)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuInit", "flags %u (must be 0)", flags);
    lock();
    if (!G.initialized) {
        configure();
        G.initialized = 1;
        char line[LINE_BYTES];
        snprintf(line, sizeof line, "LOADED pid=%d device=\"%s\" cc=%d.%d driver=%d optin=%d\n",
                 (int)getpid(), G.name, G.cc_major, G.cc_minor, G.driver_version, G.shared_optin);
        log_line(line, 0);
        atexit(write_stats);
    }
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuDriverGetVersion", "null pointer");
    if (!G.driver_version)
        configure();
    *version = G.driver_version;
    return CUDA_SUCCESS;
}

static CUresult need_init(const char *call)
{
    return G.initialized ? CUDA_SUCCESS
        : refuse(CUDA_ERROR_NOT_INITIALIZED, call, "called before cuInit");
}

CUresult need_device(CUdevice dev, const char *call)
{
    CUresult r = need_init(call);
    if (r == CUDA_SUCCESS && physical_of(dev) < 0)
        r = refuse(CUDA_ERROR_INVALID_DEVICE, call, "device %d (%d visible)", dev, G.visible);
    return r;
}

CUresult need_context(const char *call)
{
    CUresult r = need_init(call);
    if (r != CUDA_SUCCESS)
        return r;
    if (G.ctx_refs == 0 || current_ctx_gen != G.ctx_gen)
        return refuse(CUDA_ERROR_INVALID_CONTEXT, call,
                      "no current context on this thread (cuCtxSetCurrent of a retained primary "
                      "context first)");
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    CUresult r = need_init("cuDeviceGetCount");
    if (r == CUDA_SUCCESS && !count)
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount", "null pointer");
    if (r == CUDA_SUCCESS)
        *count = G.visible;
    return r;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    CUresult r = need_init("cuDeviceGet");
    if (r == CUDA_SUCCESS && (!dev || physical_of(ordinal) < 0))
        r = refuse(dev ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE,
                   "cuDeviceGet", "ordinal %d (%d visible)", ordinal, G.visible);
    if (r == CUDA_SUCCESS)
        *dev = ordinal;
    return r;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = need_device(dev, "cuDeviceGetName");
    if (r == CUDA_SUCCESS && (!name || len <= 0))
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName", "buffer %p, length %d",
                   (void *)name, len);
    if (r == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", G.name);
    return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = need_device(dev, "cuDeviceTotalMem");
    if (r == CUDA_SUCCESS && !bytes)
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceTotalMem", "null pointer");
    if (r == CUDA_SUCCESS)
        *bytes = TOTAL_MEMORY;
    return r;
}

static int device_attribute(int attr, int *ok)
{
    *ok = 1;
    switch (attr) {
    case 1: return MAX_BLOCK_THREADS;            /* MAX_THREADS_PER_BLOCK */
    case 2: case 3: return 1024;                 /* MAX_BLOCK_DIM_X / Y */
    case 4: return 64;                           /* MAX_BLOCK_DIM_Z */
    case 5: return (int)MAX_GRID_X;
    case 6: case 7: return (int)MAX_GRID_YZ;
    case 8: return STATIC_SHARED_LIMIT;          /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 9: return 65536;                        /* TOTAL_CONSTANT_MEMORY */
    case 10: return 32;                          /* WARP_SIZE */
    case 12: case 82: return 65536;              /* registers per block / per SM */
    case 13: return 1980000;                     /* CLOCK_RATE kHz */
    case 16: return 132;                         /* MULTIPROCESSOR_COUNT */
    case 19: return 1;                           /* CAN_MAP_HOST_MEMORY */
    case 31: case 41: return 1;                  /* CONCURRENT_KERNELS, UNIFIED_ADDRESSING */
    case 38: return 50 << 20;                    /* L2_CACHE_SIZE */
    case 39: return 2048;                        /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 75: return G.cc_major;
    case 76: return G.cc_minor;
    case 81: return G.shared_optin + 1024;       /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 97: return G.shared_optin;              /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default: *ok = attr > 0 && attr < 162;       /* CU_DEVICE_ATTRIBUTE_MAX */
             return 0;
    }
}

CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice dev)
{
    CUresult r = need_device(dev, "cuDeviceGetAttribute");
    int ok;
    if (r != CUDA_SUCCESS)
        return r;
    int v = device_attribute(attr, &ok);
    if (!value || !ok)
        return refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetAttribute", "attribute %d", attr);
    *value = v;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUhandle *ctx, CUdevice dev)
{
    CUresult r = need_device(dev, "cuDevicePrimaryCtxRetain");
    if (r == CUDA_SUCCESS && !ctx)
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxRetain", "null pointer");
    if (r != CUDA_SUCCESS)
        return r;
    lock();
    if (G.ctx_refs > 0 && G.active != physical_of(dev)) {
        unlock();
        return refuse(CUDA_ERROR_NOT_SUPPORTED, "cuDevicePrimaryCtxRetain", "device %d while "
                      "another device's context is held (the stub holds one at a time)", dev);
    }
    G.active = physical_of(dev);
    if (G.ctx_refs++ == 0)
        G.ctx_gen++;           /* a fresh primary context: an old one's handle is stale */
    *ctx = (CUhandle)(uintptr_t)(((uint64_t)(HANDLE_TAG + H_CONTEXT) << 40) | G.ctx_gen);
    unlock();
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CUresult r = need_device(dev, "cuDevicePrimaryCtxRelease");
    if (r != CUDA_SUCCESS)
        return r;
    lock();
    if (G.ctx_refs == 0)
        r = refuse(CUDA_ERROR_INVALID_CONTEXT, "cuDevicePrimaryCtxRelease",
                   "released more often than retained");
    else if (--G.ctx_refs == 0)
        context_destroy();     /* as the driver: the last release frees what the context held */
    unlock();
    return r;
}

static uint32_t context_gen(CUhandle ctx)
{
    uint64_t v = (uint64_t)(uintptr_t)ctx;
    return (v >> 40) == HANDLE_TAG + H_CONTEXT ? (uint32_t)(v & 0xFFFFFFFFu) : 0;
}

CUresult cuCtxSetCurrent(CUhandle ctx)
{
    CUresult r = need_init("cuCtxSetCurrent");
    if (r != CUDA_SUCCESS)
        return r;
    lock();
    uint32_t gen = context_gen(ctx);
    if (ctx == NULL)
        current_ctx_gen = 0;
    else if (gen == 0 || gen != G.ctx_gen || G.ctx_refs == 0)
        r = refuse(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent",
                   "context %p is not a live primary context", ctx);
    else
        current_ctx_gen = gen;
    unlock();
    return r;
}

CUresult cuCtxGetCurrent(CUhandle *ctx)
{
    CUresult r = need_init("cuCtxGetCurrent");
    if (r == CUDA_SUCCESS && !ctx)
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent", "null pointer");
    if (r == CUDA_SUCCESS)
        *ctx = current_ctx_gen && current_ctx_gen == G.ctx_gen
            ? (CUhandle)(uintptr_t)(((uint64_t)(HANDLE_TAG + H_CONTEXT) << 40) | G.ctx_gen) : NULL;
    return r;
}

CUresult cuCtxGetDevice(CUdevice *dev)
{
    lock();
    CUresult r = need_context("cuCtxGetDevice");
    unlock();
    if (r == CUDA_SUCCESS && !dev)
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuCtxGetDevice", "null pointer");
    if (r == CUDA_SUCCESS)
        *dev = 0;
    return r;
}

CUresult cuGetErrorName(CUresult code, const char **name)
{
    const char *n = error_name(code);
    if (!name || !n)
        return CUDA_ERROR_INVALID_VALUE;
    *name = n;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult code, const char **text)
{
    return cuGetErrorName(code, text);   /* the stub has no prose: the name serves */
}
