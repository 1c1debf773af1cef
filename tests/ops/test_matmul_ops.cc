// matmul and linear against naive triple loops in double: odd sizes, transposed and sliced views
// (the layouts GEMM reads without copying and the ones it cannot), batched products with
// broadcast batch dims, 2-D x 3-D and 3-D x 2-D, 1-D promotion, empty dims; errors; gradcheck.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
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

// Row-major index of `coord` (aligned to the right of out's rank) in a tensor of shape s,
// with broadcasting: size-1 dims of s read index 0.
int64_t broadcast_index(const Shape& s, const std::vector<int64_t>& coord) {
  int64_t k = static_cast<int64_t>(s.size()), nd = static_cast<int64_t>(coord.size()), idx = 0;
  for (int64_t d = 0; d < k; ++d) idx = idx * s[d] + (s[d] == 1 ? 0 : coord[d + nd - k]);
  return idx;
}

// Naive batched matmul in double with NumPy broadcasting of the batch dims (both operands >= 2-D).
std::vector<double> ref_matmul(const Tensor& a, const Tensor& b, Shape* out_shape = nullptr) {
  std::vector<double> va = a.to_vector(), vb = b.to_vector();
  const Shape &sa = a.shape(), &sb = b.shape();
  int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch = broadcast_shapes(ba, bb, "ref");
  int64_t nb = shape_numel(batch), nd = static_cast<int64_t>(batch.size());
  std::vector<double> out(nb * m * n, 0.0);
  for (int64_t i = 0; i < nb; ++i) {
    std::vector<int64_t> coord(nd);
    for (int64_t d = nd - 1, rem = i; d >= 0; --d) {
      coord[d] = rem % batch[d];
      rem /= batch[d];
    }
    int64_t ia = broadcast_index(ba, coord), ib = broadcast_index(bb, coord);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < k; ++j) acc += va[(ia * m + r) * k + j] * vb[(ib * k + j) * n + c];
        out[(i * m + r) * n + c] = acc;
      }
  }
  if (out_shape) {
    *out_shape = batch;
    out_shape->push_back(m);
    out_shape->push_back(n);
  }
  return out;
}

// y[..., o] = sum_i x[..., i] w[o, i] + b[o]
std::vector<double> ref_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  std::vector<double> vx = x.to_vector(), vw = w.to_vector(), vb;
  if (b.defined()) vb = b.to_vector();
  int64_t k = x.shape().back(), n = w.shape()[0];
  int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  std::vector<double> out(rows * n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < n; ++o) {
      double acc = b.defined() ? vb[o] : 0.0;
      for (int64_t i = 0; i < k; ++i) acc += vx[r * k + i] * vw[o * k + i];
      out[r * n + o] = acc;
    }
  return out;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
}

double tol_for(DType dt) { return dt == DType::F64 ? 1e-12 : 2e-5; }

void check_matmul(const Tensor& a, const Tensor& b, const std::string& what) {
  Shape want_shape;
  std::vector<double> want = ref_matmul(a, b, &want_shape);
  Tensor y = matmul(a, b);
  EXPECT_EQ(y.shape(), want_shape) << what;
  EXPECT_EQ(y.dtype(), a.dtype()) << what;
  expect_close(y.to_vector(), want, tol_for(a.dtype()), what + " " + dtype_name(a.dtype()));
}

