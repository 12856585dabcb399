/* How an error travels from a backend up to the Python boundary: a code
 * that says which Python exception it becomes, and a formatted message.
 * Backends never touch Python; csrc/errors.c turns a status into an
 * exception. */
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

typedef enum gemsops_status_code {
    GEMSOPS_OK = 0,
    GEMSOPS_ERR_TYPE, /* -> TypeError    (wrong dtype or kind of object) */
    GEMSOPS_ERR_VALUE, /* -> ValueError   (shape, size, layout)           */
    GEMSOPS_ERR_INDEX, /* -> IndexError   (dimension out of range)         */
    GEMSOPS_ERR_RUNTIME, /* -> RuntimeError (CUDA failure, no backend)     */
} gemsops_status_code;

#define GEMSOPS_STATUS_MESSAGE_LEN 512

typedef struct gemsops_status {
    gemsops_status_code code;
    char message[GEMSOPS_STATUS_MESSAGE_LEN];
} gemsops_status;

/* Records code and a printf-style message; returns code so callers can
 * write `return gemsops_fail(st, GEMSOPS_ERR_VALUE, "...")`. */
int gemsops_fail(gemsops_status *st, gemsops_status_code code, const char *fmt,
                 ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
