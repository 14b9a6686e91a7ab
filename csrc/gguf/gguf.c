/* GGUF reader: mmap the file (or take a caller's buffer), parse the header, the metadata and the
 * tensor infos, and validate everything against the bytes that are really there.
 *
 * File layout (little-endian; versions 2 and 3 share it, v3 only added big-endian files):
 *
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv       x  ( string key | u32 value type | value )
 *   n_tensors  x  ( string name | u32 n_dims | u64 ne[n_dims] | u32 type | u64 offset )
 *   padding to general.alignment (default 32)
 *   data section: tensor i at data_offset + offset_i
 *
 *   string = u64 length | bytes;  array = u32 element type | u64 n | n values (untagged)
 *
 * The rule that keeps a hostile file harmless: every count, length and offset is compared with
 * the bytes left *before* it is used, and a count of elements at least k bytes wide must fit in
 * (bytes left) / k, so no allocation can exceed a small multiple of the file size. Nothing is
 * copied out of the map: strings and numeric arrays point into it. */
#define _POSIX_C_SOURCE 200809L

#include "bubo/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bubo/quants.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader loads little-endian fields with memcpy: little-endian hosts only"
#endif

#define GGUF_MAGIC "GGUF"
#define GGUF_HEADER_SIZE 24 /* magic, version, n_tensors, n_kv */

/* Smallest encodings, used to bound counts by the bytes left before allocating anything. */
#define MIN_KV_BYTES (8 + 4 + 1)         /* empty key, value type, a 1-byte value */
#define MIN_TENSOR_INFO_BYTES (8 + 4 + 4 + 8) /* empty name, n_dims = 0, type, offset */
#define MIN_STRING_BYTES 8               /* the length field */
#define MIN_ARRAY_BYTES (4 + 8)          /* element type, count */

/* Longest key or tensor name quoted in an error message. */
#define ERR_NAME_MAX 96

/* ---- the handle ------------------------------------------------------------------------ */

/* Parsed values of string and nested arrays, carved from chunks that live as long as the handle. */
typedef struct value_chunk value_chunk;
struct value_chunk {
    value_chunk *next;
    uint64_t cap, used;
    bubo_gguf_value items[];
};
#define VALUE_CHUNK_MIN 1024

struct bubo_gguf {
    const uint8_t *base; /* the whole file */
    uint64_t size;
    void *map;           /* mmap'd region (bubo_gguf_open), NULL for a caller's buffer */
    size_t map_len;

    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset; /* aligned end of the tensor infos; may exceed size when no tensor has bytes */

    uint64_t n_kv;
    bubo_gguf_kv *kv;                 /* (n_kv) in file order */
    const bubo_gguf_str **kv_sorted;  /* (n_kv) pointers to kv[i].key, sorted for lookup */

    uint64_t n_tensors;
    bubo_gguf_tensor *tensors;          /* (n_tensors) in file order */
    const bubo_gguf_str **tensor_sorted; /* (n_tensors) pointers to tensors[i].name, sorted */

    value_chunk *chunks;
};

/* ---- reading fields -------------------------------------------------------------------- */

typedef struct {
    const uint8_t *base;
    uint64_t size, pos;
    bubo_gguf *g;
    bubo_err *err;
    /* what is being read, for error messages: a key, or a tensor index */
    bubo_gguf_str key;
    int64_t tensor; /* -1 outside the tensor infos */
} parser;

/* Length of a name to quote; an unset name (data NULL) prints as empty. */
static int name_len(bubo_gguf_str s) {
    if (!s.data) return 0;
    return s.len > ERR_NAME_MAX ? ERR_NAME_MAX : (int)s.len;
}

