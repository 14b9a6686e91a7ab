/* A random walk over the paged KV cache with its prefix cache, built with AddressSanitizer and
 * UBSan by tests/native/test_kv_prefix.py. Every token's K and V rows carry a signature of the
 * whole token sequence up to it (a running hash), so after each operation every row a sequence
 * holds must carry the signature of that sequence's own tokens: an attach of a wrong block, a write
 * into a shared or cached one, or a block reused while held all show up as a wrong signature.
 * bubo_kv_check_invariants checks the bookkeeping after each operation too. Prints "ok". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bubo/kv.h"

enum { N_SEQ = 3, BLOCK = 4, N_CTX = 24 * BLOCK, N_LAYER = 2, N_EMBD = 32, N_STEPS = 20000, MAX_APPEND = 9 };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rnd(uint32_t n) { /* xorshift64*, uniform enough for a walk */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 33) % n;
}

static int32_t toks[N_SEQ][N_CTX];
static int32_t stems[3][3 * BLOCK];

static uint32_t signature(const int32_t *t, int32_t pos) {
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i <= pos; i++) h = (h ^ (uint32_t)t[i]) * 16777619u;
    return h;
}

static void fail(const char *what, int step, int seq, int pos) {
    printf("step %d: %s (seq %d, pos %d)\n", step, what, seq, pos);
    exit(1);
}

static void write_rows(bubo_kv *kv, int seq, int32_t from, int32_t to) {
    for (int32_t pos = from; pos < to; pos++) {
        const uint32_t sig = signature(toks[seq], pos);
        for (int il = 0; il < N_LAYER; il++) {
            memcpy(bubo_kv_k_head(kv, il, seq, pos, 0), &sig, sizeof sig);
            memcpy(bubo_kv_v_head(kv, il, seq, pos, 0), &sig, sizeof sig);
        }
    }
}

static void check_rows(bubo_kv *kv, int step) {
    bubo_err err;
    if (bubo_kv_check_invariants(kv, &err)) {
        printf("step %d: %s\n", step, err.msg);
        exit(1);
    }
    for (int s = 0; s < N_SEQ; s++)
        for (int32_t pos = 0; pos < bubo_kv_seq_len(kv, s); pos++) {
            const uint32_t sig = signature(toks[s], pos);
            for (int il = 0; il < N_LAYER; il++)
                if (memcmp(bubo_kv_k_head(kv, il, s, pos, 0), &sig, sizeof sig) ||
                    memcmp(bubo_kv_v_head(kv, il, s, pos, 0), &sig, sizeof sig))
                    fail("row signature differs", step, s, pos);
        }
}

/* Append toks[seq][len .. len+n) in one batch and write its rows; 0 when the pool is full. */
static int append(bubo_kv *kv, int seq, int32_t n, int step) {
    int32_t ids[MAX_APPEND], pos[MAX_APPEND];
    const int32_t len = bubo_kv_seq_len(kv, seq);
    for (int32_t i = 0; i < n; i++) ids[i] = seq, pos[i] = len + i;
    bubo_err err;
    const int32_t used = bubo_kv_pool_n_used(kv, 0);
    if (bubo_kv_append_batch(kv, n, ids, pos, &err)) {
        if (!strstr(err.msg, "context full") || bubo_kv_seq_len(kv, seq) != len || bubo_kv_pool_n_used(kv, 0) != used)
            fail(err.msg, step, seq, len);
        return 0;
    }
    write_rows(kv, seq, len, len + n);
    if (bubo_kv_prefix_register(kv, seq, toks[seq], len + n, &err)) fail(err.msg, step, seq, len);
    return 1;
}

int main(void) {
    bubo_kv_params p = {0};
    p.n_layer = N_LAYER;
    p.n_embd_k = p.n_embd_v = N_EMBD;
    p.head_dim_k = p.head_dim_v = N_EMBD;
    p.n_ctx = N_CTX;
    p.n_seq_max = N_SEQ;
    p.block_size = BLOCK;
    p.type = BUBO_TYPE_F32;
    bubo_kv *kv;
    bubo_err err;
    if (bubo_kv_create(&p, &kv, &err)) {
        printf("%s\n", err.msg);
        return 1;
    }
    const int32_t alphabet[3] = {5, 6, 7};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3 * BLOCK; j++) stems[i][j] = (int32_t)rnd(4);
    const uint64_t masks[3] = {~0ull, 0, 3};
    int64_t attached = 0;
    for (int step = 0; step < N_STEPS; step++) {
        const int s = (int)rnd(N_SEQ);
        const int32_t len = bubo_kv_seq_len(kv, s);
        const uint32_t op = rnd(100);
        if (op < 30) { /* a request: attach its cached prefix, append the rest */
            bubo_kv_clear(kv, s, NULL);
            const int stem = (int)rnd(3);
            int32_t n = 1 + (int32_t)rnd(3 * BLOCK);
            memcpy(toks[s], stems[stem], n * sizeof(int32_t));
            for (int32_t extra = 1 + (int32_t)rnd(2 * BLOCK); extra > 0; extra--) toks[s][n++] = alphabet[rnd(3)];
            const int32_t k = bubo_kv_prefix_attach(kv, s, toks[s], n - 1);
            if (k < 0 || k % BLOCK || k > n - 1 || bubo_kv_seq_len(kv, s) != k) fail("bad attach", step, s, k);
            attached += k;
            check_rows(kv, step);
            for (int32_t at = k; at < n;) {
                const int32_t piece = n - at < MAX_APPEND ? n - at : 1 + (int32_t)rnd(MAX_APPEND);
                if (!append(kv, s, piece, step)) {
                    bubo_kv_clear(kv, s, NULL);
                    break;
                }
                at += piece;
            }
        } else if (op < 60 && len > 0) { /* generate a few tokens */
            int32_t n = 1 + (int32_t)rnd(MAX_APPEND);
            if (n > N_CTX - len) n = N_CTX - len;
            for (int32_t i = 0; i < n; i++) toks[s][len + i] = alphabet[rnd(3)];
            if (n > 0) append(kv, s, n, step);
        } else if (op < 75) {
            if (bubo_kv_truncate(kv, s, (int32_t)rnd((uint32_t)len + 1), &err)) fail(err.msg, step, s, len);
        } else if (op < 85) {
            const int d = (int)rnd(N_SEQ);
            if (bubo_kv_fork(kv, s, d, &err)) fail(err.msg, step, s, d);
            memcpy(toks[d], toks[s], sizeof toks[s]);
        } else if (op < 98) {
            bubo_kv_clear(kv, s, NULL);
        } else if (op < 99) {
            bubo_kv_prefix_clear(kv);
        } else {
            bubo_kv_prefix_set_hash_mask(kv, masks[rnd(3)]);
        }
        check_rows(kv, step);
    }
    bubo_kv_prefix_stats st;
    bubo_kv_prefix_get_stats(kv, &st);
    if (attached < 1000 || st.n_evicted < 100) {
        printf("the walk shared too little: %lld tokens attached, %lld blocks evicted\n", (long long)attached,
               (long long)st.n_evicted);
        return 1;
    }
    bubo_kv_free(kv);
    printf("ok\n");
    return 0;
}
