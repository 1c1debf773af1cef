#include "core/cpu_features.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HAP_X86 1
#endif

namespace hap {

namespace {

#ifdef HAP_X86
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = Regs{};
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned reg, int i) { return (reg >> i) & 1u; }

CpuFeatures read_features() {
  CpuFeatures f;
  Regs v = cpuid(0);
  unsigned max_leaf = v.a;
  char vendor[13] = {};
  std::memcpy(vendor, &v.b, 4);
  std::memcpy(vendor + 4, &v.d, 4);
  std::memcpy(vendor + 8, &v.c, 4);
  f.vendor = vendor;
  if (max_leaf < 1) return f;
  Regs l1 = cpuid(1);
  int base_family = (l1.a >> 8) & 0xf, base_model = (l1.a >> 4) & 0xf;
  f.family = base_family == 0xf ? base_family + static_cast<int>((l1.a >> 20) & 0xff) : base_family;
  f.model = (base_family == 0x6 || base_family == 0xf)
                ? base_model + static_cast<int>(((l1.a >> 16) & 0xf) << 4)
                : base_model;
  f.sse42 = bit(l1.c, 20);
  bool osxsave = bit(l1.c, 27);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  bool ymm_state = (xcr0 & 0x6) == 0x6;                 // SSE and AVX state
  bool zmm_state = ymm_state && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM upper halves, ZMM16-31
  bool tile_state = (xcr0 & 0x60000) == 0x60000;        // XTILECFG, XTILEDATA
  f.avx = bit(l1.c, 28) && ymm_state;
  f.fma = bit(l1.c, 12) && ymm_state;
  f.f16c = bit(l1.c, 29) && ymm_state;
  if (max_leaf >= 7) {
    Regs l7 = cpuid(7, 0);
    f.avx2 = bit(l7.b, 5) && ymm_state;
    f.avx512f = bit(l7.b, 16) && zmm_state;
    f.avx512dq = f.avx512f && bit(l7.b, 17);
    f.avx512bw = f.avx512f && bit(l7.b, 30);
    f.avx512vl = f.avx512f && bit(l7.b, 31);
    f.avx512_vnni = f.avx512f && bit(l7.c, 11);
    f.avx512_fp16 = f.avx512f && bit(l7.d, 23);
    f.amx_bf16 = bit(l7.d, 22) && tile_state;
    f.amx_tile = bit(l7.d, 24) && tile_state;
    if (l7.a >= 1) {
      Regs l71 = cpuid(7, 1);
      f.avx512_bf16 = f.avx512f && bit(l71.a, 5);
    }
  }
  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    std::string s = brand;
    size_t first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
    f.brand = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  }
  return f;
}
#else
CpuFeatures read_features() { return CpuFeatures{}; }
#endif

}  // namespace

std::string CpuFeatures::level() const {
  if (avx512_core()) return "x86-64-v4";
  if (avx2 && fma) return "x86-64-v3";
  if (sse42) return "x86-64-v2";
  return "x86-64";
}

std::string CpuFeatures::summary() const {
  if (avx512_core()) {
    std::string s = "avx512";
    if (avx512_bf16) s += "+bf16";
    if (amx_tile && amx_bf16) s += "+amx";
    return s;
  }
  if (avx2 && fma) return "avx2+fma";
  if (avx) return "avx";
  if (sse42) return "sse4.2";
  return "baseline";
}

std::string CpuFeatures::list() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(sse42, "sse4.2");
  add(avx, "avx");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512dq, "avx512dq");
  add(avx512vl, "avx512vl");
  add(avx512_vnni, "avx512_vnni");
  add(avx512_bf16, "avx512_bf16");
  add(avx512_fp16, "avx512_fp16");
  add(amx_tile, "amx_tile");
  add(amx_bf16, "amx_bf16");
  return s.empty() ? "none of sse4.2, avx, avx2, avx-512, amx" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = read_features();
  return f;
}

}  // namespace hap
