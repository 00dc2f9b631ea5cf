/* Modules: PTX "JIT-loaded" (parsed and checked as the driver's JIT would refuse it), the JIT's
 * logs written into the caller's buffers, functions and their attributes. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub.h"

#define ERROR_BYTES 512
#define ELF_MAGIC "\177ELF"
#define FATBIN_MAGIC 0xBA55ED50u

struct jit_logs { char *info, *error; size_t info_n, error_n; void **info_slot, **error_slot;
                  int verbose; };

static void jit_options(unsigned n, const int *options, void **values, struct jit_logs *j)
{
    memset(j, 0, sizeof *j);
    for (unsigned i = 0; i < n; i++) {
        uintptr_t v = (uintptr_t)values[i];
        switch (options[i]) {
        case JIT_INFO_LOG: j->info = (char *)values[i]; break;
        case JIT_INFO_LOG_SIZE: j->info_n = (size_t)v; j->info_slot = &values[i]; break;
        case JIT_ERROR_LOG: j->error = (char *)values[i]; break;
        case JIT_ERROR_LOG_SIZE: j->error_n = (size_t)v; j->error_slot = &values[i]; break;
        case JIT_LOG_VERBOSE: j->verbose = v != 0; break;
        default: break;
        }
    }
}

/* into a caller's log buffer, NUL-terminated and truncated to its size; the size option's value
 * becomes the bytes written, as the driver reports them */
static void write_log(char *buf, size_t cap, void **slot, const char *text)
{
    if (!buf || cap == 0)
        return;
    size_t n = strlen(text);
    if (n > cap - 1)
        n = cap - 1;
    memcpy(buf, text, n);
    buf[n] = 0;
    if (slot)
        *slot = (void *)(uintptr_t)(n + 1);
}

static char *info_log(const struct ptx_module *m, int verbose)
{
    size_t cap = 256 + (size_t)m->nentries * 512, len = 0;
    char *out = malloc(cap);
    out[0] = 0;
    if (!verbose)
        return out;
    len += (size_t)snprintf(out + len, cap - len, "ptxas info    : 0 bytes gmem\n");
    for (int i = 0; i < m->nentries; i++) {
        const struct ptx_entry *e = &m->entries[i];
        len += (size_t)snprintf(out + len, cap - len,
            "ptxas info    : Compiling entry function '%s' for '%s'\n"
            "ptxas info    : Function properties for %s\n"
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            "ptxas info    : Used %d registers, used 1 barriers, %zu bytes smem, "
            "%zu bytes cmem[0]\n",
            e->name, m->target, e->name, e->maxnreg && e->maxnreg < STUB_REGISTERS ? e->maxnreg
            : STUB_REGISTERS, e->static_shared, (size_t)(0x210 + 8 * e->nparams));
    }
    return out;
}

/* the JIT's refusal of a parsed module, or 0 */
static CUresult refusal(const struct ptx_module *m, char *err, size_t n)
{
    int cc = 10 * G.cc_major + G.cc_minor, isa = ptx_supported_isa(G.driver_version);
    if (m->isa > isa) {
        snprintf(err, n, "ptxas application ptx input, line 1; fatal   : Unsupported .version "
                 "%d.%d; current version is '%d.%d'", m->isa / 10, m->isa % 10, isa / 10, isa % 10);
        return CUDA_ERROR_UNSUPPORTED_PTX_VERSION;
    }
    if (m->sm > cc || (m->arch_specific == 1 && m->sm != cc)
        || (m->arch_specific == 2 && m->sm / 10 != G.cc_major)) {
        snprintf(err, n, "ptxas fatal   : .target %s cannot be compiled for this sm_%d device",
                 m->target, cc);
        return CUDA_ERROR_INVALID_PTX;
    }
    return CUDA_SUCCESS;
}

