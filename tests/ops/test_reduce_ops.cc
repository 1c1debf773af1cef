// Reductions against plain loops in double: sum and mean over any set of dims (adjacent or not,
// negative, keepdim) of strided inputs; max and argmax with ties and NaN; topk; their errors, and
// gradcheck in f64 of sum, mean, max and topk values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using namespace test_util;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

std::vector<int64_t> coords_of(int64_t flat, const Shape& s) {
  std::vector<int64_t> c(s.size());
  for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
    c[d] = flat % s[d];
    flat /= s[d];
  }
  return c;
}

// Reference reduction: `combine` over the elements whose coordinates agree outside `dims`.
struct RefReduce {
  Shape shape;
  std::vector<double> values;
};
RefReduce ref_reduce(const Tensor& x, std::vector<int64_t> dims, bool keepdim, bool mean) {
  int64_t nd = x.dim();
  if (dims.empty())
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  for (int64_t& d : dims) d = d < 0 ? d + nd : d;
  auto reduced = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  Shape out, out_kept;
  int64_t count = 1;
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced(d)) {
      count *= x.shape()[d];
      out_kept.push_back(1);
      if (keepdim) out.push_back(1);
    } else {
      out.push_back(x.shape()[d]);
      out_kept.push_back(x.shape()[d]);
    }
  }
  std::vector<double> v = x.to_vector(), acc(shape_numel(out_kept), 0.0);
  for (int64_t i = 0; i < x.numel(); ++i) {
    std::vector<int64_t> c = coords_of(i, x.shape());
    int64_t o = 0;
    for (int64_t d = 0; d < nd; ++d) o = o * out_kept[d] + (reduced(d) ? 0 : c[d]);
    acc[o] += v[i];
  }
  if (mean)
    for (double& a : acc) a /= static_cast<double>(count);
  return {out, acc};
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
}

