// Shape ops: which results are views sharing the input's storage and which are copies, values
// against index arithmetic in the test, reshape of non-contiguous inputs, errors that name the op
// and the shapes, and gradcheck in f64 of reshape, permute, slice, expand, concat, split and
// contiguous (plus the wrappers built on them).
#include <gtest/gtest.h>

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

// 0, 1, 2, ... in the given shape (f64), so values name their own position.
Tensor iota(const Shape& s, bool rg = false) {
  std::vector<double> v(shape_numel(s));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  return Tensor::from_vector(v, s, opts(DType::F64, rg));
}

Tensor uni(const Shape& s, uint64_t seed, bool rg = false) {
  Tensor t = Tensor::empty(s, opts(DType::F64));
  fill_uniform(t, seed, 0, -1.0, 1.0);
  if (rg) t.set_requires_grad(true);
  return t;
}

// Whether two tensors view the same storage (one's data pointer lies in the other's block).
bool shares_storage(const Tensor& a, const Tensor& b) {
  return a.impl()->storage && a.impl()->storage == b.impl()->storage;
}

void expect_gradcheck(const Fn& f, const std::vector<Tensor>& inputs, const std::string& what) {
  autograd::GradcheckResult r = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

std::vector<double> permuted_values(const Tensor& x, const std::vector<int64_t>& perm) {
  // out[i0, i1, ...] = x[j] where j's dim perm[k] coordinate is i_k.
  Shape s;
  for (int64_t p : perm) s.push_back(x.shape()[p]);
  std::vector<double> v = x.to_vector(), out(v.size());
  Strides st = contiguous_strides(x.shape());
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    int64_t rem = i, src = 0;
    for (int64_t k = static_cast<int64_t>(s.size()) - 1; k >= 0; --k) {
      src += (rem % s[k]) * st[perm[k]];
      rem /= s[k];
    }
    out[i] = v[src];
  }
  return out;
}

// ---------------------------------------------------------------- reshape / view

