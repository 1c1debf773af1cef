// The CPU GEMM paths (ops/cpu/blas.h): every path this build and CPU can run against a plain
// double-precision reference on random shapes (1-row, 1-column, 1-deep, transposes, padded
// leading dimensions, alpha and beta), BLAS's empty-product and beta = 0 rules, bitwise-repeatable
// results per path, the bf16 GEMM (f32 accumulation, one rounding) and the bf16 matmul and
// linear ops built on it, the path's choice and description, and HAP_CPU_GEMM errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/multiversion.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using cpu::GemmPath;
using namespace test_util;

// Restores the process's GEMM path when a test that switches paths ends.
struct PathGuard {
  GemmPath saved = cpu::gemm_path();
  ~PathGuard() { cpu::set_gemm_path(saved); }
};

struct Case {
  bool ta, tb;
  int64_t m, n, k, pad;  // pad: extra elements per row of every operand (leading dim > width)
  double alpha, beta;
};

std::vector<Case> cases() {
  std::vector<Case> out = {
      {false, false, 1, 1, 1, 0, 1, 0},     {false, false, 1, 37, 19, 0, 1, 0},
      {false, true, 23, 1, 31, 3, 1, 0},    {true, false, 17, 29, 1, 0, 1, 0},
      {true, true, 33, 65, 47, 5, 0.5, 2},  {false, false, 64, 64, 64, 0, 1, 1},
      {false, true, 130, 70, 200, 1, 1, 0}, {true, false, 3, 300, 513, 7, -1, 0.25},
      {false, false, 257, 9, 128, 2, 1, 1}, {true, true, 1, 128, 257, 0, 2, 0},
  };
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> dim(1, 96), pad(0, 4), flag(0, 1);
  for (int i = 0; i < 12; ++i)
    out.push_back({flag(gen) == 1, flag(gen) == 1, dim(gen), dim(gen), dim(gen), pad(gen),
                   flag(gen) ? 1.0 : 0.75, flag(gen) ? 0.0 : 1.5});
  return out;
}

template <typename T>
struct Operands {
  int64_t lda, ldb, ldc;
  std::vector<T> a, b, c;
};

// op(A) is m x k; A is stored k x m when transposed. Leading dims carry `pad` unused elements,
// filled with NaN so that a path reading them fails.
template <typename T>
Operands<T> make(const Case& cs, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  Operands<T> o;
  int64_t ra = cs.ta ? cs.k : cs.m, ca = cs.ta ? cs.m : cs.k;
  int64_t rb = cs.tb ? cs.n : cs.k, cb = cs.tb ? cs.k : cs.n;
  o.lda = ca + cs.pad;
  o.ldb = cb + cs.pad;
  o.ldc = cs.n + cs.pad;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  o.a.assign(ra * o.lda, nan);
  o.b.assign(rb * o.ldb, nan);
  o.c.assign(cs.m * o.ldc, nan);
  for (int64_t i = 0; i < ra; ++i)
    for (int64_t j = 0; j < ca; ++j) o.a[i * o.lda + j] = static_cast<T>(u(gen));
  for (int64_t i = 0; i < rb; ++i)
    for (int64_t j = 0; j < cb; ++j) o.b[i * o.ldb + j] = static_cast<T>(u(gen));
  for (int64_t i = 0; i < cs.m; ++i)
    for (int64_t j = 0; j < cs.n; ++j)
      o.c[i * o.ldc + j] = cs.beta == 0 ? nan : static_cast<T>(u(gen));  // beta = 0: never read
  return o;
}