void expect_gradcheck(const Fn& f, const std::vector<Tensor>& inputs, const std::string& what) {
  autograd::GradcheckResult r = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

struct ReduceCase {
  std::vector<int64_t> dims;
  bool keepdim;
};
const std::vector<ReduceCase> kReduceCases = {
    {{}, false},     {{}, true},     {{0}, false},      {{1}, true},
    {{2}, false},    {{-1}, true},   {{0, 1}, false},   {{1, 2}, true},
    {{0, 2}, false}, {{2, 0}, true}, {{-3, -1}, false}, {{0, 1, 2}, true},
};

// ---------------------------------------------------------------- sum and mean

TEST(SumMean, AnyDimsOfContiguousAndStridedInputs) {
  for (DType dt : {DType::F64, DType::F32}) {
    double tol = dt == DType::F64 ? 1e-13 : 2e-6;
    Tensor x = uni({5, 7, 9}, 1, dt);
    Tensor xt = permute(uni({9, 5, 7}, 2, dt), {1, 2, 0});  // [5, 7, 9], non-contiguous
    Tensor xs = slice(uni({5, 11, 9}, 3, dt), 1, 2, 9);     // [5, 7, 9], offset and strided
    for (const Tensor& in : {x, xt, xs}) {
      for (const ReduceCase& c : kReduceCases) {
        for (bool is_mean : {false, true}) {
          RefReduce want = ref_reduce(in, c.dims, c.keepdim, is_mean);
          Tensor y = is_mean ? mean(in, c.dims, c.keepdim) : sum(in, c.dims, c.keepdim);
          std::string what = std::string(is_mean ? "mean" : "sum") + " dims " + shape_str(c.dims) +
                             (c.keepdim ? " keepdim" : "") + " " + dtype_name(dt) + " strides " +
                             shape_str(in.strides());
          EXPECT_EQ(y.shape(), want.shape) << what;
          EXPECT_EQ(y.dtype(), dt);
          expect_close(y.to_vector(), want.values, tol, what);
        }
      }
    }
  }
}

TEST(SumMean, LargeF32SumsAccumulateAccurately) {
  // 1e6 values of 0.1: a naive f32 running sum drifts by ~1%; the kernel must stay close.
  Tensor x = Tensor::full({1000000}, 0.1);
  EXPECT_NEAR(sum(x).item(), 100000.0 * (static_cast<double>(0.1f) / 0.1), 1.0);
  EXPECT_NEAR(mean(x).item(), 0.1, 1e-6);
  // Same along an outer dim (a column reduction).
  Tensor y = Tensor::full({100000, 3}, 0.1);
  for (double v : sum(y, {0}).to_vector())
    EXPECT_NEAR(v, 10000.0 * (static_cast<double>(0.1f) / 0.1), 0.5);
}

TEST(SumMean, ScalarsAndEmptyTensors) {
  Tensor s = Tensor::scalar(3.5, opts(DType::F64));
  EXPECT_EQ(sum(s).shape(), Shape{});
  EXPECT_EQ(sum(s).item(), 3.5);
  EXPECT_EQ(mean(s).item(), 3.5);
  // A scalar accepts dim 0 or -1 (as PyTorch does) and reduces over nothing.
  EXPECT_EQ(sum(s, {0}).item(), 3.5);
  EXPECT_EQ(mean(s, {-1}, true).shape(), Shape{});
  EXPECT_EQ(mean(s, {-1}, true).item(), 3.5);
  Tensor e = Tensor::zeros({0, 4});
  Tensor se = sum(e, {0});
  EXPECT_EQ(se.shape(), (Shape{4}));
  for (double v : se.to_vector()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(sum(e).item(), 0.0);
  EXPECT_EQ(sum(e, {1}).shape(), (Shape{0}));
  std::string msg = error_of([&] { mean(e, {0}); });
  EXPECT_HAS(msg, "mean");
  EXPECT_HAS(msg, "[0, 4]");
}

TEST(SumMean, BadDimsAreUserErrors) {
  Tensor x = uni({2, 3, 4}, 4);
  std::string msg = error_of([&] { sum(x, {3}); });
  EXPECT_HAS(msg, "3");
  EXPECT_HAS(msg, "[-3, 2]");
  msg = error_of([&] { sum(x, {1, -2}); });
  EXPECT_HAS(msg, "twice");
  EXPECT_HAS(error_of([&] { mean(Tensor::zeros({2}, opts(DType::I64))); }), "i64");
}

// ---------------------------------------------------------------- max and argmax

TEST(MaxArgmax, AlongEachDimWithKeepdim) {
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor x = permute(uni({6, 4, 5}, 5, dt), {2, 0, 1});  // [5, 6, 4], strided
    std::vector<double> v = x.to_vector();
    for (int64_t dim = -3; dim < 3; ++dim) {
      for (bool keep : {false, true}) {
        Tensor m = max(x, dim, keep), a = argmax(x, dim, keep);
        int64_t d = dim < 0 ? dim + 3 : dim;
        Shape want_shape = x.shape();
        if (keep)
          want_shape[d] = 1;
        else
          want_shape.erase(want_shape.begin() + d);
        EXPECT_EQ(m.shape(), want_shape);
        EXPECT_EQ(a.shape(), want_shape);
        EXPECT_EQ(a.dtype(), DType::I64);
        EXPECT_FALSE(a.requires_grad());
        std::vector<double> mv = m.to_vector(), av = a.to_vector();
        Shape kept = x.shape();
        kept[d] = 1;
        for (int64_t o = 0; o < shape_numel(kept); ++o) {
          std::vector<int64_t> c = coords_of(o, kept);
          double best = -std::numeric_limits<double>::infinity();
          int64_t bi = -1;
          for (int64_t r = 0; r < x.shape()[d]; ++r) {
            c[d] = r;
            int64_t flat = (c[0] * x.shape()[1] + c[1]) * x.shape()[2] + c[2];
            if (v[flat] > best) {
              best = v[flat];
              bi = r;
            }
          }
          EXPECT_EQ(mv[o], best);
          EXPECT_EQ(av[o], bi);
        }
      }
    }
  }
}

TEST(MaxArgmax, TiesPickTheFirstIndexAndNaNWins) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor t =
      Tensor::from_vector(std::vector<double>{1, 3, 3, 2, 5, 5, 5, 0}, {2, 4}, opts(DType::F64));
  EXPECT_EQ(argmax(t, 1).to_vector(), (std::vector<double>{1, 0}));
  EXPECT_EQ(max(t, 1).to_vector(), (std::vector<double>{3, 5}));
  Tensor n =
      Tensor::from_vector(std::vector<double>{1, nan, 7, nan, 2, 3}, {2, 3}, opts(DType::F64));
  EXPECT_EQ(argmax(n, 1).to_vector(), (std::vector<double>{1, 0}));
  std::vector<double> m = max(n, 1).to_vector();
  EXPECT_TRUE(std::isnan(m[0]));
  EXPECT_TRUE(std::isnan(m[1]));
}

