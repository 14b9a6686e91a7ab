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
/* The best level this CPU runs; BUBO_FORCE_ISA=scalar|avx2|avx512|neon in the environment caps it. */
bubo_isa bubo_cpu_best_isa(void);
const char *bubo_isa_name(bubo_isa isa);

#ifdef __cplusplus
}
#endif
#endif