static CUresult make_module(struct ptx_module *ptx, CUhandle *out)
{
    CUhandle h;
    int i = slot_new(H_MODULE, &h);
    if (i < 0)
        return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuModuleLoadDataEx", "stub limit: %d modules",
                      MAX_MODULES);
    struct module *mod = &G.modules[i];
    mod->ptx = *ptx;
    mod->funcs = calloc((size_t)ptx->nentries + 1, sizeof *mod->funcs);
    for (int k = 0; k < ptx->nentries; k++) {
        CUhandle f;
        int j = slot_new(H_FUNCTION, &f);
        if (j < 0)
            return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuModuleLoadDataEx",
                          "stub limit: %d functions", MAX_FUNCTIONS);
        struct function *fn = &G.functions[j];
        fn->module = h;
        fn->entry = &mod->ptx.entries[k];
        fn->max_dynamic = STATIC_SHARED_LIMIT - (int)fn->entry->static_shared;
        fn->carveout = -1;
        mod->funcs[k] = f;
    }
    *out = h;
    return CUDA_SUCCESS;
}

static CUresult load(CUhandle *module, const char *image, struct jit_logs *j)
{
    const char *call = "cuModuleLoadDataEx";
    char err[ERROR_BYTES];
    struct ptx_module ptx;
    uint32_t magic = 0;
    if (strnlen(image, sizeof magic) == sizeof magic)    /* PTX text, or a 4-byte binary magic */
        memcpy(&magic, image, sizeof magic);
    if (memcmp(&magic, ELF_MAGIC, sizeof magic) == 0 || magic == FATBIN_MAGIC)
        return refuse(CUDA_ERROR_NOT_SUPPORTED, call, "a cubin / fatbin image: the stub loads PTX "
                      "only");
    if (ptx_parse(image, &ptx, err, sizeof err) != 0) {
        write_log(j->error, j->error_n, j->error_slot, err);
        return refuse(CUDA_ERROR_INVALID_PTX, call, "%s", err);
    }
    CUresult r = refusal(&ptx, err, sizeof err);
    if (r != CUDA_SUCCESS) {
        ptx_free(&ptx);
        write_log(j->error, j->error_n, j->error_slot, err);
        return refuse(r, call, "%s", err);
    }
    char *info = info_log(&ptx, j->verbose);
    write_log(j->info, j->info_n, j->info_slot, info);
    write_log(j->error, j->error_n, j->error_slot, "");
    free(info);
    r = make_module(&ptx, module);
    if (r == CUDA_SUCCESS)
        executor_module_loaded(*module, image);
    return r;
}

CUresult cuModuleLoadDataEx(CUhandle *module, const void *image, unsigned n, int *options,
                            void **values)
{
    const char *call = "cuModuleLoadDataEx";
    struct jit_logs j;
    lock();
    CUresult r = need_context(call);
    if (r == CUDA_SUCCESS && G.sticky)
        r = G.sticky;
    if (r == CUDA_SUCCESS && (!module || !image || (n && (!options || !values))))
        r = refuse(CUDA_ERROR_INVALID_VALUE, call, "module %p, image %p, %u options at %p / %p",
                   (void *)module, image, n, (void *)options, (void *)values);
    if (r == CUDA_SUCCESS) {
        jit_options(n, options, values, &j);
        r = load(module, image, &j);
    }
    unlock();
    return r;
}

CUresult cuModuleGetFunction(CUhandle *func, CUhandle module, const char *name)
{
    const char *call = "cuModuleGetFunction";
    lock();
    CUresult r = need_context(call);
    struct module *m = slot_get(H_MODULE, module);
    if (r == CUDA_SUCCESS && !m)
        r = refuse(CUDA_ERROR_INVALID_HANDLE, call, "module %p is not loaded", module);
    if (r == CUDA_SUCCESS && (!func || !name))
        r = refuse(CUDA_ERROR_INVALID_VALUE, call, "null pointer");
    int k = 0;
    while (r == CUDA_SUCCESS && k < m->ptx.nentries && strcmp(m->ptx.entries[k].name, name) != 0)
        k++;
    if (r == CUDA_SUCCESS && k == m->ptx.nentries)
        r = refuse(CUDA_ERROR_NOT_FOUND, call, "no .entry %s in the module", name);
    if (r == CUDA_SUCCESS)
        *func = m->funcs[k];
    unlock();
    return r;
}

