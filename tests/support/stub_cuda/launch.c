/* Kernel launches: the launch checked against the PTX the function came from, its parameter
 * values copied (as the driver copies them at launch or capture), and at run time its pointers
 * checked against the live allocations.  The hand-written release and release_stage_in
 * (plan/kernels/release*.ptx) are executed here; with an executor attached (execute.c) every
 * Triton kernel is run by it; without, only Triton's copy_f32 (the records the run reads) is
 * executed, in C, and every other kernel is checked, not computed. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stub.h"

/* passed by tests/support/stub_driver.py from staging/layout.py, where the host and the PTX agree */
#if !defined(INPUT_RECORD_BYTES) || !defined(SEMAPHORE_RECORD_BYTES) || !defined(DOORBELL_BYTES)
#error "tests/support/stub_driver.py passes -DINPUT_RECORD_BYTES -DSEMAPHORE_RECORD_BYTES -DDOORBELL_BYTES"
#endif
#define RELEASE_ENTRY "release"
#define STAGE_IN_ENTRY "release_stage_in"
#define COPY_ENTRY "copy_f32"
#define CALL_BYTES 320             /* an api name and an entry name (256 bytes at most) */
#define FP32_BYTES 4
#define PARAM_BYTES_LIMIT 32764    /* a launch's parameter bytes (CUDA 12.1+, Volta and later) */

struct launch_attr { int id; char pad[4]; union { char pad[64]; int programmatic; } value; };
struct launch_config { unsigned grid[3], block[3], shared; CUhandle stream;
                       struct launch_attr *attrs; unsigned nattrs; };

static size_t param_offset(const struct ptx_entry *e, int i)
{
    size_t off = 0;
    for (int k = 0; k < i; k++)
        off += e->params[k].size;
    return off;
}

static uint64_t param_u64(const struct ptx_entry *e, const unsigned char *blob, int i)
{
    uint64_t v = 0;
    memcpy(&v, blob + param_offset(e, i), e->params[i].size < 8 ? e->params[i].size : 8);
    return v;
}

static CUresult check_block(const struct ptx_entry *e, const unsigned b[3], const char *call)
{
    unsigned threads = b[0] * b[1] * b[2];
    if (!b[0] || !b[1] || !b[2] || b[0] > 1024 || b[1] > 1024 || b[2] > 64
        || threads > MAX_BLOCK_THREADS)
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "block (%u,%u,%u) is beyond the device's "
                      "limits", b[0], b[1], b[2]);
    if (e->has_reqntid && (b[0] != e->reqntid[0] || b[1] != e->reqntid[1]
                           || b[2] != e->reqntid[2]))
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "block (%u,%u,%u) differs from the entry's "
                      ".reqntid (%u,%u,%u)", b[0], b[1], b[2], e->reqntid[0], e->reqntid[1],
                      e->reqntid[2]);
    if (e->has_maxntid && threads > e->maxntid[0] * e->maxntid[1] * e->maxntid[2])
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "%u threads per block, beyond the entry's "
                      ".maxntid (%u,%u,%u)", threads, e->maxntid[0], e->maxntid[1], e->maxntid[2]);
    return CUDA_SUCCESS;
}

static CUresult check_shape(const struct function *f, const struct node *nd, const char *call)
{
    const unsigned *g = nd->grid;
    const struct ptx_entry *e = f->entry;
    if (!g[0] || !g[1] || !g[2] || g[0] > MAX_GRID_X || g[1] > MAX_GRID_YZ || g[2] > MAX_GRID_YZ)
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "grid (%u,%u,%u) is beyond the device's "
                      "limits", g[0], g[1], g[2]);
    CUresult r = check_block(e, nd->block, call);
    if (r != CUDA_SUCCESS)
        return r;
    if (nd->shared > (unsigned)f->max_dynamic)
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "%u bytes of dynamic shared memory; the "
                      "function allows %d (48 KiB less its %zu static bytes, more only once "
                      "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) opts in)", nd->shared,
                      f->max_dynamic, e->static_shared);
    if (nd->shared + e->static_shared > (size_t)G.shared_optin)
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "%u + %zu bytes of shared memory per block, "
                      "beyond the device's %d", nd->shared, e->static_shared, G.shared_optin);
    return CUDA_SUCCESS;
}

