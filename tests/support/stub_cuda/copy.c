/* Copies and memsets: checked, then executed at once (the stub's streams are synchronous), or,
 * on a capturing stream, kept as a graph node and executed at each replay. */
#define _GNU_SOURCE
#include <string.h>

#include "stub.h"

static const char *const DIRECTION[] = {"", "HtoD", "DtoH", "DtoD"};

static CUresult check_host(const char *call, const char *what, const void *p, size_t n)
{
    if (is_device_address((uintptr_t)p))
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "%s %p is a device address, not host "
                      "memory", what, p);
    if (!host_readable(p, n))
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "%s host bytes [%p, +%zu) are not mapped",
                      what, p, n);
    return CUDA_SUCCESS;
}

static CUresult check_device(const char *call, const char *what, CUdeviceptr d, size_t n)
{
    if (device_range(d, n))
        return CUDA_SUCCESS;
    if (!is_device_address(d) && host_readable((void *)(uintptr_t)d, 1))
        return refuse(CUDA_ERROR_INVALID_VALUE, call, "%s %#llx is a host address, not a device "
                      "one (mapped memory: the address cuMemHostGetDevicePointer gives)", what, d);
    return refuse(CUDA_ERROR_INVALID_VALUE, call, "%s device bytes [%#llx, +%zu) are not inside "
                  "one live allocation", what, d, n);
}

static CUresult check_node(const struct node *nd, const char *call)
{
    CUresult r = CUDA_SUCCESS;
    if (nd->kind == NODE_SET)
        return check_device(call, "destination", nd->dst, nd->n);
    if (nd->dir == COPY_HTOD || nd->dir == COPY_DTOD)
        r = check_device(call, "destination", nd->dst, nd->n);
    if (r == CUDA_SUCCESS && (nd->dir == COPY_DTOH || nd->dir == COPY_DTOD))
        r = check_device(call, "source", nd->src, nd->n);
    if (r == CUDA_SUCCESS && nd->dir != COPY_DTOD)
        r = check_host(call, nd->dir == COPY_HTOD ? "source" : "destination", nd->host, nd->n);
    return r;
}

/* the host addresses a checked node reads and writes */
static void resolve(const struct node *nd, void **dst, const void **src)
{
    *dst = nd->dir == COPY_DTOH ? nd->host : device_range(nd->dst, nd->n);
    *src = nd->kind == NODE_SET ? NULL
         : nd->dir == COPY_HTOD ? nd->host : device_range(nd->src, nd->n);
}

static void count(const struct node *nd)
{
    if (nd->kind == NODE_SET)
        G.stats.memsets++;
    else
        G.stats.copies++, G.stats.copy_bytes += nd->n;
}

static void perform(const struct node *nd, void *dst, const void *src)
{
    if (nd->kind == NODE_SET)
        memset(dst, nd->value, nd->n);
    else
        memmove(dst, src, nd->n);
}

/* `sync`: a synchronous call on the legacy stream (an unsafe call during stream capture) */
static CUresult enqueue(struct node *nd, CUhandle stream, const char *call, int sync)
{
    lock();
    CUresult r = need_context(call);
    struct stream *st = NULL;
    if (r == CUDA_SUCCESS && G.sticky)
        r = G.sticky;
    if (r == CUDA_SUCCESS && sync)
        r = capture_guard(call);
    if (r == CUDA_SUCCESS && stream && !(st = stream_get(stream)))
        r = refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p is not a live stream", stream);
    if (r != CUDA_SUCCESS || nd->n == 0) {
        unlock();
        return r;
    }
    r = check_node(nd, call);
    if (r == CUDA_SUCCESS && st && stream_capture(st)) {
        r = capture_add(st, nd, call);
        unlock();
        return r;
    }
    void *dst = NULL;
    const void *src = NULL;
    if (r == CUDA_SUCCESS) {
        resolve(nd, &dst, &src);
        count(nd);
    }
    unlock();
    if (r == CUDA_SUCCESS)          /* outside the lock: a 64 MiB chunk must not stall launches */
        perform(nd, dst, src);
    return r;
}

/* a copy or memset node of a graph replay (under the lock): memory may have been freed since */
CUresult run_copy_node(const struct node *nd, const char *call)
{
    void *dst;
    const void *src;
    if (!(nd->kind == NODE_SET ? device_range(nd->dst, nd->n) != NULL
          : (nd->dir == COPY_DTOH || device_range(nd->dst, nd->n))
            && (nd->dir == COPY_HTOD || device_range(nd->src, nd->n))))
        return fault(CUDA_ERROR_ILLEGAL_ADDRESS, call, "captured %s of %zu bytes touches memory "
                     "freed since the capture",
                     nd->kind == NODE_SET ? "memset" : DIRECTION[nd->dir], nd->n);
    resolve(nd, &dst, &src);
    count(nd);
    perform(nd, dst, src);
    return CUDA_SUCCESS;
}

static CUresult copy(int dir, CUdeviceptr dst, CUdeviceptr src, void *host, size_t n,
                     CUhandle stream, const char *call, int sync)
{
    struct node nd = {.kind = NODE_COPY, .dir = dir, .dst = dst, .src = src, .host = host,
                      .n = n};
    return enqueue(&nd, stream, call, sync);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUhandle s)
{
    return copy(COPY_HTOD, dst, 0, (void *)src, n, s, "cuMemcpyHtoDAsync", 0);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUhandle s)
{
    return copy(COPY_DTOH, 0, src, dst, n, s, "cuMemcpyDtoHAsync", 0);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUhandle s)
{
    return copy(COPY_DTOD, dst, src, NULL, n, s, "cuMemcpyDtoDAsync", 0);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return copy(COPY_HTOD, dst, 0, (void *)src, n, NULL, "cuMemcpyHtoD", 1);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return copy(COPY_DTOH, 0, src, dst, n, NULL, "cuMemcpyDtoH", 1);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy(COPY_DTOD, dst, src, NULL, n, NULL, "cuMemcpyDtoD", 1);
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUhandle s)
{
    struct node nd = {.kind = NODE_SET, .dst = dst, .value = value, .n = n};
    return enqueue(&nd, s, "cuMemsetD8Async", 0);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    struct node nd = {.kind = NODE_SET, .dst = dst, .value = value, .n = n};
    return enqueue(&nd, NULL, "cuMemsetD8", 1);
}
