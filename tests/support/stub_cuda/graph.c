/* Graphs: the end of a stream capture (joined or refused), instantiation, and replay, which runs
 * the nodes in capture order (a topological order) on the launching stream; a graph's nodes, their
 * types and a kernel node's priority attribute, as the driver reports them. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "stub.h"

/* a node handle: tag << 40 | graph slot << NODE_INDEX_BITS | node index + 1 (no slot of its own) */
#define NODE_TAG 0x5200ull
#define NODE_INDEX_BITS 28

void node_clear(struct node *nd)
{
    free(nd->deps);
    if (nd->kind == NODE_KERNEL)
        free(nd->params);
    nd->deps = NULL, nd->params = NULL;
}

void nodes_push(struct nodes *ns, const struct node *nd)
{
    if (ns->n == ns->cap)
        ns->v = realloc(ns->v, sizeof *ns->v * (size_t)(ns->cap = ns->cap ? 2 * ns->cap : 64));
    ns->v[ns->n++] = *nd;
}

void nodes_free(struct nodes *ns)
{
    for (int i = 0; i < ns->n; i++)
        node_clear(&ns->v[i]);
    free(ns->v);
    memset(ns, 0, sizeof *ns);
}

static void nodes_copy(struct nodes *out, const struct nodes *in)
{
    memset(out, 0, sizeof *out);
    for (int i = 0; i < in->n; i++) {
        struct node nd = in->v[i];
        nd.deps = malloc(sizeof *nd.deps * (size_t)(nd.ndeps + 1));
        if (nd.ndeps)
            memcpy(nd.deps, in->v[i].deps, sizeof *nd.deps * (size_t)nd.ndeps);
        if (nd.kind == NODE_KERNEL) {
            nd.params = malloc(nd.n + 1);
            memcpy(nd.params, in->v[i].params, nd.n);
        }
        nodes_push(out, &nd);
    }
}

/* the index of a capturing stream whose frontier the origin's does not reach, or -1 */
static int unjoined(const struct capture *c, const struct stream *origin)
{
    int n = c->nodes.n, top = 0, bad = -1;
    char *seen = calloc((size_t)n + 1, 1);
    int *todo = malloc(sizeof *todo * ((size_t)n + 1) * 2), cap = 2 * (n + 1);
    for (int i = 0; i < origin->nfront; i++)
        todo[top++] = origin->front[i];
    while (top > 0) {
        int k = todo[--top];
        if (seen[k])
            continue;
        seen[k] = 1;
        for (int d = 0; d < c->nodes.v[k].ndeps; d++) {
            if (top == cap)
                todo = realloc(todo, sizeof *todo * (size_t)(cap *= 2));
            todo[top++] = c->nodes.v[k].deps[d];
        }
    }
    for (int s = 0; s < MAX_STREAMS && bad < 0; s++) {
        const struct stream *st = &G.streams[s];
        if (!st->s.live || st == origin || st->capture != c - G.captures + 1)
            continue;
        for (int i = 0; i < st->nfront && bad < 0; i++)
            if (!seen[st->front[i]])
                bad = s;
    }
    free(seen);
    free(todo);
    return bad;
}

static CUresult end_capture(struct stream *st, struct capture *c, CUhandle *graph)
{
    const char *call = "cuStreamEndCapture";
    int bad = c->invalid ? -1 : unjoined(c, st);
    CUresult r = CUDA_SUCCESS;
    if (c->invalid)
        r = refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, call, "the capture was invalidated by "
                   "an earlier call");
    else if (bad >= 0)
        r = refuse(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, call, "a stream forked into the capture "
                   "(by an event wait) has work the origin stream does not wait for");
    int g = r == CUDA_SUCCESS ? slot_new(H_GRAPH, graph) : -1;
    if (r == CUDA_SUCCESS && g < 0)
        r = refuse(CUDA_ERROR_OUT_OF_MEMORY, call, "stub limit: %d graphs", MAX_GRAPHS);
    if (g >= 0) {
        G.graphs[g].nodes = c->nodes;
        memset(&c->nodes, 0, sizeof c->nodes);
    } else {
        nodes_free(&c->nodes);
        *graph = NULL;
    }
    capture_release(c);
    return r;
}

CUresult cuStreamEndCapture(CUhandle stream, CUhandle *graph)
{
    const char *call = "cuStreamEndCapture";
    lock();
    struct stream *st = stream_get(stream);
    struct capture *c = stream_capture(st);
    CUresult r = !st ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p", stream)
               : !graph ? refuse(CUDA_ERROR_INVALID_VALUE, call, "null graph pointer")
               : !c ? refuse(CUDA_ERROR_ILLEGAL_STATE, call, "the stream is not capturing")
               : c->origin != st - G.streams
                 ? refuse(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, call, "the capture began on "
                          "another stream")
               : c->mode != CAPTURE_RELAXED && !pthread_equal(c->thread, pthread_self())
                 ? refuse(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, call, "the capture began on "
                          "another thread")
               : end_capture(st, c, graph);
    unlock();
    return r;
}

