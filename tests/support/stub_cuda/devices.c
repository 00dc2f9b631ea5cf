/* Several stub GPUs: how many, which ones a process sees, their UUIDs and PCI bus ids, and the
 * test-only hooks that make one of them faulty, die or hang.
 *
 *   COPPELIUS_STUB_DEVICES=N     N physical GPUs (default 1, at most MAX_STUB_DEVICES)
 *   CUDA_VISIBLE_DEVICES=2,0     which physical GPUs the process sees, in that order, as the
 *                                driver does (indices only; an unparsable entry ends the list)
 *   COPPELIUS_STUB_FAULTY=K[,K]  on physical GPU K every copy_f32 flips bit 0 of its first
 *                                output word: a silently corrupting kernel (README.md)
 *   COPPELIUS_STUB_DIE=K         the process SIGKILLs itself at its first update issue on GPU K
 *   COPPELIUS_STUB_HANG=K        ... sleeps forever there instead: a hung GPU
 *   COPPELIUS_STUB_FIRST_GPU=F   this machine's GPUs are physical GPUs F … F+N-1 of the stub's
 *                                fleet: the nodes of a test cluster on one host (each a slurmd)
 *                                then have GPUs of their own, never one UUID between them
 *
 * Physical GPU K has the UUID STUB_UUID_PREFIX followed by K (u32, big-endian) and the PCI bus
 * id 0000:BB:00.0 with BB = PCI_BUS_FIRST + PCI_BUS_STRIDE * K, so that every GPU is distinct
 * and a faulty one is named the same way whatever CUDA_VISIBLE_DEVICES says. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stub.h"

#define DEVICES_ENV "COPPELIUS_STUB_DEVICES"
#define VISIBLE_ENV "CUDA_VISIBLE_DEVICES"
#define FAULTY_ENV "COPPELIUS_STUB_FAULTY"
#define DIE_ENV "COPPELIUS_STUB_DIE"
#define HANG_ENV "COPPELIUS_STUB_HANG"
#define FIRST_ENV "COPPELIUS_STUB_FIRST_GPU"
#define STUB_UUID_PREFIX "coppelius-gp"     /* 12 bytes, then the physical index */
#define UUID_BYTES 16
#define PCI_BUS_FIRST 0x18
#define PCI_BUS_STRIDE 0x10
#define FIRST_UPDATE_SEQUENCE 2            /* issue 1 is the forward, issue 2 step 0's update */

static unsigned mask_of(const char *env)
{
    const char *v = getenv(env);
    unsigned mask = 0;
    while (v && *v) {
        char *end;
        long k = strtol(v, &end, 10);
        if (end == v)
            break;
        if (k >= 0 && k < MAX_STUB_DEVICES)
            mask |= 1u << k;
        v = *end == ',' ? end + 1 : end;
        if (*end != ',')
            break;
    }
    return mask;
}

void configure_devices(void)
{
    const char *n = getenv(DEVICES_ENV), *visible = getenv(VISIBLE_ENV);
    G.physical = n ? atoi(n) : 1;
    if (G.physical < 1 || G.physical > MAX_STUB_DEVICES)
        G.physical = 1;
    G.visible = 0;
    if (!visible) {
        for (int k = 0; k < G.physical; k++)
            G.visible_map[G.visible++] = k;
    } else {
        const char *v = visible;
        while (*v && G.visible < MAX_STUB_DEVICES) {
            char *end;
            long k = strtol(v, &end, 10);
            if (end == v || k < 0 || k >= G.physical)
                break;                      /* the driver stops at the first invalid entry */
            G.visible_map[G.visible++] = (int)k;
            if (*end != ',')
                break;
            v = end + 1;
        }
    }
    const char *first = getenv(FIRST_ENV);
    int base = first ? atoi(first) : 0;
    if (base < 0 || base + G.physical > MAX_STUB_DEVICES)
        base = 0;
    for (int i = 0; i < G.visible; i++)
        G.visible_map[i] += base;
    G.faulty_mask = mask_of(FAULTY_ENV);
    G.die_mask = mask_of(DIE_ENV);
    G.hang_mask = mask_of(HANG_ENV);
}

int physical_of(CUdevice dev)
{
    return dev >= 0 && dev < G.visible ? G.visible_map[dev] : -1;
}

typedef struct { char bytes[UUID_BYTES]; } CUuuid;

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CUresult r = need_device(dev, "cuDeviceGetUuid");
    if (r == CUDA_SUCCESS && !uuid)
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetUuid", "null pointer");
    if (r != CUDA_SUCCESS)
        return r;
    uint32_t k = (uint32_t)physical_of(dev);
    memcpy(uuid->bytes, STUB_UUID_PREFIX, UUID_BYTES - 4);
    for (int i = 0; i < 4; i++)
        uuid->bytes[UUID_BYTES - 1 - i] = (char)(k >> (8 * i));
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev)
{
    CUresult r = need_device(dev, "cuDeviceGetPCIBusId");
    if (r == CUDA_SUCCESS && (!bus || len <= 0))
        r = refuse(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetPCIBusId", "buffer %p, length %d",
                   (void *)bus, len);
    if (r == CUDA_SUCCESS)
        snprintf(bus, (size_t)len, "0000:%02x:00.0",
                 (PCI_BUS_FIRST + PCI_BUS_STRIDE * physical_of(dev)) & 0xFF);
    return r;
}

/* copy_f32's output on a faulty GPU: its first word with bit 0 flipped */
void corrupt_output(void *dst, size_t n)
{
    if (G.active < 0 || !(G.faulty_mask & (1u << G.active)) || n < sizeof(uint32_t))
        return;
    ((unsigned char *)dst)[0] ^= 1u;
    G.stats.corrupted++;
}

/* an issue's stage-in on a GPU set to die or hang */
void issue_hooks(uint32_t sequence)
{
    if (G.active < 0 || sequence < FIRST_UPDATE_SEQUENCE)
        return;
    if (G.die_mask & (1u << G.active))
        kill(getpid(), SIGKILL);
    if (G.hang_mask & (1u << G.active)) {
        unlock();                           /* other threads may still ask the stub */
        for (;;)
            pause();
    }
}
