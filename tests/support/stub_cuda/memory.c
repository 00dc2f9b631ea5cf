/* Device memory as host memory at an aliased address, the mapped staging memory, copies, memsets.
 *
 * cuMemAlloc maps anonymous host memory and hands out its address + DEVICE_ALIAS; cuMemHostAlloc
 * with DEVICEMAP hands out the host address, and cuMemHostGetDevicePointer that address +
 * MAPPED_ALIAS.  Every device address a copy, a memset or a kernel the stub executes touches must
 * lie in one live allocation; host pointers are checked to be mapped (mincore). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "stub.h"

#define HOST_ADDRESS_LIMIT (1ull << 47)
#define MINCORE_STACK_PAGES 64

struct alloc { uintptr_t host; size_t size; CUdeviceptr dev; unsigned flags; int mapped; };
static struct alloc *dev_allocs;     /* cuMemAlloc and DEVICEMAP memory, sorted by device address */
static int ndev, capdev;
static struct alloc *host_allocs;    /* every cuMemHostAlloc */
static int nhost, caphost;

static void push(struct alloc **v, int *n, int *cap, struct alloc a, int at)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *v = realloc(*v, sizeof **v * (size_t)*cap);
    }
    memmove(*v + at + 1, *v + at, sizeof **v * (size_t)(*n - at));
    (*v)[at] = a;
    (*n)++;
}

static void drop(struct alloc *v, int *n, int at)
{
    memmove(v + at, v + at + 1, sizeof *v * (size_t)(*n - at - 1));
    (*n)--;
}

/* index of the allocation holding device address d, or -1 */
static int find_dev(CUdeviceptr d)
{
    int lo = 0, hi = ndev - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        struct alloc *a = &dev_allocs[mid];
        if (d < a->dev)
            hi = mid - 1;
        else if (d >= a->dev + a->size)
            lo = mid + 1;
        else
            return mid;
    }
    return -1;
}

static void insert_dev(struct alloc a)
{
    int at = 0;
    while (at < ndev && dev_allocs[at].dev < a.dev)
        at++;
    push(&dev_allocs, &ndev, &capdev, a, at);
}

int alloc_contains(CUdeviceptr d) { return find_dev(d) >= 0; }

/* exported for the executor (execute.c): the live allocation or mapped range holding device
 * address d — its device base, size and host address — or 0.  Takes no lock: its caller, a
 * kernel hook, runs under the stub's. */
int coppelius_stub_region(CUdeviceptr d, CUdeviceptr *base, size_t *size, uintptr_t *host)
{
    int i = find_dev(d);
    if (i < 0)
        return 0;
    *base = dev_allocs[i].dev;
    *size = dev_allocs[i].size;
    *host = dev_allocs[i].host;
    return 1;
}

int is_device_address(CUdeviceptr d) { return d >= DEVICE_ALIAS; }

/* the host address of device bytes [d, d + n) when they lie in one live allocation, else NULL */
void *device_range(CUdeviceptr d, size_t n)
{
    int i = find_dev(d);
    if (i < 0 || n > dev_allocs[i].dev + dev_allocs[i].size - d)
        return NULL;
    return (void *)(dev_allocs[i].host + (uintptr_t)(d - dev_allocs[i].dev));
}

/* host bytes [p, p + n) are mapped in this process (mincore fails on an unmapped page) */
int host_readable(const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    if (!p || a >= HOST_ADDRESS_LIMIT || n > HOST_ADDRESS_LIMIT - a)
        return 0;
    if (n == 0)
        return 1;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = a & ~(page - 1);
    size_t len = a + n - start, pages = (len + page - 1) / page;
    unsigned char small[MINCORE_STACK_PAGES], *vec = pages <= MINCORE_STACK_PAGES ? small
                                                                                 : malloc(pages);
    int ok = vec && mincore((void *)start, len, vec) == 0;
    if (vec != small)
        free(vec);
    return ok;
}

static void *map_bytes(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    madvise(p, n, MADV_HUGEPAGE);      /* a 1.3 GB poison fill: 2 MiB pages fault 512x less */
    return p;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n)
{
    lock();
    CUresult r = need_context("cuMemAlloc");
    if (r == CUDA_SUCCESS && G.sticky)
        r = G.sticky;
    if (r == CUDA_SUCCESS)
        r = capture_guard("cuMemAlloc");
    if (r == CUDA_SUCCESS && (!dptr || n == 0))
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc", "pointer %p, %zu bytes",
                   (void *)dptr, n);
    void *p = r == CUDA_SUCCESS ? map_bytes(n) : NULL;
    if (r == CUDA_SUCCESS && !p)
        r = refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "%zu bytes", n);
    if (r == CUDA_SUCCESS) {
        struct alloc a = {(uintptr_t)p, n, (uintptr_t)p + DEVICE_ALIAS, 0, 0};
        insert_dev(a);
        *dptr = a.dev;
    }
    unlock();
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr d)
{
    lock();
    CUresult r = need_context("cuMemFree");
    if (r == CUDA_SUCCESS)
        r = capture_guard("cuMemFree");
    int i = find_dev(d);
    if (r == CUDA_SUCCESS && (i < 0 || dev_allocs[i].dev != d || dev_allocs[i].mapped))
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFree",
                   "%#llx is not the start of a cuMemAlloc allocation", d);
    if (r == CUDA_SUCCESS) {
        munmap((void *)dev_allocs[i].host, dev_allocs[i].size);
        drop(dev_allocs, &ndev, i);
    }
    if (r == CUDA_SUCCESS && G.sticky)
        r = G.sticky;
    unlock();
    return r;
}

CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags)
{
    lock();
    CUresult r = need_context("cuMemHostAlloc");
    if (r == CUDA_SUCCESS)
        r = capture_guard("cuMemHostAlloc");
    if (r == CUDA_SUCCESS && (!pp || n == 0 || (flags & ~7u)))
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostAlloc", "pointer %p, %zu bytes, flags %#x",
                   (void *)pp, n, flags);
    void *p = r == CUDA_SUCCESS ? map_bytes(n) : NULL;
    if (r == CUDA_SUCCESS && !p)
        r = refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc", "%zu bytes", n);
    if (r == CUDA_SUCCESS) {
        struct alloc a = {(uintptr_t)p, n, 0, flags, 1};
        if (flags & HOSTALLOC_DEVICEMAP) {
            a.dev = (uintptr_t)p + MAPPED_ALIAS;
            insert_dev(a);
        }
        push(&host_allocs, &nhost, &caphost, a, nhost);
        *pp = p;
    }
    unlock();
    return r;
}

static int find_host(const void *p, int base_only)
{
    for (int i = 0; i < nhost; i++) {
        uintptr_t a = (uintptr_t)p;
        if (a == host_allocs[i].host || (!base_only && a > host_allocs[i].host
                                         && a < host_allocs[i].host + host_allocs[i].size))
            return i;
    }
    return -1;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
    lock();
    CUresult r = need_context("cuMemHostGetDevicePointer");
    int i = find_host(p, 0);
    if (r == CUDA_SUCCESS && (!d || flags != 0 || i < 0
                              || !(host_allocs[i].flags & HOSTALLOC_DEVICEMAP)))
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuMemHostGetDevicePointer",
                   "%p (flags %u) is not in cuMemHostAlloc memory allocated with DEVICEMAP",
                   p, flags);
    if (r == CUDA_SUCCESS)
        *d = (uintptr_t)p + MAPPED_ALIAS;
    unlock();
    return r;
}

CUresult cuMemFreeHost(void *p)
{
    lock();
    CUresult r = need_context("cuMemFreeHost");
    if (r == CUDA_SUCCESS)
        r = capture_guard("cuMemFreeHost");
    int i = find_host(p, 1);
    if (r == CUDA_SUCCESS && i < 0)
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost",
                   "%p is not the start of a cuMemHostAlloc allocation", p);
    if (r == CUDA_SUCCESS) {
        int j = host_allocs[i].dev ? find_dev(host_allocs[i].dev) : -1;
        if (j >= 0)
            drop(dev_allocs, &ndev, j);
        munmap((void *)host_allocs[i].host, host_allocs[i].size);
        drop(host_allocs, &nhost, i);
    }
    unlock();
    return r;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    lock();
    CUresult r = need_context("cuMemGetInfo");
    size_t used = 0;
    for (int i = 0; i < ndev; i++)
        used += dev_allocs[i].mapped ? 0 : dev_allocs[i].size;
    if (r == CUDA_SUCCESS && free_bytes && total)
        *total = 141ull << 30, *free_bytes = *total > used ? *total - used : 0;
    unlock();
    return r;
}

void context_destroy(void)
{
    for (int i = 0; i < ndev; i++)
        if (!dev_allocs[i].mapped)
            munmap((void *)dev_allocs[i].host, dev_allocs[i].size);
    for (int i = 0; i < nhost; i++)
        munmap((void *)host_allocs[i].host, host_allocs[i].size);
    ndev = nhost = 0;
    for (int i = 0; i < MAX_MODULES; i++)
        if (G.modules[i].s.live) {
            ptx_free(&G.modules[i].ptx);
            free(G.modules[i].funcs);
            G.modules[i].s.live = 0;
        }
    for (int i = 0; i < MAX_FUNCTIONS; i++)
        G.functions[i].s.live = 0;
    for (int i = 0; i < MAX_STREAMS; i++)
        if (G.streams[i].s.live)
            free(G.streams[i].front), G.streams[i].s.live = 0;
    for (int i = 0; i < MAX_EVENTS; i++)
        if (G.events[i].s.live)
            free(G.events[i].deps), G.events[i].s.live = 0;
    for (int i = 0; i < MAX_GRAPHS; i++) {
        if (G.graphs[i].s.live)
            nodes_free(&G.graphs[i].nodes), G.graphs[i].s.live = 0;
        if (G.execs[i].s.live)
            nodes_free(&G.execs[i].nodes), G.execs[i].s.live = 0;
    }
    for (int i = 0; i < MAX_CAPTURES; i++)
        if (G.captures[i].live)
            nodes_free(&G.captures[i].nodes), G.captures[i].live = 0;
    G.sticky = CUDA_SUCCESS;
}