CUresult cuModuleUnload(CUhandle module)
{
    lock();
    struct module *m = slot_get(H_MODULE, module);
    CUresult r = m ? CUDA_SUCCESS : refuse(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload",
                                           "module %p is not loaded", module);
    if (m) {
        for (int k = 0; k < m->ptx.nentries; k++)
            slot_free(H_FUNCTION, m->funcs[k]);
        free(m->funcs);
        ptx_free(&m->ptx);
        m->s.live = 0;
    }
    unlock();
    return r;
}

static unsigned threads_allowed(const struct ptx_entry *e)
{
    if (e->has_reqntid)
        return e->reqntid[0] * e->reqntid[1] * e->reqntid[2];
    if (e->has_maxntid)
        return e->maxntid[0] * e->maxntid[1] * e->maxntid[2];
    return MAX_BLOCK_THREADS;
}

static int function_attribute(const struct function *f, int attr, int *ok)
{
    const struct ptx_entry *e = f->entry;
    const struct module *m = slot_get(H_MODULE, f->module);
    *ok = 1;
    switch (attr) {
    case FUNC_MAX_THREADS: return (int)threads_allowed(e);
    case FUNC_SHARED_SIZE: return (int)e->static_shared;
    case FUNC_CONST_SIZE: case FUNC_LOCAL_SIZE: case FUNC_CACHE_MODE_CA: return 0;
    case FUNC_NUM_REGS: return e->maxnreg && e->maxnreg < STUB_REGISTERS ? e->maxnreg
                               : STUB_REGISTERS;
    case FUNC_PTX_VERSION: return m ? m->ptx.isa : 0;
    case FUNC_BINARY_VERSION: return 10 * G.cc_major + G.cc_minor;
    case FUNC_MAX_DYNAMIC_SHARED: return f->max_dynamic;
    case FUNC_CARVEOUT: return f->carveout;
    default: *ok = attr > 0 && attr < FUNC_ATTRIBUTE_MAX;
             return 0;
    }
}

CUresult cuFuncGetAttribute(int *value, int attr, CUhandle func)
{
    lock();
    struct function *f = slot_get(H_FUNCTION, func);
    int ok = 0, v = f ? function_attribute(f, attr, &ok) : 0;
    CUresult r = !f ? refuse(CUDA_ERROR_INVALID_HANDLE, "cuFuncGetAttribute",
                             "function %p is not loaded", func)
               : !value || !ok ? refuse(CUDA_ERROR_INVALID_VALUE, "cuFuncGetAttribute",
                                        "attribute %d", attr)
               : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS)
        *value = v;
    unlock();
    return r;
}

CUresult cuFuncSetAttribute(CUhandle func, int attr, int value)
{
    const char *call = "cuFuncSetAttribute";
    lock();
    struct function *f = slot_get(H_FUNCTION, func);
    CUresult r = f ? CUDA_SUCCESS : refuse(CUDA_ERROR_INVALID_HANDLE, call,
                                           "function %p is not loaded", func);
    int limit = f ? G.shared_optin - (int)f->entry->static_shared : 0;
    if (r == CUDA_SUCCESS && attr == FUNC_MAX_DYNAMIC_SHARED) {
        if (value < 0 || value > limit)
            r = refuse(CUDA_ERROR_INVALID_VALUE, call, "%s: MAX_DYNAMIC_SHARED_SIZE_BYTES %d is "
                       "beyond the device's opt-in %d less %zu static bytes", f->entry->name,
                       value, G.shared_optin, f->entry->static_shared);
        else
            f->max_dynamic = value;
    } else if (r == CUDA_SUCCESS && attr == FUNC_CARVEOUT) {
        if (value < -1 || value > 100)
            r = refuse(CUDA_ERROR_INVALID_VALUE, call, "carveout %d", value);
        else
            f->carveout = value;
    } else if (r == CUDA_SUCCESS && !(attr >= 10 && attr < FUNC_ATTRIBUTE_MAX)) {
        r = refuse(CUDA_ERROR_INVALID_VALUE, call, "attribute %d cannot be set", attr);
    }
    unlock();
    return r;
}
