// The CUDA kernels of ops/cuda/loss.cu against the CPU's: cross-entropy (every reduction, ignored
// targets, label smoothing) and its backward, target logits, target counts, logsumexp, max,
// argmax, topk and index_backward, on strided views, rows longer than a block (up to a GPT-2
// vocabulary of 50257), sizes that are not multiples of 32, ties and NaNs, in f32 and f64. Each
// test skips without a visible GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/dispatch.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using ops::OpKind;
using namespace gpu_test;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor normal(const Shape& s, uint64_t seed, DType d, double scale = 1.0) {
  std::vector<double> v = randn(s, seed, 0, f64()).to_vector();
  for (double& e : v) e *= scale;
  return Tensor::from_vector(v, s, f64()).to(d);
}

// Small integers (many ties in every row), with a NaN every 37th element and -0.0 / +0.0 pairs
// where `specials`.
Tensor tied(const Shape& s, uint64_t seed, DType d, bool specials) {
  std::vector<double> v = randn(s, seed, 0, f64()).to_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = std::round(v[i] * 2);
    if (specials && i % 37 == 36) v[i] = kNan;
    if (specials && i % 29 == 5) v[i] = -0.0;
  }
  return Tensor::from_vector(v, s, f64()).to(d);
}

// `x` [a, b, c] as the view of a [c, b, a] block with its dims reversed (no dim of stride 1 last).
Tensor reversed_view(const Tensor& block) {
  const Shape& s = block.shape();
  return block.as_strided({s[2], s[1], s[0]}, {1, s[2], s[2] * s[1]}, 0);
}

// `x` [n, v] as the transposed view of a [v, n] block.
Tensor transposed(const Tensor& block) {
  return block.as_strided({block.size(1), block.size(0)}, {1, block.size(1)}, 0);
}

// Targets in [0, v), every `every`-th (from the first) replaced by `ignore` (every 0: none), as
// the odd elements of a block whose even elements are out of every range: a strided view.
Tensor targets_view(int64_t n, int64_t v, uint64_t seed, int64_t every, int64_t ignore) {
  const std::vector<double> u = rand({n}, seed, 0, f64()).to_vector();
  std::vector<int64_t> block(static_cast<size_t>(2 * n), -12345);
  for (int64_t i = 0; i < n; ++i) {
    const bool ignored = every > 0 && i % every == 0;
    block[static_cast<size_t>(2 * i + 1)] =
        ignored
            ? ignore
            : std::min<int64_t>(
                  v - 1, static_cast<int64_t>(u[static_cast<size_t>(i)] * static_cast<double>(v)));
  }
  if (n == 0) return Tensor::from_vector(std::vector<int64_t>{}, {0});
  return Tensor::from_vector(block, {2 * n}).as_strided({n}, {2}, 1);
}

// Exactly equal values, NaNs equal to each other and zeros of the same sign: max and topk return
// the elements they find.
void expect_same_elements(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  ASSERT_EQ(gpu.device(), kGpu) << what;
  ASSERT_EQ(gpu.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu.dtype(), cpu.dtype()) << what;
  const std::vector<double> a = gpu.to(Device::cpu()).to_vector(), b = cpu.to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(b[i])) {
      EXPECT_TRUE(std::isnan(a[i])) << what << " element " << i << ": " << a[i] << " vs nan";
      continue;
    }
    EXPECT_EQ(a[i], b[i]) << what << " element " << i;
    EXPECT_EQ(std::signbit(a[i]), std::signbit(b[i])) << what << " element " << i;
  }
}

