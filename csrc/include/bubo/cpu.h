/* CPU feature detection and the instruction-set levels the kernel tables are indexed by. */
#ifndef BUBO_CPU_H
#define BUBO_CPU_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    BUBO_ISA_SCALAR = 0, /* portable C, the reference every SIMD variant is tested against */
    BUBO_ISA_AVX2 = 1,   /* x86-64: AVX2 + FMA + F16C */
    BUBO_ISA_AVX512 = 2, /* x86-64: AVX-512 F/BW/VL/VNNI (+ AVX2 level) */
    BUBO_ISA_NEON = 3,   /* arm64: Advanced SIMD (+ dotprod where the compiler targets it) */
    BUBO_ISA_COUNT = 4
} bubo_isa;

/* Whether this CPU (and OS, for AVX state) can run kernels of the given level. */
int bubo_cpu_supports(bubo_isa isa);
/* The best level this CPU runs; BUBO_FORCE_ISA=scalar|avx2|avx512|neon (bubo_config) caps it. */
bubo_isa bubo_cpu_best_isa(void);
const char *bubo_isa_name(bubo_isa isa);

/* What bubo takes from the environment, read in one place (csrc/cpu/cpu.c) when first asked for:
 * BUBO_FORCE_ISA caps the kernels' level (scalar, avx2, avx512, neon; another value: no cap),
 * BUBO_NO_PREPACK (set, and not "0") keeps a model's weights as stored rather than prepacked, and
 * BUBO_PREFETCH_AHEAD ("1" or "0") has the prepacked tiles prefetch their stream a tuned distance
 * ahead, or each piece as they come to it (unset: ahead, but on AMD Zen 4, where the piece at hand
 * streams faster: tile_simd.h). Nothing else in the C core calls getenv. bubo_config_reload()
 * reads them again: for tests, between models, never while another thread runs bubo code. */
typedef struct {
    int force_isa;  /* a bubo_isa, or -1: no cap */
    int no_prepack;
    int prefetch_ahead; /* 1: the prepacked tiles prefetch a tuned distance ahead; 0: the piece at hand */
} bubo_config;

const bubo_config *bubo_config_get(void);
void bubo_config_reload(void);

#ifdef __cplusplus
}
#endif
#endif
