/* Streams, events and stream capture as the driver tracks them.
 *
 * Work runs when it is enqueued (a stream is always idle afterwards), so a timing event holds the
 * host clock when its stream reached it.  During capture each operation becomes a node whose
 * dependencies are its stream's frontier; cuEventRecord on a capturing stream keeps that frontier
 * in the event and cuStreamWaitEvent adds it to the waiting stream's (a stream not yet capturing
 * joins the capture).  What the driver refuses during capture is refused with its code, and the
 * capture is invalidated where the driver invalidates it.  Streams have priorities in the range
 * COPPELIUS_STUB_PRIORITIES ("least,greatest", default 0,-5; "0,0": a device without); a
 * captured kernel node takes its stream's, as the driver copies it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stub.h"

#define PRIORITIES_ENV "COPPELIUS_STUB_PRIORITIES"

struct stream *stream_get(CUhandle h) { return slot_get(H_STREAM, h); }

struct capture *stream_capture(const struct stream *s)
{
    return s && s->capture ? &G.captures[s->capture - 1] : NULL;
}

static struct capture *capture_by_id(unsigned id)
{
    for (int i = 0; id && i < MAX_CAPTURES; i++)
        if (G.captures[i].live && G.captures[i].id == id)
            return &G.captures[i];
    return NULL;
}

int set_union(int **set, int *n, const int *add, int nadd)
{
    for (int i = 0; i < nadd; i++) {
        int seen = 0;
        for (int k = 0; k < *n && !seen; k++)
            seen = (*set)[k] == add[i];
        if (!seen) {
            *set = realloc(*set, sizeof **set * (size_t)(*n + 1));
            (*set)[(*n)++] = add[i];
        }
    }
    return *n;
}

/* later work on its streams, and its end, are refused (the caller logs what invalidated it) */
void capture_invalidate(struct capture *c)
{
    if (c)
        c->invalid = 1;
}

/* an unsafe call (allocation, synchronous copy) while a capture forbids it on this thread */
CUresult capture_guard(const char *call)
{
    for (int i = 0; i < MAX_CAPTURES; i++) {
        struct capture *c = &G.captures[i];
        int mine = pthread_equal(c->thread, pthread_self());
        if (c->live && (c->mode == CAPTURE_GLOBAL || (c->mode == CAPTURE_THREAD_LOCAL && mine))) {
            capture_invalidate(c);
            return refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call, "not permitted while a "
                          "%s-mode capture is in progress (the capture is invalidated)",
                          c->mode == CAPTURE_GLOBAL ? "global" : "thread-local");
        }
    }
    return CUDA_SUCCESS;
}

/* the node (its contents now owned by the capture) after the stream's frontier */
CUresult capture_add(struct stream *st, struct node *nd, const char *call)
{
    struct capture *c = stream_capture(st);
    if (c->invalid) {
        node_clear(nd);
        return refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, call, "the stream's capture was "
                      "invalidated earlier");
    }
    nd->ndeps = 0, nd->deps = NULL;
    if (nd->kind == NODE_KERNEL) {      /* "copied from stream priority during stream capture" */
        nd->priority = st->priority;
        G.stats.priority_nodes += st->priority != STUB_PRIORITY_LEAST;
    }
    set_union(&nd->deps, &nd->ndeps, st->front, st->nfront);
    nodes_push(&c->nodes, nd);
    st->front = realloc(st->front, sizeof *st->front);
    st->front[0] = c->nodes.n - 1, st->nfront = 1;
    G.stats.captured++;
    return CUDA_SUCCESS;
}

/* every stream of the capture leaves it */
void capture_release(struct capture *c)
{
    for (int i = 0; i < MAX_STREAMS; i++)
        if (G.streams[i].s.live && G.streams[i].capture == c - G.captures + 1) {
            G.streams[i].capture = 0;
            free(G.streams[i].front), G.streams[i].front = NULL, G.streams[i].nfront = 0;
        }
    c->live = 0;
}

/* the device's (least, greatest) stream priority: lower numbers are higher priorities */
static void priority_range(int *least, int *greatest)
{
    const char *env = getenv(PRIORITIES_ENV);
    if (!env || sscanf(env, "%d,%d", least, greatest) != 2 || *greatest > *least)
        *least = STUB_PRIORITY_LEAST, *greatest = STUB_PRIORITY_GREATEST;
}

CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    lock();
    CUresult r = need_context("cuCtxGetStreamPriorityRange");
    if (r == CUDA_SUCCESS && (least || greatest)) {
        int lo, hi;
        priority_range(&lo, &hi);
        if (least)
            *least = lo;
        if (greatest)
            *greatest = hi;
    }
    unlock();
    return r;
}

static CUresult stream_create(CUhandle *stream, unsigned flags, int priority, const char *call)
{
    int least, greatest;
    priority_range(&least, &greatest);
    lock();
    CUresult r = need_context(call);
    if (r == CUDA_SUCCESS && (!stream || (flags & ~(unsigned)STREAM_NON_BLOCKING)))
        r = refuse(CUDA_ERROR_INVALID_VALUE, call, "flags %#x", flags);
    if (r == CUDA_SUCCESS && (priority > least || priority < greatest)) {
        refuse(CUDA_SUCCESS, call, "priority %d outside the range %d (least) to %d (greatest) "
               "cuCtxGetStreamPriorityRange reports: the driver clamps it", priority, least,
               greatest);           /* accepted, as the driver accepts it: logged */
        priority = priority > least ? least : greatest;
    }
    int i = r == CUDA_SUCCESS ? slot_new(H_STREAM, stream) : -1;
    if (r == CUDA_SUCCESS && i < 0)
        r = refuse(CUDA_ERROR_OUT_OF_MEMORY, call, "stub limit: %d streams", MAX_STREAMS);
    if (i >= 0)
        G.streams[i].flags = flags, G.streams[i].priority = priority;
    unlock();
    return r;
}

CUresult cuStreamCreate(CUhandle *stream, unsigned flags)
{
    return stream_create(stream, flags, STUB_PRIORITY_LEAST, "cuStreamCreate");
}

CUresult cuStreamCreateWithPriority(CUhandle *stream, unsigned flags, int priority)
{
    return stream_create(stream, flags, priority, "cuStreamCreateWithPriority");
}

CUresult cuStreamGetPriority(CUhandle stream, int *priority)
{
    lock();
    struct stream *st = stream_get(stream);
    CUresult r = !st ? refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamGetPriority", "stream %p is "
                              "not a live stream", stream)
               : !priority ? refuse(CUDA_ERROR_INVALID_VALUE, "cuStreamGetPriority", "null")
               : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        *priority = st->priority;
    unlock();
    return r;
}

CUresult cuStreamDestroy_v2(CUhandle stream)
{
    lock();
    struct stream *st = stream_get(stream);
    CUresult r = st ? CUDA_SUCCESS : refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy",
                                            "stream %p is not a live stream", stream);
    if (st && st->capture) {
        capture_invalidate(stream_capture(st));
        refuse(CUDA_SUCCESS, "cuStreamDestroy", "a capturing stream destroyed (its capture is "
               "invalidated)");
    }
    if (st)
        free(st->front), st->front = NULL, st->s.live = 0;
    unlock();
    return r;
}

/* cuStreamQuery / cuStreamSynchronize: not on a capturing stream; else the device's state */
static CUresult stream_wait(CUhandle stream, const char *call)
{
    lock();
    struct stream *st = stream ? stream_get(stream) : NULL;
    CUresult r = stream && !st ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p is not a "
                                        "live stream", stream) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS && st && st->capture) {
        capture_invalidate(stream_capture(st));
        r = refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call, "a synchronous call on a "
                   "capturing stream (the capture is invalidated)");
    }
    if (r == CUDA_SUCCESS)
        r = G.sticky;
    unlock();
    return r;
}

CUresult cuStreamQuery(CUhandle stream) { return stream_wait(stream, "cuStreamQuery"); }
CUresult cuStreamSynchronize(CUhandle stream) { return stream_wait(stream, "cuStreamSynchronize"); }

CUresult cuCtxSynchronize(void)
{
    lock();
    CUresult r = need_context("cuCtxSynchronize");
    for (int i = 0; r == CUDA_SUCCESS && i < MAX_CAPTURES; i++)
        if (G.captures[i].live) {
            capture_invalidate(&G.captures[i]);
            r = refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "cuCtxSynchronize", "a stream of "
                       "the context is capturing (the capture is invalidated)");
        }
    if (r == CUDA_SUCCESS)
        r = G.sticky;
    unlock();
    return r;
}

