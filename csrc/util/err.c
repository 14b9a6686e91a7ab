#include "bubo/common.h"

#include <stdarg.h>
#include <stdio.h>

bubo_status bubo_set_err(bubo_err *err, bubo_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}
