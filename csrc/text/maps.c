/* The two lookups every tokenizer call leans on: token text -> id, and (left, right) -> merge.
 * Both are built once at load; lookups only read, so any number of threads may share them. */
#include <string.h>

#include "text/text_internal.h"

static inline uint64_t mix64(uint64_t x) {
    /* a 64-bit finalizer (splitmix64) */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t bubo_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = mix64(h ^ w);
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n); /* the tail, zero-padded; the length is already in h */
    return mix64(h ^ w);
}

int32_t bubo_strmap_get(const bubo_tokenizer *t, const char *s, size_t n) {
    const bubo_strmap *m = &t->token_to_id;
    uint64_t h = bubo_hash_bytes(s, n);
    uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & m->mask;; i = (i + 1) & m->mask) {
        bubo_strmap_slot slot = m->slots[i];
        if (slot.id < 0) return -1;
        if (slot.tag == tag && t->text_len[slot.id] == n && memcmp(t->text + t->text_off[slot.id], s, n) == 0) {
            return slot.id;
        }
    }
}