CUresult cuStreamBeginCapture_v2(CUhandle stream, int mode)
{
    const char *call = "cuStreamBeginCapture";
    lock();
    struct stream *st = stream_get(stream);
    CUresult r = need_context(call);
    int slot = 0;
    while (slot < MAX_CAPTURES && G.captures[slot].live)
        slot++;
    if (r == CUDA_SUCCESS && !stream)
        r = refuse(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call, "the legacy stream cannot capture");
    else if (r == CUDA_SUCCESS && !st)
        r = refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p is not a live stream", stream);
    else if (r == CUDA_SUCCESS && st->capture)
        r = refuse(CUDA_ERROR_ILLEGAL_STATE, call, "the stream is already capturing");
    else if (r == CUDA_SUCCESS && (mode < CAPTURE_GLOBAL || mode > CAPTURE_RELAXED))
        r = refuse(CUDA_ERROR_INVALID_VALUE, call, "capture mode %d", mode);
    else if (r == CUDA_SUCCESS && slot == MAX_CAPTURES)
        r = refuse(CUDA_ERROR_OUT_OF_MEMORY, call, "stub limit: %d captures", MAX_CAPTURES);
    if (r == CUDA_SUCCESS) {
        struct capture *c = &G.captures[slot];
        memset(c, 0, sizeof *c);
        c->live = 1, c->mode = mode, c->id = ++G.next_capture_id;
        c->origin = (int)(st - G.streams), c->thread = pthread_self();
        st->capture = slot + 1;
        free(st->front), st->front = NULL, st->nfront = 0;
    }
    unlock();
    return r;
}

CUresult cuStreamIsCapturing(CUhandle stream, int *status)
{
    lock();
    struct stream *st = stream_get(stream);
    CUresult r = st && status ? CUDA_SUCCESS
        : refuse(CUDA_ERROR_INVALID_HANDLE, "cuStreamIsCapturing", "stream %p", stream);
    if (r == CUDA_SUCCESS)   /* CU_STREAM_CAPTURE_STATUS_NONE / ACTIVE / INVALIDATED */
        *status = !st->capture ? 0 : stream_capture(st)->invalid ? 2 : 1;
    unlock();
    return r;
}

/* ---- events */
CUresult cuEventCreate(CUhandle *event, unsigned flags)
{
    lock();
    CUresult r = need_context("cuEventCreate");
    if (r == CUDA_SUCCESS && (!event || (flags & ~7u) || ((flags & EVENT_INTERPROCESS)
                                                          && !(flags & EVENT_DISABLE_TIMING))))
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuEventCreate", "flags %#x", flags);
    int i = r == CUDA_SUCCESS ? slot_new(H_EVENT, event) : -1;
    if (r == CUDA_SUCCESS && i < 0)
        r = refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuEventCreate", "stub limit: %d events", MAX_EVENTS);
    if (i >= 0)
        G.events[i].flags = flags;
    unlock();
    return r;
}

CUresult cuEventDestroy_v2(CUhandle event)
{
    lock();
    struct event *e = slot_get(H_EVENT, event);
    CUresult r = e ? CUDA_SUCCESS : refuse(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy",
                                           "event %p is not a live event", event);
    if (e)
        free(e->deps), e->deps = NULL, e->s.live = 0;
    unlock();
    return r;
}

CUresult cuEventRecord(CUhandle event, CUhandle stream)
{
    const char *call = "cuEventRecord";
    lock();
    struct event *e = slot_get(H_EVENT, event);
    struct stream *st = stream ? stream_get(stream) : NULL;
    struct capture *c = stream_capture(st);
    CUresult r = !e ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "event %p is not live", event)
               : stream && !st ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p", stream)
               : c && c->invalid ? refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, call,
                                          "the stream's capture was invalidated earlier")
               : G.sticky;
    if (r == CUDA_SUCCESS && c) {      /* the stream's frontier, for a wait to depend on */
        free(e->deps), e->deps = NULL, e->ndeps = 0;
        set_union(&e->deps, &e->ndeps, st->front, st->nfront);
        e->capture_id = c->id;
    } else if (r == CUDA_SUCCESS) {
        e->recorded = 1, e->capture_id = 0, e->t_ns = now_ns(CLOCK_MONOTONIC);
    }
    unlock();
    return r;
}

