/* GGUF reader: mmap the file, validate every count, length, offset and extent against the file
 * size before use, and expose the metadata as a value tree and the tensors as (name, type,
 * shape, offset). Strings point into the map (not NUL-terminated); the handle owns the map. */
#ifndef BUBO_GGUF_H
#define BUBO_GGUF_H

#include <stdint.h>

#include "bubo/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define BUBO_GGUF_MAX_DIMS 4
#define BUBO_GGUF_DEFAULT_ALIGNMENT 32
/* Arrays nested deeper than this (an array of arrays of ... ) are refused as malformed. */
#define BUBO_GGUF_MAX_ARRAY_DEPTH 8

typedef enum {
    BUBO_GGUF_UINT8 = 0,
    BUBO_GGUF_INT8 = 1,
    BUBO_GGUF_UINT16 = 2,
    BUBO_GGUF_INT16 = 3,
    BUBO_GGUF_UINT32 = 4,
    BUBO_GGUF_INT32 = 5,
    BUBO_GGUF_FLOAT32 = 6,
    BUBO_GGUF_BOOL = 7,
    BUBO_GGUF_STRING = 8,
    BUBO_GGUF_ARRAY = 9,
    BUBO_GGUF_UINT64 = 10,
    BUBO_GGUF_INT64 = 11,
    BUBO_GGUF_FLOAT64 = 12,
} bubo_gguf_type;

typedef struct {
    uint64_t len;
    const char *data; /* into the map; not NUL-terminated */
} bubo_gguf_str;

typedef struct bubo_gguf_value bubo_gguf_value;
struct bubo_gguf_value {
    bubo_gguf_type type;
    union {
        uint64_t u64;    /* UINT8/16/32/64 */
        int64_t i64;     /* INT8/16/32/64 */
        double f64;      /* FLOAT32/64 */
        int b;           /* BOOL */
        bubo_gguf_str str; /* STRING */
        struct {
            bubo_gguf_type elem_type;
            uint64_t n;
            const void *data;              /* numeric/bool elements: packed little-endian, in the map */
            const bubo_gguf_value *items;  /* STRING or ARRAY elements: n parsed values */
        } arr;
    } v;
};

typedef struct {
    bubo_gguf_str key;
    bubo_gguf_value value;
} bubo_gguf_kv;

typedef struct {
    bubo_gguf_str name;
    uint32_t n_dims;
    int64_t ne[BUBO_GGUF_MAX_DIMS]; /* elements per dimension, ne[0] fastest; unused dims are 1 */
    uint32_t type;                  /* bubo_type id */
    uint64_t offset;                /* from the start of the data section */
    uint64_t nbytes;                /* extent in the file */
    const void *data;               /* into the map */
} bubo_gguf_tensor;

typedef struct bubo_gguf bubo_gguf;

/* Open and validate a file. Tensors of types bubo does not run are fine here (the model loader
 * refuses them by name); type ids GGUF does not define are a BUBO_ERR_FORMAT. */
bubo_status bubo_gguf_open(const char *path, bubo_gguf **out, bubo_err *err);
/* Parse a caller-owned buffer (fuzzing, tests); buf must outlive the handle. */
bubo_status bubo_gguf_open_buffer(const void *buf, uint64_t size, bubo_gguf **out, bubo_err *err);
void bubo_gguf_close(bubo_gguf *g);

uint32_t bubo_gguf_version(const bubo_gguf *g);
uint64_t bubo_gguf_alignment(const bubo_gguf *g);
uint64_t bubo_gguf_data_offset(const bubo_gguf *g); /* file offset of the data section */
uint64_t bubo_gguf_file_size(const bubo_gguf *g);
const uint8_t *bubo_gguf_base(const bubo_gguf *g);  /* the whole file */

uint64_t bubo_gguf_n_kv(const bubo_gguf *g);
const bubo_gguf_kv *bubo_gguf_kv_at(const bubo_gguf *g, uint64_t i);
/* NULL if absent. */
const bubo_gguf_value *bubo_gguf_get(const bubo_gguf *g, const char *key);

uint64_t bubo_gguf_n_tensors(const bubo_gguf *g);
const bubo_gguf_tensor *bubo_gguf_tensor_at(const bubo_gguf *g, uint64_t i);
const bubo_gguf_tensor *bubo_gguf_find_tensor(const bubo_gguf *g, const char *name);

/* Numeric element j of a numeric/bool array value as u64/i64/f64 (converted as in C). */
uint64_t bubo_gguf_arr_u64(const bubo_gguf_value *arr, uint64_t j);
int64_t bubo_gguf_arr_i64(const bubo_gguf_value *arr, uint64_t j);
double bubo_gguf_arr_f64(const bubo_gguf_value *arr, uint64_t j);

/* Convenience getters: 1 if the key exists with a compatible type, 0 otherwise. */
int bubo_gguf_get_u64(const bubo_gguf *g, const char *key, uint64_t *out);
int bubo_gguf_get_i64(const bubo_gguf *g, const char *key, int64_t *out);
int bubo_gguf_get_f64(const bubo_gguf *g, const char *key, double *out);
int bubo_gguf_get_bool(const bubo_gguf *g, const char *key, int *out);
int bubo_gguf_get_str(const bubo_gguf *g, const char *key, bubo_gguf_str *out);
/* 1 if s equals the NUL-terminated c. */
int bubo_gguf_str_eq(bubo_gguf_str s, const char *c);

/* BUBO_ERR_UNSUPPORTED naming the first tensor whose type bubo has no kernels for (its traits'
 * `supported` is 0), e.g. "tensor 'blk.0.attn_q.weight' has type iq2_xxs, which bubo does not run". */
bubo_status bubo_gguf_check_supported(const bubo_gguf *g, bubo_err *err);

#ifdef __cplusplus
}
#endif
#endif