/* Fill err with "<where>: <message>", where names the key or tensor being read. */
static bubo_status fail(parser *p, bubo_status st, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static bubo_status fail(parser *p, bubo_status st, uint64_t offset, const char *fmt, ...) {
    if (!p->err) return st;
    char what[BUBO_ERR_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (p->tensor >= 0)
        return bubo_set_err(p->err, st, "tensor %lld '%.*s': at byte %llu: %s", (long long)p->tensor,
                            name_len(p->key), p->key.data ? p->key.data : "", (unsigned long long)offset,
                            what);
    if (p->key.data)
        return bubo_set_err(p->err, st, "key '%.*s': at byte %llu: %s", name_len(p->key), p->key.data,
                            (unsigned long long)offset, what);
    return bubo_set_err(p->err, st, "at byte %llu: %s", (unsigned long long)offset, what);
}

static uint64_t left(const parser *p) { return p->size - p->pos; }

static bubo_status need(parser *p, uint64_t n, const char *field) {
    if (left(p) >= n) return BUBO_OK;
    return fail(p, BUBO_ERR_FORMAT, p->pos, "truncated: %s needs %llu bytes, the file has %llu left", field,
                (unsigned long long)n, (unsigned long long)left(p));
}

static uint32_t take_u32(parser *p) {
    uint32_t v;
    memcpy(&v, p->base + p->pos, 4);
    p->pos += 4;
    return v;
}
static uint64_t take_u64(parser *p) {
    uint64_t v;
    memcpy(&v, p->base + p->pos, 8);
    p->pos += 8;
    return v;
}

static bubo_status read_u32(parser *p, const char *field, uint32_t *out) {
    bubo_status st = need(p, 4, field);
    if (st) return st;
    *out = take_u32(p);
    return BUBO_OK;
}

static bubo_status read_u64(parser *p, const char *field, uint64_t *out) {
    bubo_status st = need(p, 8, field);
    if (st) return st;
    *out = take_u64(p);
    return BUBO_OK;
}

static bubo_status read_str(parser *p, const char *field, bubo_gguf_str *out) {
    uint64_t at = p->pos, len;
    bubo_status st = read_u64(p, field, &len);
    if (st) return st;
    if (len > left(p))
        return fail(p, BUBO_ERR_FORMAT, at, "%s length %llu exceeds the %llu bytes left in the file", field,
                    (unsigned long long)len, (unsigned long long)left(p));
    out->len = len;
    out->data = (const char *)p->base + p->pos;
    p->pos += len;
    return BUBO_OK;
}

/* ---- metadata values ------------------------------------------------------------------- */

static const char *value_type_name(uint32_t t) {
    static const char *names[] = {"uint8", "int8",  "uint16", "int16", "uint32", "int32",  "float32",
                                  "bool",  "string", "array", "uint64", "int64", "float64"};
    return t <= BUBO_GGUF_FLOAT64 ? names[t] : "unknown";
}

/* Bytes of one element of a fixed-width type; 0 for STRING and ARRAY. */
static uint64_t value_width(bubo_gguf_type t) {
    switch (t) {
    case BUBO_GGUF_UINT8: case BUBO_GGUF_INT8: case BUBO_GGUF_BOOL: return 1;
    case BUBO_GGUF_UINT16: case BUBO_GGUF_INT16: return 2;
    case BUBO_GGUF_UINT32: case BUBO_GGUF_INT32: case BUBO_GGUF_FLOAT32: return 4;
    case BUBO_GGUF_UINT64: case BUBO_GGUF_INT64: case BUBO_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Decode one little-endian fixed-width value of type t from b (value_width(t) bytes). */
static void decode_scalar(bubo_gguf_type t, const uint8_t *b, bubo_gguf_value *out) {
    uint16_t u16;
    uint32_t u32;
    float f32;
    out->type = t;
    switch (t) {
    case BUBO_GGUF_UINT8: out->v.u64 = b[0]; break;
    case BUBO_GGUF_INT8: out->v.i64 = (int8_t)b[0]; break;
    case BUBO_GGUF_BOOL: out->v.b = b[0] != 0; break;
    case BUBO_GGUF_UINT16: memcpy(&u16, b, 2); out->v.u64 = u16; break;
    case BUBO_GGUF_INT16: memcpy(&u16, b, 2); out->v.i64 = (int16_t)u16; break;
    case BUBO_GGUF_UINT32: memcpy(&u32, b, 4); out->v.u64 = u32; break;
    case BUBO_GGUF_INT32: memcpy(&u32, b, 4); out->v.i64 = (int32_t)u32; break;
    case BUBO_GGUF_FLOAT32: memcpy(&f32, b, 4); out->v.f64 = f32; break;
    case BUBO_GGUF_UINT64: memcpy(&out->v.u64, b, 8); break;
    case BUBO_GGUF_INT64: memcpy(&out->v.i64, b, 8); break;
    case BUBO_GGUF_FLOAT64: memcpy(&out->v.f64, b, 8); break;
    default: break;
    }
}

static bubo_gguf_value *alloc_values(bubo_gguf *g, uint64_t n) {
    value_chunk *c = g->chunks;
    if (!c || c->cap - c->used < n) {
        uint64_t cap = n > VALUE_CHUNK_MIN ? n : VALUE_CHUNK_MIN;
        /* n is bounded by the file size over MIN_STRING_BYTES, so this cannot overflow */
        c = malloc(sizeof *c + cap * sizeof(bubo_gguf_value));
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = g->chunks;
        g->chunks = c;
    }
    bubo_gguf_value *v = c->items + c->used;
    c->used += n;
    return v;
}

static bubo_status parse_value(parser *p, uint32_t type, bubo_gguf_value *out, int depth);

static bubo_status parse_array(parser *p, bubo_gguf_value *out, int depth) {
    uint64_t at = p->pos;
    if (depth >= BUBO_GGUF_MAX_ARRAY_DEPTH)
        return fail(p, BUBO_ERR_FORMAT, at, "arrays nested more than %d deep", BUBO_GGUF_MAX_ARRAY_DEPTH);
    uint32_t elem;
    uint64_t n;
    bubo_status st = read_u32(p, "array element type", &elem);
    if (st) return st;
    if (elem > BUBO_GGUF_FLOAT64)
        return fail(p, BUBO_ERR_FORMAT, at, "unknown array element type %u", elem);
    if ((st = read_u64(p, "array length", &n))) return st;
    out->v.arr.elem_type = (bubo_gguf_type)elem;
    out->v.arr.n = n;
    out->v.arr.data = NULL;
    out->v.arr.items = NULL;

    uint64_t w = value_width((bubo_gguf_type)elem);
    if (w) {
        if (n > left(p) / w)
            return fail(p, BUBO_ERR_FORMAT, at + 4,
                        "array of %llu %s elements needs %llu bytes each, the file has %llu left",
                        (unsigned long long)n, value_type_name(elem), (unsigned long long)w,
                        (unsigned long long)left(p));
        const uint8_t *data = p->base + p->pos;
        if (elem == BUBO_GGUF_BOOL)
            for (uint64_t j = 0; j < n; j++)
                if (data[j] > 1)
                    return fail(p, BUBO_ERR_FORMAT, p->pos + j, "bool array element %llu is %u, not 0 or 1",
                                (unsigned long long)j, data[j]);
        out->v.arr.data = data;
        p->pos += n * w;
        return BUBO_OK;
    }

    uint64_t min = elem == BUBO_GGUF_STRING ? MIN_STRING_BYTES : MIN_ARRAY_BYTES;
    if (n > left(p) / min)
        return fail(p, BUBO_ERR_FORMAT, at + 4,
                    "array of %llu %s elements needs at least %llu bytes each, the file has %llu left",
                    (unsigned long long)n, value_type_name(elem), (unsigned long long)min,
                    (unsigned long long)left(p));
    if (n == 0) return BUBO_OK;
    bubo_gguf_value *items = alloc_values(p->g, n);
    if (!items) return fail(p, BUBO_ERR_NOMEM, at, "out of memory for %llu array items", (unsigned long long)n);
    out->v.arr.items = items;
    for (uint64_t j = 0; j < n; j++)
        if ((st = parse_value(p, elem, &items[j], depth + 1))) return st;
    return BUBO_OK;
}

static bubo_status parse_value(parser *p, uint32_t type, bubo_gguf_value *out, int depth) {
    uint64_t at = p->pos;
    bubo_status st;
    if (type > BUBO_GGUF_FLOAT64) return fail(p, BUBO_ERR_FORMAT, at, "unknown value type %u", type);
    out->type = (bubo_gguf_type)type;
    if (type == BUBO_GGUF_STRING) return read_str(p, "string", &out->v.str);
    if (type == BUBO_GGUF_ARRAY) return parse_array(p, out, depth);

    uint64_t w = value_width((bubo_gguf_type)type);
    if ((st = need(p, w, value_type_name(type)))) return st;
    if (type == BUBO_GGUF_BOOL && p->base[p->pos] > 1)
        return fail(p, BUBO_ERR_FORMAT, at, "bool value is %u, not 0 or 1", p->base[p->pos]);
    decode_scalar((bubo_gguf_type)type, p->base + p->pos, out);
    p->pos += w;
    return BUBO_OK;
}

/* ---- sorted name index (lookup and duplicate detection) --------------------------------- */

/* The indexes hold pointers to the names, which are the first members of their records, so a
 * found name converts back to its record. */
_Static_assert(offsetof(bubo_gguf_kv, key) == 0, "kv key must come first");
_Static_assert(offsetof(bubo_gguf_tensor, name) == 0, "tensor name must come first");

static int str_cmp(bubo_gguf_str a, bubo_gguf_str b) {
    uint64_t n = a.len < b.len ? a.len : b.len;
    int c = n ? memcmp(a.data, b.data, n) : 0;
    if (c) return c;
    return (a.len > b.len) - (a.len < b.len);
}

static int str_ptr_cmp(const void *a, const void *b) {
    const bubo_gguf_str *x = *(const bubo_gguf_str *const *)a, *y = *(const bubo_gguf_str *const *)b;
    int c = str_cmp(*x, *y);
    if (c) return c;
    return (x > y) - (x < y); /* equal names keep file order, so errors name the first one first */
}

/* Binary search in a sorted index; NULL if absent. */
static const bubo_gguf_str *index_find(const bubo_gguf_str *const *sorted, uint64_t n, const char *name) {
    bubo_gguf_str want = {strlen(name), name};
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(*sorted[mid], want);
        if (c == 0) return sorted[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- tensor infos ---------------------------------------------------------------------- */

static bubo_status parse_tensor_info(parser *p, bubo_gguf_tensor *t) {
    uint64_t at = p->pos;
    bubo_status st = read_str(p, "tensor name", &t->name);
    if (st) return st;
    p->key = t->name;
    if ((st = read_u32(p, "n_dims", &t->n_dims))) return st;
    if (t->n_dims > BUBO_GGUF_MAX_DIMS)
        return fail(p, BUBO_ERR_FORMAT, at, "n_dims is %u, at most %d are allowed", t->n_dims, BUBO_GGUF_MAX_DIMS);
    for (int d = 0; d < BUBO_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((st = read_u64(p, "ne", &ne))) return st;
        if (ne > (uint64_t)INT64_MAX)
            return fail(p, BUBO_ERR_FORMAT, at, "ne[%u] is negative (%lld)", d, (long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if ((st = read_u32(p, "tensor type", &t->type))) return st;
    if (!bubo_type_get_traits((int)t->type))
        return fail(p, BUBO_ERR_FORMAT, at, "unknown tensor type id %u", t->type);
    return read_u64(p, "tensor offset", &t->offset);
}

/* Byte size of a tensor, overflow-checked. A zero-length dimension does not excuse the others:
 * the element count and the byte size with zeros counted as ones must fit in int64 too, so that
 * numpy can make the shape. */
static bubo_status tensor_extent(parser *p, uint64_t at, bubo_gguf_tensor *t) {
    const bubo_type_traits *tr = bubo_type_get_traits((int)t->type);
    if (t->ne[0] % tr->blck_size)
        return fail(p, BUBO_ERR_FORMAT, at, "ne[0] = %lld is not a multiple of the %s block size %lld",
                    (long long)t->ne[0], tr->name, (long long)tr->blck_size);
    int64_t elems = 1, nbytes = (int64_t)tr->type_size;
    int empty = 0;
    for (int d = 0; d < BUBO_GGUF_MAX_DIMS; d++) {
        int64_t ne = t->ne[d] ? t->ne[d] : 1;
        empty |= t->ne[d] == 0;
        if (__builtin_mul_overflow(elems, ne, &elems) ||
            __builtin_mul_overflow(nbytes, d == 0 ? ne / tr->blck_size : ne, &nbytes))
            return fail(p, BUBO_ERR_FORMAT, at, "shape [%lld, %lld, %lld, %lld] of type %s overflows 64 bits",
                        (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                        tr->name);
    }
    t->nbytes = empty ? 0 : (uint64_t)nbytes;
    return BUBO_OK;
}

static int tensor_by_offset(const void *a, const void *b) {
    const bubo_gguf_tensor *x = *(const bubo_gguf_tensor *const *)a, *y = *(const bubo_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return (x > y) - (x < y);
}

/* ---- the whole file -------------------------------------------------------------------- */

static bubo_status parse_header(parser *p, uint64_t *n_tensors, uint64_t *n_kv) {
    bubo_gguf *g = p->g;
    if (p->size < 4 || memcmp(p->base, GGUF_MAGIC, 4) != 0) {
        if (p->size == 0) return fail(p, BUBO_ERR_FORMAT, 0, "empty file (0 bytes), not a GGUF file");
        uint8_t m[4] = {0};
        memcpy(m, p->base, p->size < 4 ? p->size : 4);
        if (p->size < 4)
            return fail(p, BUBO_ERR_FORMAT, 0, "not a GGUF file: only %llu bytes", (unsigned long long)p->size);
        return fail(p, BUBO_ERR_FORMAT, 0, "not a GGUF file: starts with bytes %02x %02x %02x %02x, not 'GGUF'", m[0],
                    m[1], m[2], m[3]);
    }
    if (p->size < GGUF_HEADER_SIZE)
        return fail(p, BUBO_ERR_FORMAT, 0, "truncated header: the file has %llu bytes, a GGUF header needs %d",
                    (unsigned long long)p->size, GGUF_HEADER_SIZE);
    p->pos = 4;
    uint32_t v = take_u32(p);
    uint32_t swapped = __builtin_bswap32(v);
    if (v == 1)
        return fail(p, BUBO_ERR_UNSUPPORTED, 4,
                    "GGUF version 1 (32-bit counts) is not supported; bubo reads versions 2 and 3");
    if (v != 2 && v != 3) {
        if (swapped >= 1 && swapped <= 3)
            return fail(p, BUBO_ERR_UNSUPPORTED, 4,
                        "big-endian GGUF (version %u byte-swapped) is not supported; bubo reads little-endian files",
                        swapped);
        if (v == 0) return fail(p, BUBO_ERR_FORMAT, 4, "GGUF version is 0");
        return fail(p, BUBO_ERR_UNSUPPORTED, 4, "GGUF version %u is not supported; bubo reads versions 2 and 3", v);
    }
    g->version = v;
    *n_tensors = take_u64(p);
    *n_kv = take_u64(p);
    return BUBO_OK;
}

static bubo_status parse_kvs(parser *p, uint64_t n_kv) {
    bubo_gguf *g = p->g;
    bubo_status st;
    if (n_kv > left(p) / MIN_KV_BYTES)
        return fail(p, BUBO_ERR_FORMAT, 16, "n_kv is %llu but only %llu bytes follow (at least %d per key)",
                    (unsigned long long)n_kv, (unsigned long long)left(p), MIN_KV_BYTES);
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->kv_sorted = calloc(n_kv ? n_kv : 1, sizeof *g->kv_sorted);
    if (!g->kv || !g->kv_sorted)
        return fail(p, BUBO_ERR_NOMEM, 16, "out of memory for %llu keys", (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        bubo_gguf_kv *kv = &g->kv[i];
        uint64_t at = p->pos;
        p->key.data = NULL;
        if ((st = read_str(p, "key", &kv->key))) return st;
        p->key = kv->key;
        uint32_t type;
        if ((st = read_u32(p, "value type", &type))) return st;
        if (type > BUBO_GGUF_FLOAT64) return fail(p, BUBO_ERR_FORMAT, at, "unknown value type %u", type);
        if ((st = parse_value(p, type, &kv->value, 0))) return st;
        g->kv_sorted[i] = &kv->key;
        g->n_kv = i + 1;
    }
    p->key.data = NULL;
    qsort(g->kv_sorted, n_kv, sizeof *g->kv_sorted, str_ptr_cmp);
    for (uint64_t i = 1; i < n_kv; i++)
        if (str_cmp(*g->kv_sorted[i - 1], *g->kv_sorted[i]) == 0) {
            const bubo_gguf_kv *a = (const bubo_gguf_kv *)g->kv_sorted[i - 1];
            const bubo_gguf_kv *b = (const bubo_gguf_kv *)g->kv_sorted[i];
            p->key = a->key;
            return fail(p, BUBO_ERR_FORMAT, (uint64_t)((const uint8_t *)b->key.data - p->base) - 8,
                        "duplicate key (entries %lld and %lld)", (long long)(a - g->kv), (long long)(b - g->kv));
        }
    return BUBO_OK;
}

static bubo_status read_alignment(parser *p) {
    bubo_gguf *g = p->g;
    g->alignment = BUBO_GGUF_DEFAULT_ALIGNMENT;
    const bubo_gguf_value *v = bubo_gguf_get(g, "general.alignment");
    if (!v) return BUBO_OK;
    const bubo_gguf_kv *kv = (const bubo_gguf_kv *)((const char *)v - offsetof(bubo_gguf_kv, value));
    p->key = kv->key;
    uint64_t at = (uint64_t)((const uint8_t *)kv->key.data - p->base) - 8;
    if (v->type != BUBO_GGUF_UINT32)
        return fail(p, BUBO_ERR_FORMAT, at, "must be a uint32, not %s", value_type_name(v->type));
    if (v->v.u64 == 0 || (v->v.u64 & (v->v.u64 - 1)))
        return fail(p, BUBO_ERR_FORMAT, at, "%llu is not a nonzero power of two", (unsigned long long)v->v.u64);
    g->alignment = v->v.u64;
    p->key.data = NULL;
    return BUBO_OK;
}

static bubo_status parse_tensors(parser *p, uint64_t n_tensors) {
    bubo_gguf *g = p->g;
    bubo_status st;
    uint64_t infos_at = p->pos;
    if (n_tensors > left(p) / MIN_TENSOR_INFO_BYTES)
        return fail(p, BUBO_ERR_FORMAT, 8,
                    "n_tensors is %llu but only %llu bytes follow the metadata (at least %d per tensor)",
                    (unsigned long long)n_tensors, (unsigned long long)left(p), MIN_TENSOR_INFO_BYTES);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->tensor_sorted = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensor_sorted);
    uint64_t *info_at = calloc(n_tensors ? n_tensors : 1, sizeof *info_at);
    const bubo_gguf_tensor **by_offset = calloc(n_tensors ? n_tensors : 1, sizeof *by_offset);
    if (!g->tensors || !g->tensor_sorted || !info_at || !by_offset) {
        st = fail(p, BUBO_ERR_NOMEM, infos_at, "out of memory for %llu tensors", (unsigned long long)n_tensors);
        goto done;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        p->tensor = (int64_t)i;
        p->key.data = NULL;
        info_at[i] = p->pos;
        if ((st = parse_tensor_info(p, &g->tensors[i]))) goto done;
        g->tensor_sorted[i] = &g->tensors[i].name;
        g->n_tensors = i + 1;
    }
    p->tensor = -1;
    p->key.data = NULL;

    if ((st = read_alignment(p))) goto done;
    /* pos <= size < 2^63, so aligning up cannot wrap */
    g->data_offset = (p->pos + g->alignment - 1) & ~(g->alignment - 1);
    uint64_t data_size = g->data_offset < p->size ? p->size - g->data_offset : 0;

    for (uint64_t i = 0; i < n_tensors; i++) {
        bubo_gguf_tensor *t = &g->tensors[i];
        p->tensor = (int64_t)i;
        p->key = t->name;
        if ((st = tensor_extent(p, info_at[i], t))) goto done;
        if (t->offset % g->alignment) {
            st = fail(p, BUBO_ERR_FORMAT, info_at[i], "offset %llu is not a multiple of the alignment %llu",
                      (unsigned long long)t->offset, (unsigned long long)g->alignment);
            goto done;
        }
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            st = fail(p, BUBO_ERR_FORMAT, info_at[i],
                      "data [%llu, +%llu) runs past the end of the file (data section of %llu bytes at byte %llu)",
                      (unsigned long long)t->offset, (unsigned long long)t->nbytes, (unsigned long long)data_size,
                      (unsigned long long)g->data_offset);
            goto done;
        }
        uint64_t abs = g->data_offset + t->offset;
        t->data = p->base + (abs < p->size ? abs : p->size);
        by_offset[i] = t;
    }
    p->tensor = -1;
    p->key.data = NULL;

    qsort(g->tensor_sorted, n_tensors, sizeof *g->tensor_sorted, str_ptr_cmp);
    for (uint64_t i = 1; i < n_tensors; i++)
        if (str_cmp(*g->tensor_sorted[i - 1], *g->tensor_sorted[i]) == 0) {
            const bubo_gguf_tensor *a = (const bubo_gguf_tensor *)g->tensor_sorted[i - 1];
            const bubo_gguf_tensor *b = (const bubo_gguf_tensor *)g->tensor_sorted[i];
            st = bubo_set_err(p->err, BUBO_ERR_FORMAT, "duplicate tensor name '%.*s' (tensors %lld and %lld)",
                              name_len(a->name), a->name.data, (long long)(a - g->tensors),
                              (long long)(b - g->tensors));
            goto done;
        }

    qsort(by_offset, n_tensors, sizeof *by_offset, tensor_by_offset);
    const bubo_gguf_tensor *prev = NULL; /* the nonempty tensor reaching furthest so far */
    for (uint64_t i = 0; i < n_tensors; i++) {
        const bubo_gguf_tensor *t = by_offset[i];
        if (!t->nbytes) continue;
        if (prev && t->offset < prev->offset + prev->nbytes) {
            st = bubo_set_err(p->err, BUBO_ERR_FORMAT,
                              "tensor %lld '%.*s' data [%llu, +%llu) overlaps tensor %lld '%.*s' data [%llu, +%llu)",
                              (long long)(t - g->tensors), name_len(t->name), t->name.data,
                              (unsigned long long)t->offset, (unsigned long long)t->nbytes,
                              (long long)(prev - g->tensors), name_len(prev->name), prev->name.data,
                              (unsigned long long)prev->offset, (unsigned long long)prev->nbytes);
            goto done;
        }
        if (!prev || t->offset + t->nbytes > prev->offset + prev->nbytes) prev = t;
    }
    st = BUBO_OK;
done:
    free(info_at);
    free(by_offset);
    return st;
}

bubo_status bubo_gguf_open_buffer(const void *buf, uint64_t size, bubo_gguf **out, bubo_err *err) {
    if (!out) return bubo_set_err(err, BUBO_ERR_INVALID, "out is NULL");
    *out = NULL;
    if (!buf && size) return bubo_set_err(err, BUBO_ERR_INVALID, "buffer is NULL");
    if (size > (uint64_t)INT64_MAX)
        return bubo_set_err(err, BUBO_ERR_INVALID, "buffer size %llu too large", (unsigned long long)size);
    bubo_gguf *g = calloc(1, sizeof *g);
    if (!g) return bubo_set_err(err, BUBO_ERR_NOMEM, "out of memory");
    g->base = size ? buf : (const uint8_t *)"";
    g->size = size;
    parser p = {.base = g->base, .size = size, .pos = 0, .g = g, .err = err, .tensor = -1};
    uint64_t n_tensors = 0, n_kv = 0;
    bubo_status st = parse_header(&p, &n_tensors, &n_kv);
    if (!st) st = parse_kvs(&p, n_kv);
    if (!st) st = parse_tensors(&p, n_tensors);
    if (st) {
        bubo_gguf_close(g);
        return st;
    }
    *out = g;
    return BUBO_OK;
}

bubo_status bubo_gguf_open(const char *path, bubo_gguf **out, bubo_err *err) {
    if (!out) return bubo_set_err(err, BUBO_ERR_INVALID, "out is NULL");
    *out = NULL;
    if (!path) return bubo_set_err(err, BUBO_ERR_INVALID, "path is NULL");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return bubo_set_err(err, BUBO_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return bubo_set_err(err, BUBO_ERR_IO, "cannot stat: %s", strerror(e));
    }
    if (S_ISDIR(sb.st_mode)) {
        close(fd);
        return bubo_set_err(err, BUBO_ERR_IO, "is a directory, not a GGUF file");
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return bubo_set_err(err, BUBO_ERR_IO, "not a regular file");
    }
    if (sb.st_size == 0) {
        close(fd);
        return bubo_set_err(err, BUBO_ERR_FORMAT, "empty file (0 bytes), not a GGUF file");
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) return bubo_set_err(err, BUBO_ERR_IO, "cannot mmap %zu bytes: %s", len, strerror(e));
    bubo_status st = bubo_gguf_open_buffer(map, len, out, err);
    if (st) {
        munmap(map, len);
        return st;
    }
    (*out)->map = map;
    (*out)->map_len = len;
    return BUBO_OK;
}

void bubo_gguf_close(bubo_gguf *g) {
    if (!g) return;
    while (g->chunks) {
        value_chunk *next = g->chunks->next;
        free(g->chunks);
        g->chunks = next;
    }
    free(g->kv);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->tensor_sorted);
    if (g->map) munmap(g->map, g->map_len);
    free(g);
}

/* ---- accessors ------------------------------------------------------------------------- */

uint32_t bubo_gguf_version(const bubo_gguf *g) { return g->version; }
uint64_t bubo_gguf_alignment(const bubo_gguf *g) { return g->alignment; }
uint64_t bubo_gguf_data_offset(const bubo_gguf *g) { return g->data_offset; }
uint64_t bubo_gguf_file_size(const bubo_gguf *g) { return g->size; }
const uint8_t *bubo_gguf_base(const bubo_gguf *g) { return g->base; }

uint64_t bubo_gguf_n_kv(const bubo_gguf *g) { return g->n_kv; }
const bubo_gguf_kv *bubo_gguf_kv_at(const bubo_gguf *g, uint64_t i) { return i < g->n_kv ? &g->kv[i] : NULL; }

const bubo_gguf_value *bubo_gguf_get(const bubo_gguf *g, const char *key) {
    const bubo_gguf_str *k = index_find(g->kv_sorted, g->n_kv, key);
    return k ? &((const bubo_gguf_kv *)k)->value : NULL;
}

uint64_t bubo_gguf_n_tensors(const bubo_gguf *g) { return g->n_tensors; }
const bubo_gguf_tensor *bubo_gguf_tensor_at(const bubo_gguf *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}
const bubo_gguf_tensor *bubo_gguf_find_tensor(const bubo_gguf *g, const char *name) {
    return (const bubo_gguf_tensor *)index_find(g->tensor_sorted, g->n_tensors, name);
}

bubo_status bubo_gguf_check_supported(const bubo_gguf *g, bubo_err *err) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const bubo_gguf_tensor *t = &g->tensors[i];
        const bubo_type_traits *tr = bubo_type_get_traits((int)t->type);
        if (!tr->supported)
            return bubo_set_err(err, BUBO_ERR_UNSUPPORTED, "tensor '%.*s' has type %s, which bubo does not run",
                                name_len(t->name), t->name.data, tr->name);
    }
    return BUBO_OK;
}

/* Float to integer in C is undefined out of range (UBSan flags it): saturate, NaN -> 0. */
static uint64_t f64_to_u64(double x) {
    if (!(x > 0)) return 0;
    if (x >= 18446744073709551616.0) return UINT64_MAX;
    return (uint64_t)x;
}
static int64_t f64_to_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return INT64_MAX;
    if (x < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}

/* Decode element j of a numeric/bool array; 0 if arr is not one or j is out of range. */
static int arr_elem(const bubo_gguf_value *arr, uint64_t j, bubo_gguf_value *e) {
    if (!arr || arr->type != BUBO_GGUF_ARRAY || !arr->v.arr.data || j >= arr->v.arr.n) return 0;
    uint64_t w = value_width(arr->v.arr.elem_type);
    decode_scalar(arr->v.arr.elem_type, (const uint8_t *)arr->v.arr.data + j * w, e);
    return 1;
}

static int is_unsigned(bubo_gguf_type t) {
    return t == BUBO_GGUF_UINT8 || t == BUBO_GGUF_UINT16 || t == BUBO_GGUF_UINT32 || t == BUBO_GGUF_UINT64;
}
static int is_signed(bubo_gguf_type t) {
    return t == BUBO_GGUF_INT8 || t == BUBO_GGUF_INT16 || t == BUBO_GGUF_INT32 || t == BUBO_GGUF_INT64;
}

uint64_t bubo_gguf_arr_u64(const bubo_gguf_value *arr, uint64_t j) {
    bubo_gguf_value e;
    if (!arr_elem(arr, j, &e)) return 0;
    if (is_unsigned(e.type)) return e.v.u64;
    if (is_signed(e.type)) return (uint64_t)e.v.i64;
    if (e.type == BUBO_GGUF_BOOL) return (uint64_t)e.v.b;
    return f64_to_u64(e.v.f64);
}

int64_t bubo_gguf_arr_i64(const bubo_gguf_value *arr, uint64_t j) {
    bubo_gguf_value e;
    if (!arr_elem(arr, j, &e)) return 0;
    if (is_unsigned(e.type)) return (int64_t)e.v.u64;
    if (is_signed(e.type)) return e.v.i64;
    if (e.type == BUBO_GGUF_BOOL) return e.v.b;
    return f64_to_i64(e.v.f64);
}

double bubo_gguf_arr_f64(const bubo_gguf_value *arr, uint64_t j) {
    bubo_gguf_value e;
    if (!arr_elem(arr, j, &e)) return 0;
    if (is_unsigned(e.type)) return (double)e.v.u64;
    if (is_signed(e.type)) return (double)e.v.i64;
    if (e.type == BUBO_GGUF_BOOL) return e.v.b;
    return e.v.f64;
}

/* ---- convenience getters --------------------------------------------------------------- */

/* Integer getters accept any integer type whose value fits the output: writers disagree on
 * whether, say, a context length is u32 or i32 or u64. */
int bubo_gguf_get_u64(const bubo_gguf *g, const char *key, uint64_t *out) {
    const bubo_gguf_value *v = bubo_gguf_get(g, key);
    if (!v) return 0;
    if (is_unsigned(v->type)) { *out = v->v.u64; return 1; }
    if (is_signed(v->type) && v->v.i64 >= 0) { *out = (uint64_t)v->v.i64; return 1; }
    return 0;
}

int bubo_gguf_get_i64(const bubo_gguf *g, const char *key, int64_t *out) {
    const bubo_gguf_value *v = bubo_gguf_get(g, key);
    if (!v) return 0;
    if (is_signed(v->type)) { *out = v->v.i64; return 1; }
    if (is_unsigned(v->type) && v->v.u64 <= (uint64_t)INT64_MAX) { *out = (int64_t)v->v.u64; return 1; }
    return 0;
}

int bubo_gguf_get_f64(const bubo_gguf *g, const char *key, double *out) {
    const bubo_gguf_value *v = bubo_gguf_get(g, key);
    if (!v) return 0;
    if (v->type == BUBO_GGUF_FLOAT32 || v->type == BUBO_GGUF_FLOAT64) { *out = v->v.f64; return 1; }
    if (is_unsigned(v->type)) { *out = (double)v->v.u64; return 1; }
    if (is_signed(v->type)) { *out = (double)v->v.i64; return 1; }
    return 0;
}

int bubo_gguf_get_bool(const bubo_gguf *g, const char *key, int *out) {
    const bubo_gguf_value *v = bubo_gguf_get(g, key);
    if (!v || v->type != BUBO_GGUF_BOOL) return 0;
    *out = v->v.b;
    return 1;
}

int bubo_gguf_get_str(const bubo_gguf *g, const char *key, bubo_gguf_str *out) {
    const bubo_gguf_value *v = bubo_gguf_get(g, key);
    if (!v || v->type != BUBO_GGUF_STRING) return 0;
    *out = v->v.str;
    return 1;
}

int bubo_gguf_str_eq(bubo_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.data, c, n) == 0);
}