TEST(CudaLoss, CrossEntropyAndItsBackwardMatchTheCpuInEveryReduction) {
  HAP_REQUIRE_GPU();
  struct Case {
    std::string label;
    int64_t n, v;
    bool transposed;
    int64_t ignore, every;
  };
  const std::vector<Case> cases = {
      {"37 x 45, every 5th ignored", 37, 45, false, -100, 5},
      {"transposed 29 x 1000, every 4th ignored", 29, 1000, true, -100, 4},
      {"3 x 50257, ignore_index 3", 3, 50257, false, 3, 2},
      {"all ignored", 5, 33, false, -100, 1},
      {"no rows", 0, 33, false, -100, 0}};
  for (DType d : {DType::F32, DType::F64}) {
    // f32: the CPU sums up to 50257 exponentials (its exp_fast polynomial) in f32, a relative
    // error up to ~1e-5; the GPU sums CUDA's expf in double. f64: the same formulas, rounding
    // and the order of the sums aside.
    const bool single = d == DType::F32;
    const double rtol = single ? 5e-5 : 1e-11, atol = single ? 1e-6 : 1e-13;
    const double grad_atol = single ? 1e-7 : 1e-14;
    for (const Case& k : cases) {
      const Tensor x =
          k.transposed ? transposed(normal({k.v, k.n}, 1, d, 2.0)) : normal({k.n, k.v}, 1, d, 2.0);
      const Tensor t = targets_view(k.n, k.v, 2, k.every, k.ignore);
      const Tensor x_gpu = same_view_on_gpu(x), t_gpu = same_view_on_gpu(t);
      for (ops::Reduction r : {ops::Reduction::Mean, ops::Reduction::Sum, ops::Reduction::None}) {
        for (double smoothing : {0.0, 0.1}) {
          SCOPED_TRACE(k.label + " reduction " + std::to_string(static_cast<int>(r)) +
                       " smoothing " + std::to_string(smoothing) + " " + dtype_name(d));
          const ops::CrossEntropyAttrs a{k.ignore, smoothing, r};
          expect_close(ops::call1(OpKind::CrossEntropy, {x_gpu, t_gpu}, a),
                       ops::call1(OpKind::CrossEntropy, {x, t}, a), rtol, atol, "loss");
          // The per-row gradient as every other element of a block: a strided view.
          const Tensor g = r != ops::Reduction::None ? Tensor::scalar(0.75, f64()).to(d)
                           : k.n == 0                ? normal({0}, 3, d)
                                      : normal({2 * k.n + 1}, 3, d).as_strided({k.n}, {2}, 1);
          expect_close(
              ops::call1(OpKind::CrossEntropyBackward, {same_view_on_gpu(g), x_gpu, t_gpu}, a),
              ops::call1(OpKind::CrossEntropyBackward, {g, x, t}, a), rtol, grad_atol, "d logits");
        }
      }
    }
  }
}

TEST(CudaLoss, ATargetOutOfRangeRaisesTheCpusErrorWordForWord) {
  HAP_REQUIRE_GPU();
  const Tensor x = normal({4, 7}, 4, DType::F32);
  const Tensor t = Tensor::from_vector(std::vector<int64_t>{1, -100, 7, -3}, {4});
  const Tensor g = Tensor::scalar(1.0);
  for (ops::Reduction r : {ops::Reduction::Mean, ops::Reduction::None}) {
    const ops::CrossEntropyAttrs a{-100, 0.0, r};
    const std::string cpu = test_util::error_of([&] {
      ops::call1(OpKind::CrossEntropy, {x, t}, a);
    });
    EXPECT_HAS(cpu, "target 7 at position 2 is out of range for 7 classes");
    EXPECT_EQ(test_util::error_of([&] {
                ops::call1(OpKind::CrossEntropy, {x.to(kGpu), t.to(kGpu)}, a);
              }),
              cpu);
  }
  const ops::CrossEntropyAttrs a{-100, 0.0, ops::Reduction::Sum};
  EXPECT_EQ(test_util::error_of([&] {
              ops::call1(OpKind::CrossEntropyBackward, {g.to(kGpu), x.to(kGpu), t.to(kGpu)}, a);
            }),
            test_util::error_of([&] {
              ops::call1(OpKind::CrossEntropyBackward, {g, x, t}, a);
            }));
}

TEST(CudaLoss, TargetLogitAndItsBackwardCopyExactlyTheCpusElements) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // x holds columns [offset, offset + 1000) of a 1500-class vocabulary; targets elsewhere,
    // ignored ones (every 4th) and, with ignore_index 0, class 0 give 0.
    const Tensor x = transposed(normal({1000, 29}, 5, d));
    const Tensor x_gpu = same_view_on_gpu(x);
    const Tensor g = normal({59}, 6, d).as_strided({29}, {2}, 1);
    const Tensor g_gpu = same_view_on_gpu(g);
    for (const ops::TargetAttrs& a :
         {ops::TargetAttrs{0, -100}, ops::TargetAttrs{700, -100}, ops::TargetAttrs{0, 0}}) {
      SCOPED_TRACE("offset " + std::to_string(a.offset) + " ignore_index " +
                   std::to_string(a.ignore_index) + " " + dtype_name(d));
      const Tensor t = targets_view(29, 1500, 7, 4, a.ignore_index);
      const Tensor t_gpu = same_view_on_gpu(t);
      expect_equal(ops::call1(OpKind::TargetLogit, {x_gpu, t_gpu}, a),
                   ops::call1(OpKind::TargetLogit, {x, t}, a), "target logits");
      expect_equal(ops::call1(OpKind::TargetLogitBackward, {g_gpu, x_gpu, t_gpu}, a),
                   ops::call1(OpKind::TargetLogitBackward, {g, x, t}, a), "d x");
    }
    // A shard with no columns.
    const Tensor none = normal({5, 0}, 8, d), t = targets_view(5, 9, 9, 0, -100);
    const Tensor g5 = normal({5}, 10, d);
    expect_equal(ops::call1(OpKind::TargetLogit, {none.to(kGpu), t.to(kGpu)}, ops::TargetAttrs{}),
                 ops::call1(OpKind::TargetLogit, {none, t}, ops::TargetAttrs{}), "no columns");
    expect_equal(ops::call1(OpKind::TargetLogitBackward, {g5.to(kGpu), none.to(kGpu), t.to(kGpu)},
                            ops::TargetAttrs{}),
                 ops::call1(OpKind::TargetLogitBackward, {g5, none, t}, ops::TargetAttrs{}),
                 "no columns, backward");
  }
}