TEST(MaxArgmax, Errors) {
  std::string msg = error_of([] { max(Tensor::zeros({3, 0}), 1); });
  EXPECT_HAS(msg, "max");
  EXPECT_HAS(msg, "[3, 0]");
  EXPECT_HAS(error_of([] { argmax(Tensor::zeros({3, 2}), 2); }), "argmax");
  // A 0-d tensor has no dim to reduce: an error, never a read past the shape.
  EXPECT_HAS(error_of([] { max(Tensor::scalar(1.0), 0); }), "max");
  EXPECT_HAS(error_of([] { argmax(Tensor::scalar(1.0), 0); }), "argmax");
}

// ---------------------------------------------------------------- topk

TEST(TopK, ValuesAndIndicesSortedAlongAnyDim) {
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor x = transpose(uni({9, 4, 3}, 6, dt), 0, 2);  // [3, 4, 9], strided
    for (int64_t dim : {-1, 0, 1}) {
      for (bool largest : {true, false}) {
        int64_t d = dim < 0 ? dim + 3 : dim;
        for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{2}, x.shape()[d]}) {
          auto [vals, idx] = topk(x, k, dim, largest);
          Shape want_shape = x.shape();
          want_shape[d] = k;
          ASSERT_EQ(vals.shape(), want_shape);
          ASSERT_EQ(idx.shape(), want_shape);
          EXPECT_EQ(idx.dtype(), DType::I64);
          std::vector<double> v = x.to_vector(), vv = vals.to_vector(), iv = idx.to_vector();
          Shape kept = x.shape();
          kept[d] = 1;
          for (int64_t o = 0; o < shape_numel(kept); ++o) {
            std::vector<int64_t> c = coords_of(o, kept);
            std::vector<std::pair<double, int64_t>> row;
            for (int64_t r = 0; r < x.shape()[d]; ++r) {
              c[d] = r;
              row.push_back({v[(c[0] * 4 + c[1]) * 9 + c[2]], r});
            }
            std::stable_sort(row.begin(), row.end(), [&](auto& a, auto& b) {
              return largest ? a.first > b.first : a.first < b.first;
            });
            for (int64_t j = 0; j < k; ++j) {
              c[d] = j;
              Shape ws = want_shape;
              int64_t flat = (c[0] * ws[1] + c[1]) * ws[2] + c[2];
              EXPECT_EQ(vv[flat], row[j].first);
              EXPECT_EQ(iv[flat], row[j].second);
            }
          }
        }
      }
    }
  }
}

TEST(TopK, TiesKeepIndexOrder) {
  Tensor t = Tensor::from_vector(std::vector<double>{2, 5, 2, 5, 1}, {5}, opts(DType::F64));
  auto [v, i] = topk(t, 3);
  EXPECT_EQ(v.to_vector(), (std::vector<double>{5, 5, 2}));
  EXPECT_EQ(i.to_vector(), (std::vector<double>{1, 3, 0}));
  auto [vs, is] = topk(t, 3, -1, false);
  EXPECT_EQ(vs.to_vector(), (std::vector<double>{1, 2, 2}));
  EXPECT_EQ(is.to_vector(), (std::vector<double>{4, 0, 2}));
}