TEST(Reshape, ContiguousInputsGiveViewsSharingStorage) {
  Tensor x = iota({2, 3, 4});
  Tensor y = reshape(x, {4, -1});
  EXPECT_EQ(y.shape(), (Shape{4, 6}));
  EXPECT_TRUE(shares_storage(x, y));
  EXPECT_EQ(y.raw_data(), x.raw_data());
  EXPECT_EQ(y.to_vector(), x.to_vector());
  y.fill_(1);  // writes through to x
  EXPECT_EQ(x.item_at(23), 1.0);
  EXPECT_EQ(view(x, {24}).shape(), (Shape{24}));
  EXPECT_EQ(reshape(x, {-1}).shape(), (Shape{24}));
  EXPECT_EQ(reshape(Tensor::scalar(2.0), {1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(reshape(iota({1}), {}).shape(), Shape{});
  EXPECT_EQ(reshape(Tensor::zeros({0, 3}), {3, 0, 5}).shape(), (Shape{3, 0, 5}));
}

TEST(Reshape, NonContiguousInputsViewWhenTheLayoutAllowsElseCopy) {
  // A transpose cannot be flattened without a copy: the values must follow logical order.
  Tensor x = iota({3, 4});
  Tensor xt = transpose(x, 0, 1);  // [4, 3]
  Tensor flat = reshape(xt, {12});
  EXPECT_FALSE(shares_storage(flat, x));
  EXPECT_EQ(flat.to_vector(), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  Tensor r = reshape(xt, {2, 6});
  EXPECT_EQ(r.to_vector(), flat.to_vector());
  // Splitting or adding unit dims of a transpose keeps it a view.
  Tensor u = reshape(xt, {2, 2, 3});
  EXPECT_TRUE(shares_storage(u, x));
  EXPECT_EQ(u.to_vector(), flat.to_vector());
  Tensor v = reshape(xt, {4, 1, 3});
  EXPECT_TRUE(shares_storage(v, x));
  EXPECT_EQ(v.to_vector(), flat.to_vector());
  // A row slice [1:3] of a [4, 6] tensor, merged with a split of its columns: a view.
  Tensor y = iota({4, 6});
  Tensor s = slice(y, 0, 1, 3);
  Tensor sv = reshape(s, {2, 2, 3});
  EXPECT_TRUE(shares_storage(sv, y));
  EXPECT_EQ(sv.to_vector(), s.to_vector());
  // A column slice cannot merge rows: a copy, with the right values.
  Tensor c = slice(y, 1, 2, 5);  // [4, 3]
  Tensor cf = reshape(c, {12});
  EXPECT_FALSE(shares_storage(cf, y));
  std::vector<double> want;
  for (int r0 = 0; r0 < 4; ++r0)
    for (int c0 = 2; c0 < 5; ++c0) want.push_back(r0 * 6 + c0);
  EXPECT_EQ(cf.to_vector(), want);
  // An expanded (stride 0) input reshapes by copying, giving repeated values.
  Tensor e = expand(iota({1, 3}), {2, 3});
  EXPECT_EQ(reshape(e, {6}).to_vector(), (std::vector<double>{0, 1, 2, 0, 1, 2}));
  // Permuted 3-D, reshaped to merge the last two dims: copy; and the first two: a view.
  Tensor z = permute(iota({2, 3, 4}), {1, 0, 2});  // [3, 2, 4] strides [4, 12, 1]
  EXPECT_EQ(reshape(z, {3, 8}).to_vector(), permuted_values(iota({2, 3, 4}), {1, 0, 2}));
  EXPECT_TRUE(shares_storage(reshape(z, {3, 2, 2, 2}), z));
  EXPECT_EQ(reshape(z, {6, 4}).to_vector(), permuted_values(iota({2, 3, 4}), {1, 0, 2}));
}

TEST(Reshape, ErrorsNameBothShapes) {
  Tensor x = iota({2, 3});
  std::string msg = error_of([&] { reshape(x, {4, 2}); });
  EXPECT_HAS(msg, "reshape");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(msg, "[4, 2]");
  EXPECT_HAS(error_of([&] { reshape(x, {-1, -1}); }), "only one dim");
  EXPECT_HAS(error_of([&] { reshape(x, {4, -1}); }), "[4, -1]");
  EXPECT_HAS(error_of([&] { reshape(x, {-2, -3}); }), "-2");
  EXPECT_HAS(error_of([&] { reshape(Tensor::zeros({0, 3}), {0, -1}); }), "reshape");
}

// ---------------------------------------------------------------- permute / transpose

TEST(Permute, ValuesAndSharedStorage) {
  Tensor x = iota({2, 3, 4});
  for (const std::vector<int64_t>& p :
       std::vector<std::vector<int64_t>>{{2, 0, 1}, {1, 2, 0}, {0, 2, 1}, {-1, 0, 1}}) {
    Tensor y = permute(x, p);
    std::vector<int64_t> pp = p;
    for (int64_t& d : pp) d = d < 0 ? d + 3 : d;
    EXPECT_TRUE(shares_storage(x, y));
    EXPECT_EQ(y.to_vector(), permuted_values(x, pp));
  }
  Tensor t = transpose(x, -1, 0);
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.to_vector(), permuted_values(x, {2, 1, 0}));
  EXPECT_TRUE(shares_storage(t, x));
}

TEST(Permute, Errors) {
  Tensor x = iota({2, 3, 4});
  std::string msg = error_of([&] { permute(x, {0, 0, 1}); });
  EXPECT_HAS(msg, "permute");
  EXPECT_HAS(msg, "twice");
  EXPECT_HAS(error_of([&] { permute(x, {0, 1}); }), "2 dims given");
  EXPECT_HAS(error_of([&] { permute(x, {0, 1, 3}); }), "3");
  EXPECT_HAS(error_of([&] { transpose(x, 0, 3); }), "transpose");
  EXPECT_HAS(error_of([] { transpose(Tensor::scalar(1.0), 0, 0); }), "transpose");
}

// ---------------------------------------------------------------- slice / narrow

TEST(Slice, ViewsWithOffsetsAndNegativeBounds) {
  Tensor x = iota({4, 5});
  Tensor s = slice(x, 1, 1, 4);
  EXPECT_EQ(s.shape(), (Shape{4, 3}));
  EXPECT_TRUE(shares_storage(s, x));
  EXPECT_EQ(s.to_vector(), (std::vector<double>{1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18}));
  EXPECT_EQ(slice(x, 0, -2, 4).to_vector(),
            (std::vector<double>{10, 11, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(slice(x, -1, 0, -3).to_vector(), (std::vector<double>{0, 1, 5, 6, 10, 11, 15, 16}));
  EXPECT_EQ(slice(x, 0, 2, 2).shape(), (Shape{0, 5}));
  EXPECT_EQ(narrow(x, 0, 1, 2).to_vector(), slice(x, 0, 1, 3).to_vector());
  // Slices of slices of transposes.
  Tensor t = slice(slice(transpose(x, 0, 1), 0, 1, 5), 1, 2, 4);  // [4, 2]
  EXPECT_EQ(t.to_vector(), (std::vector<double>{11, 16, 12, 17, 13, 18, 14, 19}));
  // Writes through the view land in the input.
  s.fill_(-1);
  EXPECT_EQ(x.item_at(1), -1);
  EXPECT_EQ(x.item_at(0), 0);
}

TEST(Slice, OutOfBoundsRangesNameTheDimAndShape) {
  Tensor x = iota({4, 5});
  std::string msg = error_of([&] { slice(x, 1, 2, 7); });
  EXPECT_HAS(msg, "slice");
  EXPECT_HAS(msg, "[2, 7)");
  EXPECT_HAS(msg, "[4, 5]");
  EXPECT_HAS(error_of([&] { slice(x, 0, 3, 2); }), "[3, 2)");
  EXPECT_HAS(error_of([&] { slice(x, 2, 0, 1); }), "slice dim");
  EXPECT_HAS(error_of([&] { narrow(x, 0, 1, -1); }), "length");
  EXPECT_HAS(error_of([&] { slice(x, 0, -9, 2); }), "slice");
  EXPECT_HAS(error_of([] { slice(Tensor::scalar(1.0), 0, 0, 1); }), "slice");
  EXPECT_HAS(error_of([] { narrow(Tensor::scalar(1.0), 0, 0, 1); }), "slice");
}

// ---------------------------------------------------------------- expand

TEST(Expand, BroadcastViewsWithStrideZero) {
  Tensor x = iota({3, 1});
  Tensor e = expand(x, {2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(shares_storage(e, x));
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(e.strides()[2], 0);
  std::vector<double> v = e.to_vector();
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(v[i], (i / 4) % 3);
  EXPECT_EQ(expand(x, {-1, 2}).shape(), (Shape{3, 2}));
  EXPECT_EQ(expand(x, {3, 1}).to_vector(), x.to_vector());
  EXPECT_EQ(expand(x, {0, 3, 1}).shape(), (Shape{0, 3, 1}));
}

TEST(Expand, IncompatibleOrNegativeSizesAreErrors) {
  Tensor x = iota({3, 1});
  std::string msg = error_of([&] { expand(x, {4, 2}); });
  EXPECT_HAS(msg, "expand");
  EXPECT_HAS(msg, "[3, 1]");
  EXPECT_HAS(msg, "[4, 2]");
  EXPECT_HAS(error_of([&] { expand(x, {3}); }), "fewer dims");
  // Negative sizes other than a -1 on an existing dim must not produce a tensor.
  EXPECT_HAS(error_of([&] { expand(x, {3, -2}); }), "expand");
  EXPECT_HAS(error_of([&] { expand(x, {-1, 3, 2}); }), "expand");
}

// ---------------------------------------------------------------- unsqueeze / squeeze / flatten

TEST(Squeeze, UnsqueezeSqueezeAndFlattenAreViews) {
  Tensor x = iota({2, 3, 4});
  EXPECT_EQ(unsqueeze(x, 0).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(unsqueeze(x, 3).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(unsqueeze(x, -1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(unsqueeze(x, -4).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(unsqueeze(Tensor::scalar(1.0), 0).shape(), (Shape{1}));
  EXPECT_TRUE(shares_storage(unsqueeze(x, 1), x));
  Tensor u = unsqueeze(x, 2);
  EXPECT_EQ(squeeze(u, 2).shape(), x.shape());
  EXPECT_EQ(squeeze(u, -2).shape(), x.shape());
  EXPECT_EQ(flatten(x).shape(), (Shape{24}));
  EXPECT_EQ(flatten(x, 1).shape(), (Shape{2, 12}));
  EXPECT_EQ(flatten(x, 0, 1).shape(), (Shape{6, 4}));
  EXPECT_EQ(flatten(x, -2, -1).shape(), (Shape{2, 12}));
  EXPECT_EQ(flatten(Tensor::scalar(1.0)).shape(), (Shape{1}));
  EXPECT_TRUE(shares_storage(flatten(x), x));
  // Of a transposed input: unsqueeze is a view; flatten copies in logical order.
  Tensor xt = transpose(x, 1, 2);
  EXPECT_TRUE(shares_storage(unsqueeze(xt, 1), x));
  EXPECT_EQ(unsqueeze(xt, 1).to_vector(), xt.to_vector());
  EXPECT_EQ(flatten(xt).to_vector(), permuted_values(x, {0, 2, 1}));
  EXPECT_EQ(squeeze(unsqueeze(xt, 3), 3).to_vector(), xt.to_vector());
}

TEST(Squeeze, Errors) {
  Tensor x = iota({2, 3});
  std::string msg = error_of([&] { squeeze(x, 1); });
  EXPECT_HAS(msg, "squeeze");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(error_of([&] { unsqueeze(x, 3); }), "unsqueeze");
  EXPECT_HAS(error_of([&] { flatten(x, 1, 0); }), "flatten");
  EXPECT_HAS(error_of([] { squeeze(Tensor::scalar(1.0), 0); }), "squeeze");
}

// ---------------------------------------------------------------- concat / split / chunk

TEST(Concat, AlongEachDimWithStridedInputs) {
  Tensor a = iota({2, 3, 4});
  Tensor b = transpose(uni({2, 5, 3}, 1), 1, 2);  // [2, 3, 5]... used along dim 2
  Tensor c = mul(iota({2, 3, 1}), -1.0);
  Tensor y = concat({a, b, c}, -1);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 10}));
  EXPECT_FALSE(shares_storage(y, a));
  std::vector<double> va = a.to_vector(), vb = b.to_vector(), vc = c.to_vector(),
                      vy = y.to_vector();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 10; ++k) {
        double want = k < 4   ? va[(i * 3 + j) * 4 + k]
                      : k < 9 ? vb[(i * 3 + j) * 5 + k - 4]
                              : vc[i * 3 + j];
        ASSERT_EQ(vy[(i * 3 + j) * 10 + k], want);
      }
  Tensor z = concat({a, iota({1, 3, 4}), a}, 0);
  EXPECT_EQ(z.shape(), (Shape{5, 3, 4}));
  std::vector<double> vz = z.to_vector();
  EXPECT_EQ(std::vector<double>(vz.begin(), vz.begin() + 24), va);
  EXPECT_EQ(std::vector<double>(vz.begin() + 24, vz.begin() + 36), iota({12}).to_vector());
  EXPECT_EQ(std::vector<double>(vz.begin() + 36, vz.end()), va);
  Tensor m =
      concat({slice(a, 1, 0, 1), Tensor::zeros({2, 0, 4}, opts(DType::F64)), slice(a, 1, 2, 3)}, 1);
  EXPECT_EQ(m.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(m.to_vector(),
            (std::vector<double>{0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23}));
  EXPECT_EQ(concat({a}, 1).to_vector(), va);
}

TEST(Concat, ErrorsNameTheInputAndShapes) {
  Tensor a = iota({2, 3});
  std::string msg = error_of([&] { concat({a, iota({3, 3})}, 1); });
  EXPECT_HAS(msg, "concat");
  EXPECT_HAS(msg, "input 1");
  EXPECT_HAS(msg, "[3, 3]");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(error_of([&] { concat({a, iota({2, 3, 1})}, 1); }), "rank");
  EXPECT_HAS(error_of([&] { concat({a, Tensor::zeros({2, 3})}, 0); }), "dtype");
  EXPECT_HAS(error_of([&] { concat({}, 0); }), "concat");
  EXPECT_HAS(error_of([] { concat({Tensor::scalar(1.0), Tensor::scalar(2.0)}, 0); }), "concat");
}

TEST(Split, OutputsAreViewsInOrder) {
  Tensor x = iota({3, 7});
  std::vector<Tensor> parts = split(x, {2, 0, 5}, 1);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), (Shape{3, 2}));
  EXPECT_EQ(parts[1].shape(), (Shape{3, 0}));
  EXPECT_EQ(parts[2].shape(), (Shape{3, 5}));
  for (const Tensor& p : parts) EXPECT_TRUE(shares_storage(p, x));
  EXPECT_EQ(parts[0].to_vector(), (std::vector<double>{0, 1, 7, 8, 14, 15}));
  EXPECT_EQ(parts[2].to_vector(), slice(x, 1, 2, 7).to_vector());
  std::vector<Tensor> rows = split(transpose(x, 0, 1), {3, 4}, 0);
  EXPECT_EQ(rows[1].to_vector(), transpose(slice(x, 1, 3, 7), 0, 1).to_vector());
  std::vector<Tensor> ch = chunk(x, 3, 0);
  ASSERT_EQ(ch.size(), 3u);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(ch[i].to_vector(), slice(x, 0, i, i + 1).to_vector());
  EXPECT_EQ(chunk(x, 1, -1)[0].to_vector(), x.to_vector());
}

TEST(Split, ErrorsNameSizesAndTheDim) {
  Tensor x = iota({3, 7});
  std::string msg = error_of([&] { split(x, {2, 4}, 1); });
  EXPECT_HAS(msg, "split");
  EXPECT_HAS(msg, "[2, 4]");
  EXPECT_HAS(msg, "[3, 7]");
  EXPECT_HAS(error_of([&] { split(x, {8, -1}, 1); }), "negative");
  msg = error_of([&] { chunk(x, 2, 1); });
  EXPECT_HAS(msg, "chunk");
  EXPECT_HAS(msg, "2 chunks");
  EXPECT_HAS(error_of([&] { chunk(x, 0, 1); }), "chunks must be >= 1");
  EXPECT_HAS(error_of([] { split(Tensor::scalar(1.0), {1}, 0); }), "split");
  EXPECT_HAS(error_of([] { chunk(Tensor::scalar(1.0), 1, 0); }), "chunk");
}

// ---------------------------------------------------------------- contiguous

TEST(Contiguous, ReturnsTheInputWhenPackedAndACopyOtherwise) {
  Tensor x = iota({3, 4});
  EXPECT_TRUE(contiguous(x).same(x));
  Tensor xt = transpose(x, 0, 1);
  Tensor c = contiguous(xt);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(shares_storage(c, x));
  EXPECT_EQ(c.to_vector(), xt.to_vector());
  EXPECT_EQ(c.strides(), (Strides{3, 1}));
}

// ---------------------------------------------------------------- bf16

TEST(Bf16Views, ShapeOpsOnBf16AreViewsNotF32RoundTrips) {
  // bf16 is a storage type: arithmetic computes in f32, but moving data around must not.
  Tensor x = Tensor::from_vector(std::vector<double>{0.5, 1.5, -2, 3, 4.25, -6}, {2, 3},
                                 TensorOptions{}.with_dtype(DType::BF16));
  Tensor r = reshape(x, {3, 2});
  Tensor t = transpose(x, 0, 1);
  Tensor s = slice(x, 1, 1, 3);
  Tensor e = expand(slice(x, 0, 0, 1), {4, 3});
  std::vector<Tensor> parts = split(x, {1, 2}, 1);
  for (const Tensor& v : {r, t, s, e, parts[0], parts[1]}) {
    EXPECT_EQ(v.dtype(), DType::BF16);
    EXPECT_TRUE(shares_storage(v, x)) << shape_str(v.shape());
  }
  EXPECT_EQ(e.strides()[0], 0);
  EXPECT_EQ(t.to_vector(), (std::vector<double>{0.5, 3, 1.5, 4.25, -2, -6}));
  EXPECT_EQ(s.to_vector(), (std::vector<double>{1.5, -2, 4.25, -6}));
  Tensor c = concat({x, x}, 0);
  EXPECT_EQ(c.dtype(), DType::BF16);
  EXPECT_EQ(contiguous(t).to_vector(), t.to_vector());
}

// ---------------------------------------------------------------- gradcheck (f64)

TEST(ShapeGrad, Reshape) {
  Tensor x = uni({3, 4}, 11, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return reshape(in[0], {2, -1, 3});
      },
      {x}, "reshape view");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return reshape(transpose(in[0], 0, 1), {12}); }, {x},
      "reshape of a transpose (copy)");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return view(unsqueeze(in[0], 1), {3, 1, 2, 2});
      },
      {x}, "unsqueeze + view");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return squeeze(flatten(unsqueeze(in[0], 0), 1), 0); },
      {x}, "unsqueeze, flatten, squeeze");
}

TEST(ShapeGrad, PermuteAndTranspose) {
  Tensor x = uni({2, 3, 4}, 12, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return permute(in[0], {2, 0, 1});
      },
      {x}, "permute");
  expect_gradcheck([](const std::vector<Tensor>& in) { return transpose(in[0], 0, -1); }, {x},
                   "transpose");
}