static CUresult wait_captured(struct stream *st, struct event *e, struct capture *ec,
                              const char *call)
{
    struct capture *sc = stream_capture(st);
    if (sc && sc != ec) {
        capture_invalidate(sc);
        return refuse(CUDA_ERROR_STREAM_CAPTURE_MERGE, call, "the event belongs to another "
                      "capture than the stream's (the capture is invalidated)");
    }
    if (!sc) {                          /* the stream joins the event's capture */
        st->capture = (int)(ec - G.captures) + 1;
        free(st->front), st->front = NULL, st->nfront = 0;
    }
    set_union(&st->front, &st->nfront, e->deps, e->ndeps);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUhandle stream, CUhandle event, unsigned flags)
{
    const char *call = "cuStreamWaitEvent";
    lock();
    struct event *e = slot_get(H_EVENT, event);
    struct stream *st = stream ? stream_get(stream) : NULL;
    struct capture *ec = e ? capture_by_id(e->capture_id) : NULL, *sc = stream_capture(st);
    CUresult r = !e ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "event %p is not live", event)
               : stream && !st ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "stream %p", stream)
               : flags > 1 ? refuse(CUDA_ERROR_INVALID_VALUE, call, "flags %u", flags)
               : sc && sc->invalid ? refuse(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, call,
                                            "the stream's capture was invalidated earlier")
               : G.sticky;
    if (r == CUDA_SUCCESS && ec && st) {
        r = wait_captured(st, e, ec, call);
    } else if (r == CUDA_SUCCESS && sc && e->recorded && e->capture_id == 0 && flags == 0) {
        capture_invalidate(sc);
        r = refuse(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, call, "a capturing stream waits on an "
                   "event recorded outside the capture: a dependency across its boundary (the "
                   "capture is invalidated)");
    }
    unlock();
    return r;
}

/* cuEventQuery / cuEventSynchronize: not on an event last recorded in a capture */
static CUresult event_wait(CUhandle event, const char *call)
{
    lock();
    struct event *e = slot_get(H_EVENT, event);
    struct capture *ec = e ? capture_by_id(e->capture_id) : NULL;
    CUresult r = !e ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "event %p is not live", event)
               : e->capture_id ? refuse(CUDA_ERROR_CAPTURED_EVENT, call, "the event was last "
                                        "recorded in a capture: it stands for no work")
               : G.sticky;
    if (ec && r == CUDA_ERROR_CAPTURED_EVENT)
        capture_invalidate(ec);
    unlock();
    return r;
}

CUresult cuEventQuery(CUhandle event) { return event_wait(event, "cuEventQuery"); }
CUresult cuEventSynchronize(CUhandle event) { return event_wait(event, "cuEventSynchronize"); }

CUresult cuEventElapsedTime_v2(float *ms, CUhandle start, CUhandle end)
{
    const char *call = "cuEventElapsedTime";
    lock();
    struct event *a = slot_get(H_EVENT, start), *b = slot_get(H_EVENT, end);
    CUresult r = !ms ? refuse(CUDA_ERROR_INVALID_VALUE, call, "null pointer")
               : !a || !b ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "an event is not live")
               : (a->flags | b->flags) & EVENT_DISABLE_TIMING
                 ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "%s event was created with "
                          "CU_EVENT_DISABLE_TIMING", a->flags & EVENT_DISABLE_TIMING ? "the start"
                          : "the end")
               : a->capture_id || b->capture_id
                 ? refuse(CUDA_ERROR_CAPTURED_EVENT, call, "an event was last recorded in a "
                          "capture")
               : !a->recorded || !b->recorded
                 ? refuse(CUDA_ERROR_INVALID_HANDLE, call, "the %s event was never recorded",
                          a->recorded ? "end" : "start")
               : G.sticky;
    if (r == CUDA_SUCCESS)
        *ms = (float)((double)((int64_t)(b->t_ns - a->t_ns)) / 1e6);
    unlock();
    return r;
}

CUresult cuEventElapsedTime(float *ms, CUhandle start, CUhandle end)
{
    return cuEventElapsedTime_v2(ms, start, end);
}