// alpha * op(A) op(B) + beta * C in double, and the scale sum_k |a||b| for the tolerance.
template <typename T>
void reference(const Case& cs, const Operands<T>& o, std::vector<double>& out,
               std::vector<double>& scale) {
  out.assign(cs.m * cs.n, 0);
  scale.assign(cs.m * cs.n, 0);
  for (int64_t i = 0; i < cs.m; ++i)
    for (int64_t j = 0; j < cs.n; ++j) {
      double acc = 0, mag = 0;
      for (int64_t p = 0; p < cs.k; ++p) {
        double x = static_cast<double>(cs.ta ? o.a[p * o.lda + i] : o.a[i * o.lda + p]);
        double y = static_cast<double>(cs.tb ? o.b[j * o.ldb + p] : o.b[p * o.ldb + j]);
        acc += x * y;
        mag += std::fabs(x * y);
      }
      double c = cs.beta == 0 ? 0 : cs.beta * static_cast<double>(o.c[i * o.ldc + j]);
      out[i * cs.n + j] = cs.alpha * acc + c;
      scale[i * cs.n + j] = std::fabs(cs.alpha) * mag + std::fabs(c);
    }
}

template <typename T>
std::vector<T> run(const Case& cs, const Operands<T>& o) {
  std::vector<T> c = o.c;
  cpu::gemm<T>(cs.ta, cs.tb, cs.m, cs.n, cs.k, static_cast<T>(cs.alpha), o.a.data(), o.lda,
               o.b.data(), o.ldb, static_cast<T>(cs.beta), c.data(), o.ldc);
  return c;
}

std::string describe(const Case& cs) {
  return std::string(cs.ta ? "T" : "N") + (cs.tb ? "T" : "N") + " m=" + std::to_string(cs.m) +
         " n=" + std::to_string(cs.n) + " k=" + std::to_string(cs.k) +
         " pad=" + std::to_string(cs.pad) + " alpha=" + std::to_string(cs.alpha) +
         " beta=" + std::to_string(cs.beta);
}

template <typename T>
void check_path(GemmPath path, double rel_tol) {
  PathGuard guard;
  cpu::set_gemm_path(path);
  uint32_t seed = 1;
  for (const Case& cs : cases()) {
    SCOPED_TRACE(std::string(cpu::gemm_path_name(path)) + " " + describe(cs));
    Operands<T> o = make<T>(cs, seed++);
    std::vector<double> ref, scale;
    reference(cs, o, ref, scale);
    std::vector<T> c = run(cs, o);
    int bad = 0;
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j) {
        double got = static_cast<double>(c[i * o.ldc + j]), want = ref[i * cs.n + j];
        double tol = rel_tol * (scale[i * cs.n + j] + 1e-30);
        if (!(std::fabs(got - want) <= tol) && bad++ < 3)
          ADD_FAILURE() << "c[" << i << "][" << j << "] = " << got << ", expected " << want;
      }
    EXPECT_EQ(bad, 0);
    // The padding of C is not written.
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = cs.n; j < o.ldc; ++j) EXPECT_TRUE(std::isnan(c[i * o.ldc + j]));
  }
}

TEST(CpuGemm, EveryAvailablePathMatchesTheReferenceInF32) {
  std::vector<GemmPath> paths = cpu::available_gemm_paths();
  ASSERT_GE(paths.size(), 2u);  // openblas and reference are always built
  for (GemmPath p : paths) check_path<float>(p, 1e-5);
}

TEST(CpuGemm, EveryAvailablePathMatchesTheReferenceInF64) {
  for (GemmPath p : cpu::available_gemm_paths()) check_path<double>(p, 1e-13);
}

TEST(CpuGemm, EmptyProductsFollowBlas) {
  PathGuard guard;
  for (GemmPath p : cpu::available_gemm_paths()) {
    SCOPED_TRACE(cpu::gemm_path_name(p));
    cpu::set_gemm_path(p);
    // k = 0: C = beta * C; beta = 0 overwrites even NaN.
    std::vector<float> c = {1, 2, std::numeric_limits<float>::quiet_NaN(), 4};
    cpu::gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.0f, c.data(), 2);
    EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
    c = {1, 2, 3, 4};
    cpu::gemm<float>(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
    EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
    // m = 0 or n = 0: nothing is touched.
    cpu::gemm<float>(false, false, 0, 2, 3, 1.0f, nullptr, 3, nullptr, 2, 0.0f, c.data(), 2);
    cpu::gemm<float>(false, false, 2, 0, 3, 1.0f, nullptr, 3, nullptr, 1, 0.0f, c.data(), 1);
    EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  }
}