TEST(CudaLoss, CountTargetsCountsExactlyTheCpusTargets) {
  HAP_REQUIRE_GPU();
  // [6, 7] as the transposed view of a [7, 6] block of classes 0..4 and ignore_index -100.
  std::vector<int64_t> block;
  for (int64_t i = 0; i < 42; ++i) block.push_back(i % 9 == 4 ? -100 : i % 5);
  const Tensor t = Tensor::from_vector(block, {7, 6}).as_strided({6, 7}, {1, 6}, 0);
  const std::vector<std::pair<std::string, Tensor>> inputs = {
      {"transposed [6, 7]", t},
      {"every other of 601", targets_view(601, 50, 11, 3, -100)},
      {"empty", Tensor::from_vector(std::vector<int64_t>{}, {0})},
      {"scalar", Tensor::from_vector(std::vector<int64_t>{3}, {})}};
  for (const auto& [label, x] : inputs) {
    for (int64_t ignore : {-100, 3}) {
      SCOPED_TRACE(label + " ignore_index " + std::to_string(ignore));
      const ops::CrossEntropyAttrs a{ignore, 0.0, ops::Reduction::Mean};
      expect_equal(ops::call1(OpKind::CountTargets, {same_view_on_gpu(x)}, a),
                   ops::call1(OpKind::CountTargets, {x}, a), "count");
    }
  }
}

TEST(CudaLoss, LogSumExpMatchesTheCpuAndGivesMinusInfinityForEmptyRows) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // Both sum the exponentials in double and round once; the order of the sums and the device's
    // exp (within an ulp of glibc's) aside, the results agree to the last bit of the dtype.
    const double tol = d == DType::F64 ? 1e-12 : 1e-6;
    SCOPED_TRACE(dtype_name(d));
    const Tensor x = reversed_view(normal({5, 33, 7}, 12, d, 3.0));
    expect_close(ops::call1(OpKind::LogSumExp, {same_view_on_gpu(x)}),
                 ops::call1(OpKind::LogSumExp, {x}), tol, tol, "reversed [7, 33, 5]");
    const Tensor wide = normal({3, 50257}, 13, d, 2.0);
    expect_close(ops::call1(OpKind::LogSumExp, {wide.to(kGpu)}),
                 ops::call1(OpKind::LogSumExp, {wide}), tol, tol, "[3, 50257]");
    const Tensor some = Tensor::from_vector(
        std::vector<double>{-kInf, 1.5, -kInf, 2.0, -3.0, -kInf}, {2, 3}, f64());
    expect_close(ops::call1(OpKind::LogSumExp, {some.to(d).to(kGpu)}),
                 ops::call1(OpKind::LogSumExp, {some.to(d)}), tol, tol, "some -inf");
    const Tensor all = Tensor::full({2, 300}, -kInf, f64()).to(d);
    expect_equal(ops::call1(OpKind::LogSumExp, {all.to(kGpu)}),
                 ops::call1(OpKind::LogSumExp, {all}), "all -inf");
    const Tensor empty = Tensor::empty({3, 0}, TensorOptions{}.with_dtype(d));
    expect_equal(ops::call1(OpKind::LogSumExp, {empty.to(kGpu)}),
                 ops::call1(OpKind::LogSumExp, {empty}), "no columns");
  }
}

