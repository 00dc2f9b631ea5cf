/* The executor hook: a process hands the stub functions that run its Triton launches on the CPU
 * (tools/cpu_cuda/stub_hook.py registers tools/cpu_cuda/executor.py through ctypes), so a cuda
 * run through the real cuda-bindings computes the model while streams, captures, graphs, events
 * and memory stay the stub's.  The module hook sees each loaded PTX image (the executor finds
 * its manifest entry by digest); the kernel hook runs one launch of a Triton entry — its module,
 * entry name, grid and the parameter bytes the stub copied at the launch or capture — and returns
 * its CUresult, with the executor's report (kernel, parameter, offset) for the violation line.
 * The hooks run under the stub's lock, on the thread that launched: they may call back only
 * coppelius_stub_region, which takes no lock.
 *
 * On a faulty GPU (COPPELIUS_STUB_FAULTY) with an executor, every launch of the Triton entry
 * COPPELIUS_STUB_FAULT_KERNEL (default FAULT_KERNEL_DEFAULT) during the issue of update step
 * COPPELIUS_STUB_FAULT_STEP (default 0) — the issue and its digest replay alike — flips bit 0 of
 * the first element it stores: a real kernel's output, silently wrong. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stub.h"

#define FAULT_KERNEL_ENV "COPPELIUS_STUB_FAULT_KERNEL"
#define FAULT_STEP_ENV "COPPELIUS_STUB_FAULT_STEP"
#define FAULT_KERNEL_DEFAULT "matmul_swiglu"   /* layer 0's SwiGLU product: the first MLP */
#define FIRST_UPDATE_SEQUENCE 2                /* issue 1 is the forward, issue 2 step 0's update */
#define REPORT_BYTES 1024

typedef int (*module_hook)(CUhandle module, const char *image, size_t n);
typedef int (*kernel_hook)(CUhandle module, const char *entry, const unsigned *grid,
                           const unsigned char *params, size_t nbytes, unsigned sequence,
                           int corrupt, char *report, size_t report_n);

static module_hook on_module;
static kernel_hook on_kernel;

/* exported for tools/cpu_cuda/stub_hook.py: null hooks detach the executor */
void coppelius_stub_set_executor(module_hook m, kernel_hook k)
{
    lock();
    on_module = m;
    on_kernel = k;
    unlock();
}

int executor_attached(void) { return on_kernel != NULL; }

void executor_module_loaded(CUhandle module, const char *image)
{
    if (on_module)
        on_module(module, image, strlen(image));
}

static int faulty_launch(const struct ptx_entry *e)
{
    if (G.active < 0 || !(G.faulty_mask & (1u << G.active)))
        return 0;
    const char *kernel = getenv(FAULT_KERNEL_ENV), *step = getenv(FAULT_STEP_ENV);
    unsigned sequence = FIRST_UPDATE_SEQUENCE + (step ? (unsigned)atoi(step) : 0);
    return strcmp(e->name, kernel && *kernel ? kernel : FAULT_KERNEL_DEFAULT) == 0
           && G.sequence == sequence;
}

/* one Triton launch run by the executor; a failure faults the device with its report */
CUresult executor_launch(const struct function *f, const struct node *nd, const char *call)
{
    char report[REPORT_BYTES] = "";
    int corrupt = faulty_launch(f->entry);
    CUresult r = on_kernel(f->module, f->entry->name, nd->grid, nd->params, nd->n, G.sequence,
                           corrupt, report, sizeof report);
    G.stats.executed++;
    G.stats.corrupted += corrupt && r == CUDA_SUCCESS;
    if (r != CUDA_SUCCESS)
        return fault(r, call, "%s", report[0] ? report : "the executor failed the launch");
    return CUDA_SUCCESS;
}
