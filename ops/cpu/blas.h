// GEMM on the CPU (row-major): C = alpha * op(A) op(B) + beta * C, through one of several paths
// chosen from the CPU's instruction-set features (docs/cpu.md):
//   onednn    oneDNN, which generates its kernels for the instruction set it finds (AVX2,
//             AVX-512, AVX512-BF16, AMX): the default for f32 and bf16 where it is built;
//   openblas  OpenBLAS, whose kernels come from its own table of CPU models (on a model newer
//             than the table it falls back to generic SSE kernels, 3-5x slower);
//   reference plain loops, the obviously-correct yardstick.
// f64 (gradcheck) has no oneDNN GEMM: it takes OpenBLAS unless the reference path is chosen.
// HAP_CPU_GEMM=auto|onednn|openblas|reference forces a path (for comparisons); a path this build
// or CPU cannot run is an error naming it and what the CPU has.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace hap::cpu {

enum class GemmPath { Reference, OpenBLAS, OneDNN };

const char* gemm_path_name(GemmPath path);
// Whether this build and CPU can run `path`; if not and `why` is given, the reason.
bool gemm_path_available(GemmPath path, std::string* why = nullptr);
// The paths this build and CPU can run, in the order onednn, openblas, reference.
std::vector<GemmPath> available_gemm_paths();
// "auto" gives the best path for this CPU; a name this build or CPU cannot run is an Error
// naming it, what it needs and what the CPU has. `source` says where the name came from.
GemmPath parse_gemm_path(const std::string& name, const std::string& source = "HAP_CPU_GEMM");
// The path f32 and bf16 GEMMs take: HAP_CPU_GEMM if set, else the best for this CPU; read once.
GemmPath gemm_path();
// Overrides the path for this process (tests and benchmarks compare paths side by side).
void set_gemm_path(GemmPath path);
// The best path for this CPU and build (what "auto" means).
GemmPath best_gemm_path();

// What runs the CPU's GEMMs, for run descriptions and hap-profile:
// "cpu: avx512+bf16 (AMD EPYC 9R14), gemm: onednn 2.6.3 (avx512_core_bf16), bf16 gemm: onednn
//  (avx512_core_bf16), vector kernels: x86-64-v4 clones, openblas core Cooperlake"
std::string gemm_description();
// OpenBLAS's kernel set as it chose it at load time ("Cooperlake", "Prescott", ...).
std::string openblas_core();
// The OPENBLAS_CORETYPE that matches this CPU's instruction set ("SkylakeX", "Haswell", ...).
std::string openblas_core_for_features();
// Whether OpenBLAS runs a kernel set below what the CPU can run (a CPU newer than its table).
bool openblas_core_is_generic();

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc);

// T = bf16 forwards to gemm_bf16 below.
template <>
void gemm<bf16>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, bf16 alpha,
                const bf16* a, int64_t lda, const bf16* b, int64_t ldb, bf16 beta, bf16* c,
                int64_t ldc);

// bf16 operands, f32 accumulation, one rounding to bf16 at the end:
// c = bf16(alpha * sum_k f32(a) f32(b) + beta * f32(c)). On CPUs with AVX512-BF16 or AMX the
// onednn path multiplies with those instructions; otherwise the operands are widened to f32.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const bf16* a, int64_t lda, const bf16* b, int64_t ldb, float beta, bf16* c,
               int64_t ldc);
// What gemm_bf16 runs on the current path ("onednn (avx512_core_bf16)", "widened to f32,
// openblas", ...).
std::string gemm_bf16_description();

}  // namespace hap::cpu
