/* UTF-8 helpers, GPT-2's byte-level alphabet, scratch vectors. */
#include <stdlib.h>

#include "text/text_internal.h"

// ---------------------------------------------------------------------------------------------
// UTF-8

uint32_t bubo_utf8_decode_llama(const uint8_t *s, size_t n, size_t *i) {
    /* Mirrors unicode_cpt_from_utf8 + the U+FFFD fallback of unicode_cpts_from_utf8: only the
     * bit patterns are checked, so overlong forms and encoded surrogates decode as written. */
    size_t k = *i;
    uint8_t c = s[k];
    if (!(c & 0x80)) {
        *i = k + 1;
        return c;
    }
    if ((c & 0x40) && !(c & 0x20)) {
        if (k + 1 < n && (s[k + 1] & 0xC0) == 0x80) {
            *i = k + 2;
            return ((uint32_t)(c & 0x1F) << 6) | (s[k + 1] & 0x3F);
        }
    } else if ((c & 0x40) && !(c & 0x10)) {
        if (k + 2 < n && (s[k + 1] & 0xC0) == 0x80 && (s[k + 2] & 0xC0) == 0x80) {
            *i = k + 3;
            return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[k + 1] & 0x3F) << 6) | (s[k + 2] & 0x3F);
        }
    } else if ((c & 0x40) && !(c & 0x08)) {
        if (k + 3 < n && (s[k + 1] & 0xC0) == 0x80 && (s[k + 2] & 0xC0) == 0x80 && (s[k + 3] & 0xC0) == 0x80) {
            uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[k + 1] & 0x3F) << 12) |
                          ((uint32_t)(s[k + 2] & 0x3F) << 6) | (s[k + 3] & 0x3F);
            /* llama.cpp throws on re-encoding a code point past U+10FFFF (leads F5..F7); we
             * treat the sequence as invalid instead. */
            if (cp < BUBO_MAX_CODEPOINT) {
                *i = k + 4;
                return cp;
            }
        }
    }
    *i = k + 1;
    return BUBO_REPLACEMENT_CHAR;
}

size_t bubo_utf8_encode(uint32_t cp, uint8_t *out) {
    if (cp <= 0x7F) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp <= 0x7FF) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp <= 0xFFFF) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | (cp >> 18));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

enum { UTF8_VALID, UTF8_INVALID, UTF8_INCOMPLETE };

/* Strict UTF-8 (Unicode Table 3-7). *used: the sequence length when valid, the maximal invalid
 * subpart when invalid, the bytes present when incomplete. */
static int utf8_check(const uint8_t *s, size_t n, size_t *used) {
    uint8_t c = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c < 0x80) {
        *used = 1;
        return UTF8_VALID;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *used = 1;
        return UTF8_INVALID;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n) {
            *used = k;
            return UTF8_INCOMPLETE;
        }
        uint8_t b = s[k];
        int ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
        if (!ok) {
            *used = k;
            return UTF8_INVALID;
        }
    }
    *used = need;
    return UTF8_VALID;
}

size_t bubo_utf8_complete_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t used;
        if (utf8_check(s + i, n - i, &used) == UTF8_INCOMPLETE) break;
        i += used;
    }
    return i;
}

size_t bubo_utf8_sanitize(const uint8_t *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t used;
        if (utf8_check(s + i, n - i, &used) == UTF8_VALID) {
            for (size_t k = 0; k < used; k++) out[o++] = s[i + k];
        } else {
            o += bubo_utf8_encode(BUBO_REPLACEMENT_CHAR, out + o);
        }
        i += used;
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves, the other 68 bytes
// (controls, space, DEL, NBSP, soft hyphen...) are moved, in order, to U+0100 and up.

static int byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t bubo_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++) n += !byte_is_printable(x);
    return 256 + n;
}

int bubo_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable(cp) ? (int)cp : -1;
    uint32_t n = 256;
    for (unsigned x = 0; x < 256; x++) {
        if (!byte_is_printable(x)) {
            if (n == cp) return (int)x;
            n++;
        }
    }
    return -1;
}

// ---------------------------------------------------------------------------------------------
// Scratch vectors

int bubo_u32vec_reserve(bubo_u32vec *a, size_t cap) {
    if (cap <= a->cap) return 1;
    uint32_t *v = realloc(a->v, cap * sizeof *v);
    if (!v) return 0;
    a->v = v;
    a->cap = cap;
    return 1;
}

void bubo_u32vec_free(bubo_u32vec *a) {
    free(a->v);
    a->v = NULL;
    a->n = a->cap = 0;
}