TEST(ShapeGrad, SliceAndNarrow) {
  Tensor x = uni({4, 5}, 13, true);
  expect_gradcheck([](const std::vector<Tensor>& in) { return slice(in[0], 1, 1, 4); }, {x},
                   "slice columns");
  expect_gradcheck([](const std::vector<Tensor>& in) { return slice(in[0], 0, -3, -1); }, {x},
                   "negative bounds");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return narrow(transpose(in[0], 0, 1), 0, 2, 2); }, {x},
      "narrow of a transpose");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) { return slice(slice(in[0], 0, 1, 4), 0, 1, 2); }, {x},
      "slice of a slice");
}

TEST(ShapeGrad, Expand) {
  Tensor x = uni({3, 1}, 14, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return expand(in[0], {2, 3, 4});
      },
      {x}, "expand");
  Tensor s = uni({}, 15, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return expand(in[0], {2, 3});
      },
      {s}, "expand a scalar");
}

TEST(ShapeGrad, ConcatWithSomeInputsFrozen) {
  Tensor a = uni({2, 3}, 16, true), b = uni({2, 2}, 17, false), c = uni({3, 2}, 18, true);
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return concat({in[0], in[1], transpose(in[2], 0, 1)}, 1);
      },
      {a, b, c}, "concat dim 1");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return concat({in[0], in[0]}, 0);
      },
      {a, b, c}, "concat of the same input twice");
}

TEST(ShapeGrad, SplitAndChunk) {
  Tensor x = uni({3, 7}, 19, true);
  // Weight each output differently so that a mixed-up gradient cannot pass.
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = split(in[0], {2, 4, 1}, 1);
        return concat({mul(p[2], 3.0), p[0], mul(p[1], -2.0)}, 1);
      },
      {x}, "split");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        return split(in[0], {1, 2}, 0)[1];
      },
      {x}, "split with an unused output");
  expect_gradcheck(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> c = chunk(in[0], 3, 0);
        return add(mul(c[0], c[2]), c[1]);
      },
      {x}, "chunk");
}

TEST(ShapeGrad, Contiguous) {
  Tensor x = uni({3, 4}, 20, true);
  expect_gradcheck([](const std::vector<Tensor>& in) { return contiguous(transpose(in[0], 0, 1)); },
                   {x}, "contiguous");
  expect_gradcheck([](const std::vector<Tensor>& in) { return contiguous(mul(in[0], 2.0)); }, {x},
                   "contiguous of a packed tensor");
}

}  // namespace
}  // namespace hap