TEST(CudaLoss, MaxAndArgmaxPickTheCpusFirstMaximumOrFirstNan) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    for (bool specials : {false, true}) {
      const Tensor x = reversed_view(tied({5, 33, 7}, 14, d, specials));
      const Tensor wide = tied({3, 1000}, 15, d, specials);  // ties across threads of a block
      const std::vector<std::pair<std::string, Tensor>> inputs = {{"reversed [7, 33, 5]", x},
                                                                  {"[3, 1000]", wide}};
      for (const auto& [label, in] : inputs) {
        const Tensor in_gpu = same_view_on_gpu(in);
        for (int64_t dim = -1; dim < in.dim(); ++dim) {
          for (bool keepdim : {false, true}) {
            SCOPED_TRACE(label + " dim " + std::to_string(dim) + (keepdim ? " keepdim " : " ") +
                         (specials ? "with nan and -0 " : "") + dtype_name(d));
            const ops::DimAttrs a{dim, keepdim};
            expect_same_elements(ops::call1(OpKind::Max, {in_gpu}, a),
                                 ops::call1(OpKind::Max, {in}, a), "max");
            expect_equal(ops::call1(OpKind::Argmax, {in_gpu}, a),
                         ops::call1(OpKind::Argmax, {in}, a), "argmax");
          }
        }
      }
    }
  }
}

TEST(CudaLoss, TopKOrdersTiesAndNansAsTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    const Tensor x = reversed_view(tied({5, 33, 7}, 16, d, true));
    const Tensor x_gpu = same_view_on_gpu(x);
    for (int64_t dim : {0, 1, -1}) {
      const int64_t n = x.size(dim < 0 ? dim + 3 : dim);
      for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{3}, n}) {
        for (bool largest : {true, false}) {
          SCOPED_TRACE("dim " + std::to_string(dim) + " k " + std::to_string(k) +
                       (largest ? " largest " : " smallest ") + dtype_name(d));
          const ops::TopKAttrs a{k, dim, largest};
          const std::vector<Tensor> got = ops::call(OpKind::TopK, {x_gpu}, a),
                                    want = ops::call(OpKind::TopK, {x}, a);
          expect_same_elements(got[0], want[0], "values");
          expect_equal(got[1], want[1], "indices");
        }
      }
    }
    const Tensor wide = tied({3, 1000}, 17, d, true);
    for (int64_t k : {10, 1000}) {
      SCOPED_TRACE("[3, 1000] k " + std::to_string(k) + " " + dtype_name(d));
      const ops::TopKAttrs a{k, -1, true};
      const std::vector<Tensor> got = ops::call(OpKind::TopK, {wide.to(kGpu)}, a),
                                want = ops::call(OpKind::TopK, {wide}, a);
      expect_same_elements(got[0], want[0], "values");
      expect_equal(got[1], want[1], "indices");
    }
  }
}

TEST(CudaLoss, IndexBackwardAddsRepeatedIndicesInTheCpusOrder) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    // From topk along dim 1 of [7, 33, 5]: distinct indices; the gradient a reversed view.
    const Tensor x = normal({7, 33, 5}, 18, d);
    const Tensor idx = ops::call(OpKind::TopK, {x}, ops::TopKAttrs{4, 1, true})[1];
    const Tensor g = reversed_view(normal({5, 4, 7}, 19, d));
    const ops::ScatterAttrs from_topk{1, 0, {7, 33, 5}};
    expect_equal(ops::call1(OpKind::IndexBackward, {same_view_on_gpu(g), idx.to(kGpu)}, from_topk),
                 ops::call1(OpKind::IndexBackward, {g, idx}, from_topk), "topk indices");
    // Repeated indices along the last dim (one column per row): sums in j order, bit for bit.
    const std::vector<double> u = rand({37, 45}, 20, 0, f64()).to_vector();
    std::vector<int64_t> repeated;
    for (double e : u) repeated.push_back(static_cast<int64_t>(e * 6));
    const Tensor ri = Tensor::from_vector(repeated, {37, 45});
    const Tensor rg = normal({37, 45}, 21, d);
    const ops::ScatterAttrs last{1, 0, {37, 6}};
    expect_equal(ops::call1(OpKind::IndexBackward, {rg.to(kGpu), ri.to(kGpu)}, last),
                 ops::call1(OpKind::IndexBackward, {rg, ri}, last), "repeated indices");
    // An index outside the dim is an internal error on both.
    const Tensor bad = Tensor::from_vector(std::vector<int64_t>{0, 6, 1}, {1, 3});
    const Tensor g3 = normal({1, 3}, 22, d);
    EXPECT_THROW(ops::call1(OpKind::IndexBackward, {g3, bad}, ops::ScatterAttrs{1, 0, {1, 6}}),
                 InternalError);
    EXPECT_THROW(ops::call1(OpKind::IndexBackward, {g3.to(kGpu), bad.to(kGpu)},
                            ops::ScatterAttrs{1, 0, {1, 6}}),
                 InternalError);
  }
}

}  // namespace
}  // namespace hap