TEST(TopK, NaNIsTheLargestValueAsInArgmax) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor t = Tensor::from_vector(std::vector<double>{1, nan, 3, -2, nan}, {5}, opts(DType::F64));
  auto [v, i] = topk(t, 3);
  std::vector<double> vv = v.to_vector();
  EXPECT_TRUE(std::isnan(vv[0]));
  EXPECT_TRUE(std::isnan(vv[1]));
  EXPECT_EQ(vv[2], 3);
  EXPECT_EQ(i.to_vector(), (std::vector<double>{1, 4, 2}));
  auto [vs, is] = topk(t, 3, -1, false);
  EXPECT_EQ(vs.to_vector(), (std::vector<double>{-2, 1, 3}));
  EXPECT_EQ(is.to_vector(), (std::vector<double>{3, 0, 2}));
  // A long row with many NaNs sorts consistently (an inconsistent comparator is undefined).
  std::vector<double> row(257);
  for (int j = 0; j < 257; ++j) row[j] = j % 3 == 0 ? nan : std::sin(j);
  auto [lv, li] = topk(Tensor::from_vector(row, {257}, opts(DType::F64)), 257);
  std::vector<double> lvv = lv.to_vector();
  for (int j = 0; j < 86; ++j) EXPECT_TRUE(std::isnan(lvv[j])) << j;
  for (int j = 87; j < 257; ++j) EXPECT_GE(lvv[j - 1], lvv[j]) << j;
}

TEST(TopK, ErrorsNameKAndTheDim) {
  std::string msg = error_of([] { topk(Tensor::zeros({3, 4}), 5); });
  EXPECT_HAS(msg, "topk");
  EXPECT_HAS(msg, "k = 5");
  EXPECT_HAS(msg, "size 4");
  EXPECT_HAS(error_of([] { topk(Tensor::zeros({3, 4}), -1); }), "k = -1");
  EXPECT_HAS(error_of([] { topk(Tensor::zeros({3, 4}), 1, 2); }), "topk");
  EXPECT_HAS(error_of([] { topk(Tensor::scalar(1.0), 1); }), "topk");
}

// ---------------------------------------------------------------- gradcheck (f64)

TEST(ReduceGrad, SumAndMeanOverEveryDimSet) {
  for (const ReduceCase& c : kReduceCases) {
    Tensor x = uni({3, 4, 5}, 11, DType::F64, true);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return sum(in[0], c.dims, c.keepdim); },
                     {x}, "sum " + shape_str(c.dims));
    expect_gradcheck([&](const std::vector<Tensor>& in) { return mean(in[0], c.dims, c.keepdim); },
                     {x}, "mean " + shape_str(c.dims));
  }
  Tensor s0 = uni({}, 13, DType::F64, true);
  expect_gradcheck([](const std::vector<Tensor>& in) { return mean(in[0], {0}); }, {s0},
                   "mean of a scalar");
  Tensor xt = uni({5, 3}, 12, DType::F64, true);
  expect_gradcheck([](const std::vector<Tensor>& in) { return mean(transpose(in[0], 0, 1), {1}); },
                   {xt}, "mean of a transposed view");
}

TEST(ReduceGrad, MaxAlongEachDim) {
  // Distinct values, so the argmax is stable under the finite-difference step.
  std::vector<double> v(60);
  for (int i = 0; i < 60; ++i) v[i] = std::sin(1.7 * i + 0.3) * 3 + 0.01 * i;
  Tensor x = Tensor::from_vector(v, {3, 4, 5}, opts(DType::F64, true));
  for (int64_t dim : {0, 1, 2, -1})
    for (bool keep : {false, true})
      expect_gradcheck([&](const std::vector<Tensor>& in) { return max(in[0], dim, keep); }, {x},
                       "max dim " + std::to_string(dim));
}

TEST(ReduceGrad, TopKValues) {
  std::vector<double> v(42);
  for (int i = 0; i < 42; ++i) v[i] = std::cos(2.3 * i + 0.1) * 2 + 0.001 * i;
  Tensor x = Tensor::from_vector(v, {6, 7}, opts(DType::F64, true));
  for (int64_t dim : {0, 1})
    for (bool largest : {true, false})
      for (int64_t k : {1, 3})
        expect_gradcheck(
            [&](const std::vector<Tensor>& in) { return topk(in[0], k, dim, largest).first; }, {x},
            "topk k " + std::to_string(k) + " dim " + std::to_string(dim));
}

}  // namespace
}  // namespace hap