void expect_gradcheck(const Fn& f, const std::vector<Tensor>& inputs, const std::string& what) {
  autograd::GradcheckResult r = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

// ---------------------------------------------------------------- matmul forward

TEST(MatMul, TwoDimOddSizes) {
  for (DType dt : {DType::F64, DType::F32}) {
    check_matmul(uni({7, 5}, 1, dt), uni({5, 9}, 2, dt), "[7,5]x[5,9]");
    check_matmul(uni({1, 13}, 3, dt), uni({13, 1}, 4, dt), "row x column");
    check_matmul(uni({13, 1}, 5, dt), uni({1, 11}, 6, dt), "outer product");
    check_matmul(uni({65, 33}, 7, dt), uni({33, 129}, 8, dt), "larger");
  }
}

TEST(MatMul, TransposedAndSlicedViewsWithoutCopies) {
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor at = transpose(uni({5, 7}, 11, dt), 0, 1);  // [7, 5], column-major
    Tensor bt = transpose(uni({9, 5}, 12, dt), 0, 1);  // [5, 9], column-major
    Tensor a = uni({7, 5}, 13, dt), b = uni({5, 9}, 14, dt);
    check_matmul(at, b, "a^T b");
    check_matmul(a, bt, "a b^T");
    check_matmul(at, bt, "a^T b^T");
    // Column slices: rows with a leading dimension larger than the row length.
    Tensor as = slice(uni({7, 12}, 15, dt), 1, 3, 8);   // [7, 5], ld 12
    Tensor bs = slice(uni({5, 20}, 16, dt), 1, 4, 13);  // [5, 9], ld 20
    check_matmul(as, bs, "sliced columns");
    // Slices of transposed storage.
    Tensor ats = slice(transpose(uni({8, 7}, 17, dt), 0, 1), 1, 2, 7);  // [7, 5], trans ld 7
    check_matmul(ats, bs, "sliced transposed");
    // Views with a large leading dimension, row-major and column-major.
    Tensor strided = reshape(slice(uni({7, 2, 5}, 19, dt), 1, 0, 1), {7, 5});  // strides [10, 1]
    check_matmul(strided, b, "row stride 10");
    Tensor cm =
        reshape(slice(permute(uni({5, 2, 7}, 20, dt), {2, 1, 0}), 1, 1, 2), {7, 5});  // [1, 14]
    check_matmul(cm, b, "column-major with ld 14");
    // Layouts BLAS cannot read, copied first: an expanded (stride 0) operand, and one strided in
    // both dims.
    Tensor ae = expand(uni({1, 5}, 18, dt), {7, 5});
    check_matmul(ae, b, "expanded rows");
    Tensor both =
        reshape(slice(slice(uni({7, 2, 5, 2}, 21, dt), 1, 0, 1), 3, 1, 2), {7, 5});  // [20, 2]
    ASSERT_EQ(both.strides(), (Strides{20, 2}));
    check_matmul(both, b, "strided in both dims");
    Tensor rhs =
        reshape(slice(slice(uni({5, 2, 9, 2}, 22, dt), 1, 0, 1), 3, 0, 1), {5, 9});  // [36, 2]
    check_matmul(a, rhs, "rhs strided in both dims");
  }
}

TEST(MatMul, BatchedWithBroadcastBatchDims) {
  for (DType dt : {DType::F64, DType::F32}) {
    check_matmul(uni({4, 7, 5}, 21, dt), uni({4, 5, 3}, 22, dt), "same batch");
    check_matmul(uni({2, 1, 7, 5}, 23, dt), uni({3, 5, 6}, 24, dt), "broadcast [2,1] x [3]");
    check_matmul(uni({1, 7, 5}, 25, dt), uni({4, 5, 6}, 26, dt), "broadcast 1 x 4");
    check_matmul(uni({2, 3, 4, 5}, 27, dt), uni({1, 3, 5, 2}, 28, dt), "4-D");
    // Batch of transposed matrices (permuted batch and matrix dims).
    Tensor ap = permute(uni({5, 3, 7}, 29, dt), {1, 2, 0});  // [3, 7, 5]
    Tensor bp = permute(uni({3, 6, 5}, 30, dt), {0, 2, 1});  // [3, 5, 6]
    check_matmul(ap, bp, "permuted batches");
    // An expanded batch dim (stride 0) on one side.
    check_matmul(expand(uni({1, 7, 5}, 31, dt), {4, 7, 5}), uni({4, 5, 3}, 32, dt),
                 "expanded batch");
  }
}

TEST(MatMul, TwoDimTimesThreeDimAndBack) {
  for (DType dt : {DType::F64, DType::F32}) {
    check_matmul(uni({7, 5}, 41, dt), uni({4, 5, 3}, 42, dt), "2-D x 3-D");
    check_matmul(uni({4, 7, 5}, 43, dt), uni({5, 3}, 44, dt), "3-D x 2-D (batch folded into rows)");
    check_matmul(uni({2, 3, 7, 5}, 45, dt), uni({5, 3}, 46, dt), "4-D x 2-D");
    // Folded path with a non-contiguous 3-D operand and a transposed 2-D one.
    check_matmul(transpose(uni({7, 4, 5}, 47, dt), 0, 1), transpose(uni({3, 5}, 48, dt), 0, 1),
                 "strided 3-D x transposed 2-D");
  }
}

TEST(MatMul, OneDimOperandsArePromotedAsDocumented) {
  // functional.h: "Matrix product with NumPy semantics: 1-D operands are promoted".
  Tensor v = uni({5}, 51), m = uni({5, 3}, 52), mt = uni({4, 5}, 53), bm = uni({2, 5, 3}, 54);
  Tensor vm = matmul(v, m);
  EXPECT_EQ(vm.shape(), (Shape{3}));
  expect_close(vm.to_vector(), ref_matmul(reshape(v, {1, 5}), m), 1e-12, "vector x matrix");
  Tensor mv = matmul(mt, v);
  EXPECT_EQ(mv.shape(), (Shape{4}));
  expect_close(mv.to_vector(), ref_matmul(mt, reshape(v, {5, 1})), 1e-12, "matrix x vector");
  Tensor vv = matmul(v, v);
  EXPECT_EQ(vv.shape(), Shape{});
  expect_close(vv.to_vector(), ref_matmul(reshape(v, {1, 5}), reshape(v, {5, 1})), 1e-12, "dot");
  Tensor vb = matmul(v, bm);
  EXPECT_EQ(vb.shape(), (Shape{2, 3}));
  expect_close(vb.to_vector(), ref_matmul(reshape(v, {1, 5}), bm), 1e-12, "vector x batch");
}

