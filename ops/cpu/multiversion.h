// HAP_MULTIVERSION: compile a hot CPU kernel once per x86-64 level (baseline, x86-64-v3 = AVX2 +
// FMA, x86-64-v4 = AVX-512) and pick the version the CPU runs when the library loads (GCC's
// target_clones: an ifunc resolved from the CPU's features, not its model). The library itself is
// built for the baseline (HAP_NATIVE=OFF), so it runs on any x86-64 CPU, and its hot loops still
// use the widest vectors the CPU has. OpenMP regions inside a kernel are cloned with it.
//
// Off where it does not apply: -march=native builds (HAP_NATIVE, everything is already compiled
// for this CPU), other compilers and architectures, CUDA translation units. Each function marked
// HAP_MULTIVERSION is named <name>_clones and called through clone_call by a wrapper <name>.
#pragma once

#if defined(HAP_CPU_CLONES) && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__CUDACC__)
#define HAP_MULTIVERSION \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#define HAP_MULTIVERSION_ON 1
#else
#define HAP_MULTIVERSION
#endif

namespace hap::cpu {

// Returns f, hidden from the optimiser. A HAP_MULTIVERSION function is called through it (the
// kernels below each have a plain wrapper that does so): GCC 12 marks direct calls to a
// target_clones dispatcher as non-throwing, so an error thrown inside (a bad id, a bad target)
// would end the program instead of reaching the caller; a call through a pointer unwinds.
template <typename F>
F* clone_call(F* f) {
  asm("" : "+r"(f));
  return f;
}

// How the hot kernels were built: "x86-64-v4 clone" (the version this CPU runs), "native" or
// "baseline".
const char* vector_kernels();

}  // namespace hap::cpu