/* the parameter values' bytes, read through kernelParams as the PTX declares them */
static CUresult pack(const struct ptx_entry *e, void **kp, void **extra, unsigned char **out,
                     const char *call)
{
    *out = NULL;
    if (extra)
        return refuse(CUDA_ERROR_NOT_SUPPORTED, call, "the stub takes kernelParams, not extra");
    if (param_offset(e, e->nparams) > PARAM_BYTES_LIMIT)
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "%zu bytes of parameters, beyond the "
                      "driver's %d", param_offset(e, e->nparams), PARAM_BYTES_LIMIT);
    if (e->nparams && !kp)
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "kernelParams is null; the entry has %d "
                      "parameters", e->nparams);
    if (e->nparams && !host_readable(kp, sizeof *kp * (size_t)e->nparams))
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "kernelParams[0..%d) (the entry's "
                      "parameters) is not readable at %p", e->nparams, (void *)kp);
    unsigned char *blob = calloc(1, param_offset(e, e->nparams) + 1);
    for (int i = 0; i < e->nparams; i++) {
        size_t size = e->params[i].size;
        if (!kp[i] || !host_readable(kp[i], size)) {
            free(blob);
            return refuse(CUDA_ERROR_INVALID_VALUE, call, "kernelParams[%d] = %p: %zu readable "
                          "bytes expected (the entry has %d parameters)", i, kp[i], size,
                          e->nparams);
        }
        memcpy(blob + param_offset(e, i), kp[i], size);
    }
    *out = blob;
    return CUDA_SUCCESS;
}

/* every pointer parameter inside a live allocation and aligned as declared: at run time a fault;
 * at capture (`captured`) a logged warning, as the driver faults only when the graph runs */
static CUresult check_pointers(const struct ptx_entry *e, const unsigned char *blob,
                               const char *call, int captured)
{
    for (int i = 0; i < e->nparams; i++) {
        const struct ptx_param *p = &e->params[i];
        uint64_t v = p->is_ptr ? param_u64(e, blob, i) : 0;
        const char *host = v && !is_device_address(v) ? " (a host address, not a device one)" : "";
        const char *when = captured ? ": the graph faults when it runs" : "";
        if (!p->is_ptr || (v == 0 && e->triton && i >= e->nparams - TRITON_HIDDEN_PARAMS))
            continue;                   /* Triton's scratch pointer, null when it asks none */
        if (!alloc_contains(v))
            return (captured ? refuse : fault)(
                CUDA_ERROR_ILLEGAL_ADDRESS, call, "parameter %d = %#llx is not inside a live "
                "allocation%s%s", i, (unsigned long long)v, host, when);
        if (p->align > 1 && v % p->align)
            return (captured ? refuse : fault)(
                CUDA_ERROR_MISALIGNED_ADDRESS, call, "parameter %d = %#llx is not aligned to its "
                ".align %u%s", i, (unsigned long long)v, p->align, when);
    }
    return CUDA_SUCCESS;
}

static void *span(uint64_t d, size_t n, const char *what, const char *call, CUresult *r)
{
    void *h = device_range(d, n);
    if (!h && *r == CUDA_SUCCESS)
        *r = fault(CUDA_ERROR_ILLEGAL_ADDRESS, call, "%s [%#llx, +%zu) is not inside one live "
                   "allocation", what, (unsigned long long)d, n);
    return h;
}

/* %globaltimer at record+8, zero at record+4, then the doorbell's value with release order */
static void release_record(unsigned char *slot, uint32_t seq)
{
    __atomic_store_n((uint64_t *)(slot + 8), now_ns(CLOCK_REALTIME), __ATOMIC_RELAXED);
    __atomic_store_n((uint32_t *)(slot + 4), 0u, __ATOMIC_RELAXED);
    __atomic_store_n((uint32_t *)slot, seq, __ATOMIC_RELEASE);
}

static CUresult execute(const struct ptx_entry *e, const unsigned char *blob, const char *call)
{
    CUresult r = CUDA_SUCCESS;
    int release = strcmp(e->name, RELEASE_ENTRY) == 0 && e->nparams == 2;
    int stage_in = strcmp(e->name, STAGE_IN_ENTRY) == 0 && e->nparams == 4;
    if (release || stage_in) {
        uint32_t *bell = span(param_u64(e, blob, 0), DOORBELL_BYTES, "the doorbell", call, &r);
        unsigned char *slot = span(param_u64(e, blob, 1), SEMAPHORE_RECORD_BYTES,
                                   "the semaphore record", call, &r);
        unsigned char *src = stage_in ? span(param_u64(e, blob, 2), INPUT_RECORD_BYTES,
                                             "the input record", call, &r) : NULL;
        unsigned char *dst = stage_in ? span(param_u64(e, blob, 3), INPUT_RECORD_BYTES
                                             + DOORBELL_BYTES, "the staged copy", call, &r) : NULL;
        if (r != CUDA_SUCCESS)
            return r;
        uint32_t seq = __atomic_load_n(bell, __ATOMIC_RELAXED);
        if (stage_in)
            G.sequence = seq, issue_hooks(seq);
        if (stage_in) {
            memcpy(dst, src, INPUT_RECORD_BYTES);
            memcpy(dst + INPUT_RECORD_BYTES, &seq, sizeof seq);
            G.stats.staged++;
        }
        __atomic_thread_fence(__ATOMIC_ACQ_REL);
        release_record(slot, seq);
        G.stats.released += release;
    } else if (strcmp(e->name, COPY_ENTRY) == 0 && e->nparams >= 3 && e->params[0].is_ptr
               && e->params[1].is_ptr && !e->params[2].is_ptr && e->params[2].size == 4) {
        size_t n = (size_t)(uint32_t)param_u64(e, blob, 2) * FP32_BYTES;
        void *src = span(param_u64(e, blob, 0), n, "the copy's source", call, &r);
        void *dst = span(param_u64(e, blob, 1), n, "the copy's destination", call, &r);
        if (r == CUDA_SUCCESS)
            memmove(dst, src, n), corrupt_output(dst, n), G.stats.copied_kernels++;
    }
    return r;
}