TEST(CpuGemm, EachPathIsBitwiseRepeatable) {
  PathGuard guard;
  Case big{false, true, 200, 96, 300, 0, 1, 0};
  for (GemmPath p : cpu::available_gemm_paths()) {
    SCOPED_TRACE(cpu::gemm_path_name(p));
    cpu::set_gemm_path(p);
    for (const Case& cs : {big, cases()[4], cases()[7]}) {
      Operands<float> o = make<float>(cs, 99);
      std::vector<float> first = run(cs, o), second = run(cs, o);
      // Fresh buffers at other addresses: the result does not depend on where the data lies.
      Operands<float> moved = o;
      std::vector<float> third = run(cs, moved);
      EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(first.data(), third.data(), first.size() * sizeof(float)));
    }
  }
}

// bf16 GEMM: the exact product of the bf16 values (double here), rounded once to bf16, is what
// f32 accumulation gives up to one bf16 rounding step.
TEST(CpuGemm, Bf16GemmAccumulatesInF32AndRoundsOnce) {
  PathGuard guard;
  for (GemmPath p : cpu::available_gemm_paths()) {
    cpu::set_gemm_path(p);
    SCOPED_TRACE(std::string(cpu::gemm_path_name(p)) + ": " + cpu::gemm_bf16_description());
    uint32_t seed = 40;
    for (const Case& cs : cases()) {
      SCOPED_TRACE(describe(cs));
      Operands<float> f = make<float>(cs, seed++);
      Operands<bf16> o{f.lda, f.ldb, f.ldc, {}, {}, {}};
      for (float x : f.a) o.a.push_back(bf16(x));
      for (float x : f.b) o.b.push_back(bf16(x));
      for (float x : f.c) o.c.push_back(bf16(x));
      Operands<double> d{f.lda, f.ldb, f.ldc, {}, {}, {}};
      for (bf16 x : o.a) d.a.push_back(static_cast<float>(x));
      for (bf16 x : o.b) d.b.push_back(static_cast<float>(x));
      for (bf16 x : o.c) d.c.push_back(static_cast<float>(x));
      std::vector<double> ref, scale;
      reference(cs, d, ref, scale);
      std::vector<bf16> c = o.c;
      cpu::gemm_bf16(cs.ta, cs.tb, cs.m, cs.n, cs.k, static_cast<float>(cs.alpha), o.a.data(),
                     o.lda, o.b.data(), o.ldb, static_cast<float>(cs.beta), c.data(), o.ldc);
      int bad = 0;
      for (int64_t i = 0; i < cs.m; ++i)
        for (int64_t j = 0; j < cs.n; ++j) {
          double got = static_cast<float>(c[i * o.ldc + j]), want = ref[i * cs.n + j];
          // One bf16 rounding (2^-8 relative) plus f32 accumulation error.
          double tol = std::ldexp(std::fabs(want), -8) + 1e-5 * scale[i * cs.n + j] + 1e-30;
          if (!(std::fabs(got - want) <= tol) && bad++ < 3)
            ADD_FAILURE() << "c[" << i << "][" << j << "] = " << got << ", expected " << want;
        }
      EXPECT_EQ(bad, 0);
    }
  }
}

