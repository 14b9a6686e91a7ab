# Mirrors csrc/include/bubo/gguf.h
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t

from common cimport bubo_status, bubo_err

cdef extern from "bubo/gguf.h" nogil:
    enum:
        BUBO_GGUF_MAX_DIMS
        BUBO_GGUF_DEFAULT_ALIGNMENT
        BUBO_GGUF_MAX_ARRAY_DEPTH

    ctypedef enum bubo_gguf_type:
        BUBO_GGUF_UINT8
        BUBO_GGUF_INT8
        BUBO_GGUF_UINT16
        BUBO_GGUF_INT16
        BUBO_GGUF_UINT32
        BUBO_GGUF_INT32
        BUBO_GGUF_FLOAT32
        BUBO_GGUF_BOOL
        BUBO_GGUF_STRING
        BUBO_GGUF_ARRAY
        BUBO_GGUF_UINT64
        BUBO_GGUF_INT64
        BUBO_GGUF_FLOAT64

    ctypedef struct bubo_gguf_str:
        uint64_t len
        const char *data

    ctypedef struct bubo_gguf_arr:
        bubo_gguf_type elem_type
        uint64_t n
        const void *data
        const bubo_gguf_value *items

    ctypedef union bubo_gguf_value_u:
        uint64_t u64
        int64_t i64
        double f64
        int b
        bubo_gguf_str str
        bubo_gguf_arr arr

    ctypedef struct bubo_gguf_value:
        bubo_gguf_type type
        bubo_gguf_value_u v

    ctypedef struct bubo_gguf_kv:
        bubo_gguf_str key
        bubo_gguf_value value

    ctypedef struct bubo_gguf_tensor:
        bubo_gguf_str name
        uint32_t n_dims
        int64_t ne[4]
        uint32_t type
        uint64_t offset
        uint64_t nbytes
        const void *data

    ctypedef struct bubo_gguf:
        pass

    bubo_status bubo_gguf_open(const char *path, bubo_gguf **out, bubo_err *err)
    bubo_status bubo_gguf_open_buffer(const void *buf, uint64_t size, bubo_gguf **out, bubo_err *err)
    void bubo_gguf_close(bubo_gguf *g)

    uint32_t bubo_gguf_version(const bubo_gguf *g)
    uint64_t bubo_gguf_alignment(const bubo_gguf *g)
    uint64_t bubo_gguf_data_offset(const bubo_gguf *g)
    uint64_t bubo_gguf_file_size(const bubo_gguf *g)
    const uint8_t *bubo_gguf_base(const bubo_gguf *g)

    uint64_t bubo_gguf_n_kv(const bubo_gguf *g)
    const bubo_gguf_kv *bubo_gguf_kv_at(const bubo_gguf *g, uint64_t i)
    const bubo_gguf_value *bubo_gguf_get(const bubo_gguf *g, const char *key)

    uint64_t bubo_gguf_n_tensors(const bubo_gguf *g)
    const bubo_gguf_tensor *bubo_gguf_tensor_at(const bubo_gguf *g, uint64_t i)
    const bubo_gguf_tensor *bubo_gguf_find_tensor(const bubo_gguf *g, const char *name)

    uint64_t bubo_gguf_arr_u64(const bubo_gguf_value *arr, uint64_t j)
    int64_t bubo_gguf_arr_i64(const bubo_gguf_value *arr, uint64_t j)
    double bubo_gguf_arr_f64(const bubo_gguf_value *arr, uint64_t j)

    int bubo_gguf_get_u64(const bubo_gguf *g, const char *key, uint64_t *out)
    int bubo_gguf_get_i64(const bubo_gguf *g, const char *key, int64_t *out)
    int bubo_gguf_get_f64(const bubo_gguf *g, const char *key, double *out)
    int bubo_gguf_get_bool(const bubo_gguf *g, const char *key, int *out)
    int bubo_gguf_get_str(const bubo_gguf *g, const char *key, bubo_gguf_str *out)
    int bubo_gguf_str_eq(bubo_gguf_str s, const char *c)

    bubo_status bubo_gguf_check_supported(const bubo_gguf *g, bubo_err *err)