/* a kernel node run (an immediate launch, or a node of a graph replay), under the lock */
CUresult run_kernel_node(const struct node *nd, const char *call)
{
    char name[CALL_BYTES];
    struct function *f = slot_get(H_FUNCTION, nd->func);
    if (!f)
        return fault(CUDA_ERROR_LAUNCH_FAILED, call, "a captured kernel's module was unloaded");
    snprintf(name, sizeof name, "%s(%s)", call, f->entry->name);
    CUresult r = check_pointers(f->entry, nd->params, name, 0);
    if (r == CUDA_SUCCESS && f->entry->triton && executor_attached())
        return executor_launch(f, nd, name);      /* every Triton kernel, copy_f32 included */
    return r == CUDA_SUCCESS ? execute(f->entry, nd->params, name) : r;
}

static CUresult checked(struct function *f, struct node *nd, CUhandle func, void **kp,
                        void **extra, const char *call)
{
    CUresult r = check_shape(f, nd, call);
    if (r == CUDA_SUCCESS)
        r = pack(f->entry, kp, extra, &nd->params, call);
    nd->n = param_offset(f->entry, f->entry->nparams);     /* a kernel node: its params' bytes */
    if (r == CUDA_SUCCESS && nd->programmatic && G.cc_major < 9)
        r = refuse(CUDA_ERROR_INVALID_VALUE, call, "programmatic stream serialization needs "
                   "compute capability 9.0");
    if (r == CUDA_SUCCESS && nd->programmatic && !f->entry->waits)
        refuse(CUDA_SUCCESS, call, "a programmatic launch of a kernel without "
               "griddepcontrol.wait: it races the kernel before it");   /* the driver allows it */
    nd->func = func;
    return r;
}

static CUresult launch(const char *api, CUhandle func, struct node *nd, CUhandle stream,
                       void **kp, void **extra)
{
    char call[CALL_BYTES];
    lock();
    struct function *f = slot_get(H_FUNCTION, func);
    struct stream *st = stream ? stream_get(stream) : NULL;
    struct capture *c = stream_capture(st);
    snprintf(call, sizeof call, "%s(%s)", api, f ? f->entry->name : "?");
    CUresult r = need_context(call);
    if (r == CUDA_SUCCESS)
        r = !f ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "function %p is not loaded", func)
          : stream && !st ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p", stream)
          : c && c->invalid ? refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, call,
                                     "the stream's capture was invalidated earlier")
          : G.sticky;
    if (r == CUDA_SUCCESS)
        r = checked(f, nd, func, kp, extra, call);
    if (r == CUDA_SUCCESS) {
        G.stats.launches++;
        G.stats.programmatic += nd->programmatic;
        if (c) {
            check_pointers(f->entry, nd->params, call, 1);     /* logged; the capture goes on */
            r = capture_add(st, nd, call);
        } else {
            run_kernel_node(nd, api);   /* a fault shows later, as the device reports it */
            free(nd->params);
        }
    } else {
        free(nd->params);
    }
    unlock();
    return r;
}

CUresult cuLaunchKernel(CUhandle f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, CUhandle stream, void **kp,
                        void **extra)
{
    struct node nd = {.kind = NODE_KERNEL, .grid = {gx, gy, gz}, .block = {bx, by, bz},
                      .shared = shared};
    return launch("cuLaunchKernel", f, &nd, stream, kp, extra);
}

CUresult cuLaunchKernelEx(const struct launch_config *config, CUhandle f, void **kp,
                          void **extra)
{
    const char *call = "cuLaunchKernelEx";
    if (!config || (config->nattrs && !config->attrs))
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "config %p", (const void *)config);
    struct node nd = {.kind = NODE_KERNEL, .shared = config->shared};
    memcpy(nd.grid, config->grid, sizeof nd.grid);
    memcpy(nd.block, config->block, sizeof nd.block);
    for (unsigned i = 0; i < config->nattrs; i++) {
        const struct launch_attr *a = &config->attrs[i];
        if (a->id != LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION)
            return refuse(CUDA_ERROR_NOT_SUPPORTED, call, "launch attribute %d: the stub knows "
                          "programmatic stream serialization only", a->id);
        if (a->value.programmatic != 0 && a->value.programmatic != 1)
            return refuse(CUDA_ERROR_INVALID_VALUE, call, "programmaticStreamSerializationAllowed "
                          "%d", a->value.programmatic);
        nd.programmatic = a->value.programmatic;
    }
    return launch(call, f, &nd, config->stream, kp, extra);
}
