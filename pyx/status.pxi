# The one place C status codes become Python exceptions. Include (not cimport) it in each module:
#   include "status.pxi"
from bubo.errors import GGUFError, UnsupportedError, BuboError

cdef int check_status(int status, bubo_err *err, object what) except -1:
    """Raise the exception for a failed bubo_status; `what` (a path, a name) prefixes the message."""
    if status == BUBO_OK:
        return 0
    msg = err.msg.decode("utf-8", "replace") if err != NULL else ""
    if what is not None:
        msg = f"{what}: {msg}"
    if status == BUBO_ERR_IO:
        raise GGUFError(msg)
    if status == BUBO_ERR_FORMAT:
        raise GGUFError(msg)
    if status == BUBO_ERR_UNSUPPORTED:
        raise UnsupportedError(msg)
    if status == BUBO_ERR_NOMEM:
        raise MemoryError(msg)
    if status == BUBO_ERR_INVALID:
        raise ValueError(msg)
    raise BuboError(f"unknown status {status}: {msg}")