// The bf16 ops take the bf16 GEMM and agree with the f32 route (widen, multiply, round) to one
// bf16 rounding step; their gradients come back in bf16.
TEST(CpuGemm, Bf16MatmulAndLinearAgreeWithTheF32Route) {
  Tensor a = uni({3, 17, 40}, 1, DType::F32), b = uni({40, 24}, 2, DType::F32);
  Tensor w = uni({24, 40}, 3, DType::F32), bias = uni({24}, 4, DType::F32);
  auto to16 = [](const Tensor& t) { return t.to(DType::BF16); };
  auto round32 = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F32); };
  Tensor a16 = to16(a), b16 = to16(b), w16 = to16(w), bias16 = to16(bias);
  struct Pair {
    Tensor got, want;
  };
  std::vector<Pair> pairs = {
      {matmul(a16, b16), matmul(round32(a), round32(b))},
      {matmul(a16, transpose(w16, 0, 1)), matmul(round32(a), transpose(round32(w), 0, 1))},
      {linear(a16, w16, bias16), linear(round32(a), round32(w), round32(bias))},
  };
  for (const Pair& p : pairs) {
    ASSERT_EQ(p.got.dtype(), DType::BF16);
    std::vector<double> got = p.got.to_vector(), want = p.want.to_vector();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], std::ldexp(std::fabs(want[i]), -7) + 1e-5) << i;
  }
  Tensor x = uni({5, 40}, 5, DType::F32).to(DType::BF16);
  x.set_requires_grad(true);
  Tensor wg = w16.clone();
  wg.set_requires_grad(true);
  Tensor loss = sum(linear(x, wg, Tensor()));
  loss.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::BF16);
  EXPECT_EQ(wg.grad().dtype(), DType::BF16);
  // d/dx sum(x W^T) = column sums of W (rows of ones times W), in bf16.
  std::vector<double> gx = x.grad().to_vector(), wv = w16.to_vector();
  for (int64_t j = 0; j < 40; ++j) {
    double want = 0;
    for (int64_t o = 0; o < 24; ++o) want += wv[o * 40 + j];
    EXPECT_NEAR(gx[j], want, std::ldexp(std::fabs(want), -7) + 1e-4) << j;
  }
}

TEST(CpuGemm, ThePathIsChosenFromFeaturesAndDescribed) {
  const CpuFeatures& f = cpu_features();
  std::string d = cpu::gemm_description();
  EXPECT_NE(d.find("cpu: " + f.summary()), std::string::npos) << d;
  EXPECT_NE(d.find(std::string("gemm: ") + cpu::gemm_path_name(cpu::gemm_path())),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("openblas core " + cpu::openblas_core()), std::string::npos) << d;
  EXPECT_NE(d.find(std::string("vector kernels: ") + cpu::vector_kernels()), std::string::npos)
      << d;
  // auto never picks a path the CPU cannot run, and prefers oneDNN wherever it can run.
  GemmPath best = cpu::best_gemm_path();
  EXPECT_TRUE(cpu::gemm_path_available(best));
  EXPECT_EQ(best,
            cpu::gemm_path_available(GemmPath::OneDNN) ? GemmPath::OneDNN : GemmPath::OpenBLAS);
  EXPECT_EQ(cpu::parse_gemm_path("auto"), best);
  for (GemmPath p : cpu::available_gemm_paths())
    EXPECT_EQ(cpu::parse_gemm_path(cpu::gemm_path_name(p)), p);
  // The matching OpenBLAS core follows the features, not the model.
  std::string core = cpu::openblas_core_for_features();
  if (f.avx512_core()) {
    EXPECT_TRUE(core == "SkylakeX" || core == "Cooperlake") << core;
  } else if (f.avx2 && f.fma) {
    EXPECT_EQ(core, "Haswell");
  }
}

TEST(CpuGemm, UnknownOrUnavailablePathsAreClearErrors) {
  std::string e = error_of([] { cpu::parse_gemm_path("mkl"); });
  EXPECT_NE(e.find("HAP_CPU_GEMM='mkl'"), std::string::npos) << e;
  EXPECT_NE(e.find("auto, onednn, openblas or reference"), std::string::npos) << e;
  std::string why;
  if (!cpu::gemm_path_available(GemmPath::OneDNN, &why)) {
    e = error_of([] { cpu::parse_gemm_path("onednn"); });
    EXPECT_NE(e.find("cannot run here"), std::string::npos) << e;
    EXPECT_NE(e.find(cpu_features().list()), std::string::npos) << e;
    e = error_of([] { cpu::set_gemm_path(GemmPath::OneDNN); });
    EXPECT_NE(e.find(why), std::string::npos) << e;
  } else {
    EXPECT_TRUE(why.empty());
  }
}

}  // namespace
}  // namespace hap
