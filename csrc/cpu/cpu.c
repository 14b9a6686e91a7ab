/* CPU feature detection: cpuid + xgetbv on x86-64, NEON is baseline on arm64. Detection runs
 * once; the kernel tables are filled from its answer, so hot loops never test features. */
#include "bubo/cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

/* AMD Zen 4 (family 19h, models 10h-1Fh and 60h-AFh): there a streamed prepacked matrix reads
 * faster when each piece is prefetched as the tile comes to it than at the tiles' tuned distances
 * (benchmarks/tile_bench.c, Q6_K [151936, 1536] x 1 token from memory, 2 threads, AVX2 tile:
 * 5.8-6.8 ms, against 12.3-14.8 ms 8 KiB ahead and 20-22 ms with no prefetch; a decode step of
 * qwen2.5-coder:1.5b at the AVX2 level about 1.6x as fast, at AVX-512 1.0-1.2x). */
static int zen4(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541 /* "Auth" */ || !__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const unsigned family = ((a >> 8) & 0xF) + ((a >> 20) & 0xFF), model = ((a >> 4) & 0xF) | ((a >> 12) & 0xF0);
    return family == 0x19 && ((model >= 0x10 && model <= 0x1F) || (model >= 0x60 && model <= 0xAF));
}

static unsigned long long read_xcr0(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static int detect(bubo_isa isa) {
    unsigned int a, b, c, d;
    if (isa == BUBO_ISA_SCALAR) return 1;
    if (isa == BUBO_ISA_NEON) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !avx) return 0;
    unsigned long long xcr0 = read_xcr0();
    if ((xcr0 & 0x6) != 0x6) return 0; /* the OS saves XMM and YMM state */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int avx2 = (b >> 5) & 1;
    int has_avx2 = avx2 && fma && f16c;
    if (isa == BUBO_ISA_AVX2) return has_avx2;
    /* AVX512 level */
    int f = (b >> 16) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1, vnni = (c >> 11) & 1;
    if ((xcr0 & 0xe6) != 0xe6) return 0; /* opmask, ZMM_Hi256 and Hi16_ZMM state */
    return has_avx2 && f && bw && vl && vnni;
}
#else
static int zen4(void) { return 0; }

static int detect(bubo_isa isa) {
    if (isa == BUBO_ISA_SCALAR) return 1;
#if defined(__aarch64__)
    if (isa == BUBO_ISA_NEON) return 1;
#endif
    return 0;
}
#endif

static int cached[BUBO_ISA_COUNT] = {-1, -1, -1, -1};

int bubo_cpu_supports(bubo_isa isa) {
    if ((unsigned)isa >= BUBO_ISA_COUNT) return 0;
    if (cached[isa] < 0) cached[isa] = detect(isa);
    return cached[isa];
}

const char *bubo_isa_name(bubo_isa isa) {
    switch (isa) {
    case BUBO_ISA_SCALAR: return "scalar";
    case BUBO_ISA_AVX2: return "avx2";
    case BUBO_ISA_AVX512: return "avx512";
    case BUBO_ISA_NEON: return "neon";
    default: return "?";
    }
}

static bubo_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

void bubo_config_reload(void) {
    static const bubo_isa levels[] = {BUBO_ISA_SCALAR, BUBO_ISA_AVX2, BUBO_ISA_AVX512, BUBO_ISA_NEON};
    const char *force = getenv("BUBO_FORCE_ISA");
    const char *no_prepack = getenv("BUBO_NO_PREPACK");
    const char *ahead = getenv("BUBO_PREFETCH_AHEAD");
    config.force_isa = -1;
    for (int i = 0; force && i < 4; i++)
        if (strcmp(force, bubo_isa_name(levels[i])) == 0) config.force_isa = (int)levels[i];
    config.no_prepack = no_prepack && *no_prepack && strcmp(no_prepack, "0") != 0;
    config.prefetch_ahead = ahead && *ahead ? strcmp(ahead, "0") != 0 : !zen4();
}

const bubo_config *bubo_config_get(void) {
    pthread_once(&config_once, bubo_config_reload);
    return &config;
}

bubo_isa bubo_cpu_best_isa(void) {
    static const bubo_isa order[] = {BUBO_ISA_AVX512, BUBO_ISA_AVX2, BUBO_ISA_NEON, BUBO_ISA_SCALAR};
    const int force = bubo_config_get()->force_isa;
    int cap = 0; /* index into order from which we may pick */
    for (int i = 0; i < 4; i++)
        if ((int)order[i] == force) cap = i;
    for (int i = cap; i < 4; i++)
        if (bubo_cpu_supports(order[i])) return order[i];
    return BUBO_ISA_SCALAR;
}
