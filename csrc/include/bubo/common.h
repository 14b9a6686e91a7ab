/* Status codes and the error message buffer shared by every bubo C object.
 *
 * Every fallible function returns a bubo_status and, on failure, fills a bubo_err that the
 * Cython layer turns into one Python exception type per status (pyx/status.pxi). */
#ifndef BUBO_COMMON_H
#define BUBO_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BUBO_OK = 0,
    BUBO_ERR_IO = 1,          /* open/stat/mmap failed: the OS said no */
    BUBO_ERR_FORMAT = 2,      /* malformed GGUF: bad magic, counts, offsets, lengths... */
    BUBO_ERR_UNSUPPORTED = 3, /* well-formed but not something bubo runs (version, block type, arch) */
    BUBO_ERR_NOMEM = 4,       /* an allocation failed */
    BUBO_ERR_INVALID = 5,     /* a caller passed a bad argument */
} bubo_status;

#define BUBO_ERR_MSG_LEN 512

typedef struct {
    char msg[BUBO_ERR_MSG_LEN];
} bubo_err;

/* Fill err (may be NULL) with a printf-style message and return status. */
bubo_status bubo_set_err(bubo_err *err, bubo_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
