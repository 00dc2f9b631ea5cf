/* The Coppelius stub libcuda.so.1: types, limits, state and the functions its files share.
 *
 * README.md beside this file says what the stub checks, what it executes and why; every number
 * the driver API fixes (CUresult codes, attribute ids, struct layouts) is named here once. */
#ifndef COPPELIUS_STUB_H
#define COPPELIUS_STUB_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUhandle;         /* every opaque handle: a tagged integer (handles in core.c) */

/* ---- CUresult codes (cuda.h) */
enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200, CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_PTX = 218, CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_ILLEGAL_STATE = 401, CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600, CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716, CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, CUDA_ERROR_STREAM_CAPTURE_MERGE = 902,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903, CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_CAPTURED_EVENT = 907, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
};

/* ---- enums and flags the host passes */
enum { CAPTURE_GLOBAL = 0, CAPTURE_THREAD_LOCAL = 1, CAPTURE_RELAXED = 2 };
enum { EVENT_BLOCKING_SYNC = 1, EVENT_DISABLE_TIMING = 2, EVENT_INTERPROCESS = 4 };
enum { STREAM_NON_BLOCKING = 1 };
enum { HOSTALLOC_PORTABLE = 1, HOSTALLOC_DEVICEMAP = 2, HOSTALLOC_WRITECOMBINED = 4 };
enum { LAUNCH_ATTR_PROGRAMMATIC_SERIALIZATION = 6, LAUNCH_ATTR_PRIORITY = 8 };
enum { JIT_INFO_LOG = 3, JIT_INFO_LOG_SIZE = 4, JIT_ERROR_LOG = 5, JIT_ERROR_LOG_SIZE = 6,
       JIT_LOG_VERBOSE = 12 };
enum { FUNC_MAX_THREADS = 0, FUNC_SHARED_SIZE = 1, FUNC_CONST_SIZE = 2, FUNC_LOCAL_SIZE = 3,
       FUNC_NUM_REGS = 4, FUNC_PTX_VERSION = 5, FUNC_BINARY_VERSION = 6, FUNC_CACHE_MODE_CA = 7,
       FUNC_MAX_DYNAMIC_SHARED = 8, FUNC_CARVEOUT = 9, FUNC_ATTRIBUTE_MAX = 18 };
enum { GRAPH_INSTANTIATE_FLAGS_ALL = 15,    /* auto free, upload, device launch, priority */
       GRAPH_INSTANTIATE_USE_NODE_PRIORITY = 8 };
enum { GRAPH_NODE_KERNEL = 0, GRAPH_NODE_MEMCPY = 1, GRAPH_NODE_MEMSET = 2 };  /* CUgraphNodeType */
enum { PROC_DEFAULT = 0, PROC_LEGACY_STREAM = 1, PROC_PER_THREAD_STREAM = 2 };
enum { PROC_SUCCESS = 0, PROC_SYMBOL_NOT_FOUND = 1, PROC_VERSION_NOT_SUFFICIENT = 2 };

/* ---- the stub device (H200-like unless COPPELIUS_STUB_CC names another) */
#define STUB_DRIVER_VERSION 13000
#define STATIC_SHARED_LIMIT (48 * 1024)  /* dynamic shared memory beyond this needs the opt-in */
#define MAX_BLOCK_THREADS 1024
#define MAX_GRID_X 2147483647u
#define MAX_GRID_YZ 65535u
#define STUB_REGISTERS 64               /* reported per function: the stub runs no ptxas */
#define TRITON_HIDDEN_PARAMS 2          /* Triton's trailing scratch pointers: null allowed */
#define STUB_PRIORITY_LEAST 0           /* stream priorities: the default, the lowest priority */
#define STUB_PRIORITY_GREATEST (-5)     /* an assumption, not read off an H200 (stream.c) */
#define MAX_STUB_DEVICES 16             /* COPPELIUS_STUB_DEVICES at most (devices.c) */

/* device address = host address + alias: a host pointer used as a device pointer (and a device
 * pointer used as a host one) is outside every allocation; host addresses are below 2^47 */
#define DEVICE_ALIAS 0x1000000000000000ull   /* cuMemAlloc memory */
#define MAPPED_ALIAS 0x2000000000000000ull   /* cuMemHostAlloc(DEVICEMAP) memory */

/* ---- handle tables */
enum { H_CONTEXT = 1, H_MODULE, H_FUNCTION, H_STREAM, H_EVENT, H_GRAPH, H_EXEC, H_KINDS };
#define MAX_MODULES 256
#define MAX_FUNCTIONS 2048
#define MAX_STREAMS 256
#define MAX_EVENTS 8192
#define MAX_GRAPHS 1024
#define MAX_CAPTURES 16

struct slot { int live; uint32_t gen; };    /* first member of every table entry */

