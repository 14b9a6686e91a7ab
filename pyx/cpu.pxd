# Mirrors csrc/include/bubo/cpu.h
cdef extern from "bubo/cpu.h" nogil:
    ctypedef enum bubo_isa:
        BUBO_ISA_SCALAR
        BUBO_ISA_AVX2
        BUBO_ISA_AVX512
        BUBO_ISA_NEON
        BUBO_ISA_COUNT

    int bubo_cpu_supports(bubo_isa isa)
    bubo_isa bubo_cpu_best_isa()
    const char *bubo_isa_name(bubo_isa isa)

    ctypedef struct bubo_config:
        int force_isa
        int no_prepack
        int prefetch_ahead

    const bubo_config *bubo_config_get()
    void bubo_config_reload()
