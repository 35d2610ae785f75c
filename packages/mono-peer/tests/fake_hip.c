/* A stand-in for libamdhip64 with the same C signatures, backed by host memory, so the
 * hip backend's ctypes bindings (out-pointers, the 64-byte handle passed by value, flags)
 * are exercised on a machine without ROCm. "IPC" here only works within one process. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char reserved[64]; } hipIpcMemHandle_t;
enum { hipSuccess = 0, hipErrorInvalidValue = 1, hipErrorInvalidDevicePointer = 17 };
static const char MAGIC[8] = "fakehip";
static int device = -1;
static void *live[64];

static int known(void *p) {
    for (int i = 0; i < 64; i++) if (live[i] == p && p) return 1;
    return 0;
}
int hipSetDevice(int d) { device = d; return d == 0 ? hipSuccess : hipErrorInvalidValue; }
int hipExtMallocWithFlags(void **ptr, size_t n, unsigned int flags) {
    if (flags != 0x3 || device != 0) return hipErrorInvalidValue;  /* uncached only */
    *ptr = malloc(n);
    memset(*ptr, 0xff, n);  /* the backend must zero it */
    for (int i = 0; i < 64; i++) if (!live[i]) { live[i] = *ptr; break; }
    return hipSuccess;
}
int hipMemset(void *p, int v, size_t n) {
    if (!known(p)) return hipErrorInvalidDevicePointer;
    memset(p, v, n);
    return hipSuccess;
}
int hipDeviceSynchronize(void) { return hipSuccess; }
int hipIpcGetMemHandle(hipIpcMemHandle_t *h, void *p) {
    if (!known(p)) return hipErrorInvalidDevicePointer;
    memset(h->reserved, 0, 64);
    memcpy(h->reserved, MAGIC, 8);
    memcpy(h->reserved + 56, &p, sizeof p);
    return hipSuccess;
}
int hipIpcOpenMemHandle(void **p, hipIpcMemHandle_t h, unsigned int flags) {
    if (flags != 0x1 || memcmp(h.reserved, MAGIC, 8) != 0) return hipErrorInvalidValue;
    memcpy(p, h.reserved + 56, sizeof *p);
    return hipSuccess;
}
int hipIpcCloseMemHandle(void *p) { return known(p) ? hipSuccess : hipErrorInvalidDevicePointer; }
int hipFree(void *p) {
    for (int i = 0; i < 64; i++) if (live[i] == p && p) { live[i] = 0; free(p); return hipSuccess; }
    return hipErrorInvalidDevicePointer;
}
const char *hipGetErrorName(int e) {
    return e == hipErrorInvalidValue ? "hipErrorInvalidValue"
         : e == hipErrorInvalidDevicePointer ? "hipErrorInvalidDevicePointer" : "hipErrorUnknown";
}