CUresult cuGraphInstantiateWithFlags(CUhandle *exec, CUhandle graph, unsigned long long flags)
{
    const char *call = "cuGraphInstantiate";
    lock();
    struct graph *g = slot_get(H_GRAPH, graph);
    CUresult r = need_context(call);
    if (r == CUDA_SUCCESS)
        r = !g ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "graph %p", graph)
          : !exec || (flags & ~(unsigned long long)GRAPH_INSTANTIATE_FLAGS_ALL)
            ? refuse(CUDA_ERROR_INVALID_VALUE, call, "flags %#llx", flags) : G.sticky;
    int e = r == CUDA_SUCCESS ? slot_new(H_EXEC, exec) : -1;
    if (r == CUDA_SUCCESS && e < 0)
        r = refuse(CUDA_ERROR_OUT_OF_MEMORY, call, "stub limit: %d executable graphs",
                   MAX_GRAPHS);
    if (e >= 0) {
        nodes_copy(&G.execs[e].nodes, &g->nodes);
        G.execs[e].flags = flags;   /* USE_NODE_PRIORITY: the nodes' priorities, not the stream's */
        G.stats.node_priority_graphs += (flags & GRAPH_INSTANTIATE_USE_NODE_PRIORITY) != 0;
    }
    unlock();
    return r;
}

CUresult cuGraphLaunch(CUhandle exec, CUhandle stream)
{
    const char *call = "cuGraphLaunch";
    lock();
    struct graph *x = slot_get(H_EXEC, exec);
    struct stream *st = stream ? stream_get(stream) : NULL;
    CUresult r = need_context(call);
    if (r == CUDA_SUCCESS)
        r = !x ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "executable graph %p", exec)
          : stream && !st ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p", stream)
          : st && st->capture ? refuse(CUDA_ERROR_NOT_SUPPORTED, call, "a graph launch into a "
                                       "capture: the stub does not nest graphs")
          : G.sticky;
    if (r == CUDA_SUCCESS) {
        G.stats.graph_launches++;
        for (int i = 0; i < x->nodes.n && G.sticky == CUDA_SUCCESS; i++) {
            const struct node *nd = &x->nodes.v[i];
            if (nd->kind == NODE_KERNEL)
                run_kernel_node(nd, call);       /* a fault shows later, as on the device */
            else
                run_copy_node(nd, call);
        }
    }
    unlock();
    return r;
}

static CUresult destroy(int kind, CUhandle h, const char *call)
{
    lock();
    struct graph *g = slot_get(kind, h);
    CUresult r = g ? CUDA_SUCCESS : refuse(CUDA_ERROR_INVALID_HANDLE, call, "%p is not live", h);
    if (g)
        nodes_free(&g->nodes), g->s.live = 0;
    unlock();
    return r;
}

CUresult cuGraphDestroy(CUhandle graph) { return destroy(H_GRAPH, graph, "cuGraphDestroy"); }
CUresult cuGraphExecDestroy(CUhandle exec) { return destroy(H_EXEC, exec, "cuGraphExecDestroy"); }

CUresult cuGraphGetNodes(CUhandle graph, CUhandle *nodes, size_t *count)
{
    lock();
    struct graph *g = slot_get(H_GRAPH, graph);
    CUresult r = !g ? refuse(CUDA_ERROR_INVALID_HANDLE, "cuGraphGetNodes", "graph %p", graph)
               : !count ? refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphGetNodes", "null count")
               : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS && !nodes) {
        *count = (size_t)g->nodes.n;
    } else if (r == CUDA_SUCCESS) {    /* entries past the graph's nodes are set to NULL */
        size_t n = *count < (size_t)g->nodes.n ? *count : (size_t)g->nodes.n;
        for (size_t k = 0; k < *count; k++)
            nodes[k] = k < n ? (CUhandle)(uintptr_t)(NODE_TAG << 40
                                                     | (uint64_t)(g - G.graphs) << NODE_INDEX_BITS
                                                     | (k + 1)) : NULL;
        *count = n;
    }
    unlock();
    return r;
}

/* the node a handle names in a live graph, or NULL */
static const struct node *node_get(CUhandle h)
{
    uint64_t v = (uint64_t)(uintptr_t)h;
    int k = (int)(v & ((1ull << NODE_INDEX_BITS) - 1)) - 1;
    uint64_t gi = (v >> NODE_INDEX_BITS) & ((1ull << (40 - NODE_INDEX_BITS)) - 1);
    if ((v >> 40) != NODE_TAG || gi >= MAX_GRAPHS || !G.graphs[gi].s.live || k < 0
        || k >= G.graphs[gi].nodes.n)
        return NULL;
    return &G.graphs[gi].nodes.v[k];
}

CUresult cuGraphNodeGetType(CUhandle node, int *type)
{
    lock();
    const struct node *nd = node_get(node);
    CUresult r = !nd ? refuse(CUDA_ERROR_INVALID_HANDLE, "cuGraphNodeGetType", "node %p", node)
               : !type ? refuse(CUDA_ERROR_INVALID_VALUE, "cuGraphNodeGetType", "null")
               : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        *type = nd->kind == NODE_KERNEL ? GRAPH_NODE_KERNEL
              : nd->kind == NODE_SET ? GRAPH_NODE_MEMSET : GRAPH_NODE_MEMCPY;
    unlock();
    return r;
}

/* the priority only: the one attribute the host asks of a node (an int at the value's start) */
CUresult cuGraphKernelNodeGetAttribute(CUhandle node, int attr, void *value)
{
    const char *call = "cuGraphKernelNodeGetAttribute";
    lock();
    const struct node *nd = node_get(node);
    CUresult r = !nd ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "node %p", node)
               : nd->kind != NODE_KERNEL ? refuse(CUDA_ERROR_INVALID_VALUE, call, "not a kernel "
                                                  "node")
               : !value ? refuse(CUDA_ERROR_INVALID_VALUE, call, "null value")
               : attr != LAUNCH_ATTR_PRIORITY ? refuse(CUDA_ERROR_NOT_SUPPORTED, call, "attribute "
                                                       "%d: the stub knows the priority only", attr)
               : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        memcpy(value, &nd->priority, sizeof nd->priority);
    unlock();
    return r;
}