struct ptx_param { size_t size; unsigned align; int is_ptr; };
struct ptx_entry {
    char name[256];             /* a PTX token's bytes at most (ptx.c TOKEN_BYTES) */
    int nparams;
    struct ptx_param *params;
    unsigned reqntid[3], maxntid[3];
    int has_reqntid, has_maxntid, maxnreg;
    int waits;                  /* the body has griddepcontrol.wait */
    size_t static_shared;
    int triton;                 /* emitted by Triton: its trailing scratch pointers may be null */
};
struct ptx_module {
    int isa;                    /* .version major*10 + minor */
    int sm;                     /* .target sm_XY: XY */
    int arch_specific;          /* sm_XYa / sm_XYf */
    char target[32];
    int nentries;
    struct ptx_entry *entries;
};

/* one captured (or enqueued) operation */
enum { NODE_KERNEL = 1, NODE_COPY, NODE_SET };
enum { COPY_HTOD = 1, COPY_DTOH, COPY_DTOD };
struct node {
    int kind, programmatic, ndeps;
    int priority;               /* kernel: its capture stream's, as the driver copies it */
    int *deps;
    CUhandle func;              /* kernel: the function; params holds its values' bytes */
    unsigned grid[3], block[3], shared;
    unsigned char *params;
    int dir;                    /* copy */
    CUdeviceptr dst, src;       /* device side(s) */
    void *host;                 /* host side of a HtoD / DtoH copy */
    size_t n;
    unsigned char value;        /* memset */
};
struct nodes { struct node *v; int n, cap; };

struct module { struct slot s; struct ptx_module ptx; CUhandle *funcs; };
struct function { struct slot s; CUhandle module; const struct ptx_entry *entry;
                  int max_dynamic, carveout; };
struct stream { struct slot s; unsigned flags; int priority, capture; int *front; int nfront; };
struct event { struct slot s; unsigned flags; int recorded; uint64_t t_ns;
               unsigned capture_id; int *deps; int ndeps; };
struct graph { struct slot s; struct nodes nodes; unsigned long long flags; };
struct capture {
    int live, mode, origin, invalid;
    unsigned id;
    pthread_t thread;
    struct nodes nodes;
};

struct stub {
    pthread_mutex_t lock;
    int initialized, cc_major, cc_minor, shared_optin, driver_version, ctx_refs;
    int physical, visible, visible_map[MAX_STUB_DEVICES];   /* devices.c */
    int active;                 /* the physical GPU whose primary context is held; -1 none */
    unsigned faulty_mask, die_mask, hang_mask;
    uint32_t ctx_gen;
    char name[64];
    CUresult sticky;            /* a fault: every later call that touches the device returns it */
    uint32_t sequence;          /* the doorbell's value at the last stage-in: the issue running */
    unsigned next_capture_id;
    struct module modules[MAX_MODULES];
    struct function functions[MAX_FUNCTIONS];
    struct stream streams[MAX_STREAMS];
    struct event events[MAX_EVENTS];
    struct graph graphs[MAX_GRAPHS], execs[MAX_GRAPHS];
    struct capture captures[MAX_CAPTURES];
    struct { unsigned long launches, captured, programmatic, graph_launches, released, staged,
             copied_kernels, copies, copy_bytes, memsets, violations, priority_nodes,
             node_priority_graphs, corrupted, executed; } stats;
};
extern struct stub G;

/* core.c */
void lock(void);
void unlock(void);
const char *error_name(CUresult code);
CUresult refuse(CUresult code, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
CUresult fault(CUresult code, const char *call, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
CUresult need_context(const char *call);
uint64_t now_ns(int clock);
void *handle_table(int kind, size_t *elem, int *cap);
int slot_new(int kind, CUhandle *out);
void *slot_get(int kind, CUhandle h);
void slot_free(int kind, CUhandle h);
CUhandle handle_of(int kind, int index);

/* memory.c */
void context_destroy(void);
void *device_range(CUdeviceptr d, size_t n);
int is_device_address(CUdeviceptr d);
int host_readable(const void *p, size_t n);
int alloc_contains(CUdeviceptr d);
CUresult run_copy_node(const struct node *nd, const char *call);

/* stream.c */
struct stream *stream_get(CUhandle h);
struct capture *stream_capture(const struct stream *s);
CUresult capture_guard(const char *call);
void capture_invalidate(struct capture *c);
CUresult capture_add(struct stream *st, struct node *nd, const char *call);
void capture_release(struct capture *c);
int set_union(int **set, int *n, const int *add, int nadd);

/* graph.c */
void nodes_push(struct nodes *ns, const struct node *nd);
void nodes_free(struct nodes *ns);
void node_clear(struct node *nd);

/* devices.c */
void configure_devices(void);
int physical_of(CUdevice dev);
CUresult need_device(CUdevice dev, const char *call);
void corrupt_output(void *dst, size_t n);
void issue_hooks(uint32_t sequence);

/* launch.c */
CUresult run_kernel_node(const struct node *nd, const char *call);

/* execute.c */
int executor_attached(void);
void executor_module_loaded(CUhandle module, const char *image);
CUresult executor_launch(const struct function *f, const struct node *nd, const char *call);

/* ptx.c */
int ptx_parse(const char *text, struct ptx_module *out, char *err, size_t errlen);
void ptx_free(struct ptx_module *m);
int ptx_supported_isa(int driver_version);

#endif