TEST(MatMul, EmptyDims) {
  Tensor z = matmul(uni({3, 0}, 61), uni({0, 4}, 62));
  EXPECT_EQ(z.shape(), (Shape{3, 4}));
  for (double v : z.to_vector()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(matmul(uni({0, 5}, 63), uni({5, 4}, 64)).shape(), (Shape{0, 4}));
  EXPECT_EQ(matmul(uni({2, 0, 5}, 65), uni({5, 4}, 66)).shape(), (Shape{2, 0, 4}));
  Tensor zb = matmul(uni({2, 3, 0}, 67), uni({2, 0, 4}, 68));
  for (double v : zb.to_vector()) EXPECT_EQ(v, 0.0);
}

TEST(MatMul, ErrorsNameTheShapes) {
  std::string msg = error_of([] { matmul(uni({3, 4}, 1), uni({5, 6}, 2)); });
  EXPECT_HAS(msg, "matmul");
  EXPECT_HAS(msg, "[3, 4]");
  EXPECT_HAS(msg, "[5, 6]");
  msg = error_of([] { matmul(uni({2, 3, 4}, 1), uni({3, 4, 5}, 2)); });
  EXPECT_HAS(msg, "matmul");
  EXPECT_HAS(msg, "[2]");
  EXPECT_HAS(msg, "[3]");
  msg = error_of([] { matmul(uni({3, 4}, 1), uni({4, 5}, 2, DType::F32)); });
  EXPECT_HAS(msg, "f64");
  EXPECT_HAS(msg, "f32");
  msg = error_of([] { matmul(Tensor::scalar(1.0), uni({4, 5}, 2)); });
  EXPECT_HAS(msg, "matmul");
}

// ---------------------------------------------------------------- linear forward

TEST(Linear, WithAndWithoutBias) {
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor x = uni({2, 3, 5}, 71, dt), w = uni({4, 5}, 72, dt), b = uni({4}, 73, dt);
    Tensor y = linear(x, w, b);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
    expect_close(y.to_vector(), ref_linear(x, w, b), tol_for(dt), "linear with bias");
    Tensor y0 = linear(x, w);
    expect_close(y0.to_vector(), ref_linear(x, w, Tensor()), tol_for(dt), "linear without bias");
    Tensor x1 = uni({5}, 74, dt);
    EXPECT_EQ(linear(x1, w, b).shape(), (Shape{4}));
    expect_close(linear(x1, w, b).to_vector(), ref_linear(x1, w, b), tol_for(dt), "1-D input");
  }
}

TEST(Linear, StridedInputsWeightsAndBias) {
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor x = transpose(uni({5, 3, 7}, 81, dt), 0, 2);  // [7, 3, 5], non-contiguous
    Tensor w = transpose(uni({5, 4}, 82, dt), 0, 1);     // [4, 5], column-major weight
    Tensor b = slice(uni({9}, 83, dt), 0, 2, 6);         // offset view
    expect_close(linear(x, w, b).to_vector(), ref_linear(x, w, b), tol_for(dt), "strided");
    Tensor ws = slice(uni({4, 11}, 84, dt), 1, 3, 8);  // [4, 5], ld 11
    expect_close(linear(x, ws, b).to_vector(), ref_linear(x, ws, b), tol_for(dt), "sliced weight");
    Tensor be = expand(uni({1}, 85, dt), {4});  // stride-0 bias
    expect_close(linear(x, ws, be).to_vector(), ref_linear(x, ws, be), tol_for(dt),
                 "expanded bias");
  }
}

