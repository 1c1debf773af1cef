// What the CPU can run, read from cpuid (and from XGETBV: which register states the OS saves).
// Kernel choices are made from these features, never from a table of CPU models.
#pragma once
#include <string>

namespace hap {

struct CpuFeatures {
  std::string vendor;  // "GenuineIntel", "AuthenticAMD", ...
  std::string brand;   // "AMD EPYC 9R14", ... (empty where cpuid does not say)
  int family = 0, model = 0;
  bool sse42 = false;
  bool avx = false;  // usable: the CPU has it and the OS saves the YMM state
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;  // usable: the CPU has it and the OS saves the ZMM state
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  bool avx512_fp16 = false;
  bool amx_tile = false;  // the CPU has it and the OS offers the tile state (XCR0 bits 17-18)
  bool amx_bf16 = false;

  // AVX-512 foundation with BW, DQ and VL: what AVX-512 GEMM kernels need (Skylake-SP level).
  bool avx512_core() const { return avx512f && avx512bw && avx512dq && avx512vl; }
  // The widest vector level, as a compiler's x86-64 level name: "x86-64-v4" (AVX-512),
  // "x86-64-v3" (AVX2+FMA), "x86-64-v2" (SSE4.2), "x86-64".
  std::string level() const;
  // Short summary for run descriptions: "avx512+bf16+amx", "avx512+bf16", "avx512", "avx2+fma",
  // "avx", "sse4.2" or "baseline".
  std::string summary() const;
  // Every feature above that is present, space-separated ("sse4.2 avx avx2 fma ...").
  std::string list() const;
};

// This machine's features, read once.
const CpuFeatures& cpu_features();

}  // namespace hap