TEST(Linear, EmptyInputsAndFeatures) {
  Tensor w = uni({4, 0}, 91), b = uni({4}, 92);
  Tensor y = linear(uni({3, 0}, 93), w, b);
  EXPECT_EQ(y.shape(), (Shape{3, 4}));
  expect_close(y.to_vector(), ref_linear(uni({3, 0}, 93), w, b), 0, "k = 0 gives the bias");
  Tensor y0 = linear(uni({3, 0}, 93), w);
  for (double v : y0.to_vector()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(linear(uni({0, 5}, 94), uni({4, 5}, 95), b).shape(), (Shape{0, 4}));
}

// A rank holding none of a column-parallel Linear's output features: w [0, k]. Forward gives
// [..., 0]; backward gives zero input gradients and empty weight and bias gradients.
TEST(Linear, BackwardWithNoOutputFeatures) {
  Tensor x = uni({2, 3, 5}, 96), w = uni({0, 5}, 97), b = uni({0}, 98);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 0}));
  (sum(y) + sum(x)).backward();
  ASSERT_TRUE(x.grad().defined());
  for (double v : x.grad().to_vector()) EXPECT_EQ(v, 1.0);  // only the sum(x) term
  EXPECT_EQ(w.grad().shape(), (Shape{0, 5}));
  EXPECT_EQ(b.grad().shape(), (Shape{0}));
  // The same through matmul with a 2-D right operand (its backward flattens the batch too).
  Tensor a = uni({2, 3, 5}, 99), m = uni({5, 0}, 100);
  a.set_requires_grad(true);
  m.set_requires_grad(true);
  (sum(matmul(a, m)) + sum(a)).backward();
  EXPECT_EQ(m.grad().shape(), (Shape{5, 0}));
  for (double v : a.grad().to_vector()) EXPECT_EQ(v, 1.0);
}

TEST(Linear, ErrorsNameShapesAndExpectations) {
  std::string msg = error_of([] { linear(uni({3, 5}, 1), uni({4, 6}, 2)); });
  EXPECT_HAS(msg, "linear");
  EXPECT_HAS(msg, "[3, 5]");
  EXPECT_HAS(msg, "[4, 6]");
  msg = error_of([] { linear(uni({3, 5}, 1), uni({4, 5, 1}, 2)); });
  EXPECT_HAS(msg, "[out, in]");
  msg = error_of([] { linear(uni({3, 5}, 1), uni({4, 5}, 2), uni({5}, 3)); });
  EXPECT_HAS(msg, "bias");
  EXPECT_HAS(msg, "[5]");
  EXPECT_HAS(msg, "[4]");
  msg = error_of([] { linear(uni({3, 5}, 1), uni({4, 5}, 2), uni({4}, 3, DType::F32)); });
  EXPECT_HAS(msg, "linear");
  EXPECT_HAS(msg, "f32");
  EXPECT_HAS(msg, "f64");
  msg = error_of([] { linear(Tensor::scalar(1.0, opts(DType::F64)), uni({4, 1}, 2)); });
  EXPECT_HAS(msg, "scalar");
}

// ---------------------------------------------------------------- gradcheck (f64)

TEST(MatMulGrad, AllShapeCombinations) {
  struct Case {
    Shape a, b;
  };
  for (const Case& c : std::vector<Case>{{{3, 4}, {4, 5}},
                                         {{2, 3, 4}, {2, 4, 5}},
                                         {{2, 1, 3, 4}, {3, 4, 2}},
                                         {{3, 4}, {2, 4, 5}},
                                         {{2, 3, 4}, {4, 5}},
                                         {{4}, {4, 3}},
                                         {{3, 4}, {4}},
                                         {{4}, {4}}}) {
    Tensor a = uni(c.a, 101, DType::F64, true), b = uni(c.b, 102, DType::F64, true);
    expect_gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b},
                     "matmul " + shape_str(c.a) + " x " + shape_str(c.b));
  }
}

TEST(MatMulGrad, TransposedOperands) {
  Tensor a = uni({4, 3}, 103, DType::F64, true), b = uni({5, 4}, 104, DType::F64, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return matmul(transpose(in[0], 0, 1), transpose(in[1], 0, 1));
      },
      {a, b}, "a^T b^T");
  Tensor c = uni({2, 4, 3}, 105, DType::F64, true), d = uni({4, 5}, 106, DType::F64, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return matmul(transpose(in[0], 1, 2), in[1]); }, {c, d},
      "permuted 3-D x 2-D");
}

TEST(LinearGrad, WithAndWithoutBias) {
  Tensor x = uni({2, 3, 4}, 111, DType::F64, true), w = uni({5, 4}, 112, DType::F64, true),
         b = uni({5}, 113, DType::F64, true);
  expect_gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                   {x, w, b}, "with bias");
  expect_gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1]); }, {x, w},
                   "without bias");
  Tensor x1 = uni({4}, 114, DType::F64, true);
  expect_gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); },
                   {x1, w, b}, "1-D input");
  // Only the weight requires grad (frozen input), and a transposed weight view.
  Tensor xf = uni({3, 4}, 115);
  Tensor wt = uni({4, 5}, 116, DType::F64, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return linear(in[0], transpose(in[1], 0, 1), in[2]); },
      {xf, wt, b}, "transposed weight, frozen input");
}

}  // namespace
}  // namespace hap
