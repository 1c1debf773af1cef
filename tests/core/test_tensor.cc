// Tensor, Shape, DType and strided copies: factories, metadata, raw views sharing storage,
// contiguous/clone/to(dtype), bf16 rounding, and the errors bad input gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/allocator.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#include "core/cuda/cublas.h"
#endif
#include "core/error.h"
#include "core/input_file.h"
#include "core/rng.h"
#include "core/shape.h"
#include "core/strided_copy.h"
#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "ops/threads.h"
#include "tests/stand_in_device.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using namespace test_util;

// Runs f, expects a hap::Error, and returns its message (empty if none was thrown).
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Nearest bf16 to a finite double, ties to even, found by comparing the two bracketing bf16
// values in double arithmetic (independent of the bit trick in dtype.h).
uint16_t reference_bf16_bits(double v) {
  float t = static_cast<float>(v);
  // Truncate toward zero in float first, then search the bracket in bf16 steps.
  uint32_t u = float_bits(t) & 0xffff0000u;
  double lo = static_cast<double>(bits_float(u));
  if (std::fabs(lo) > std::fabs(v)) {
    u -= 0x10000u;  // truncation overshot (float rounding went away from zero)
    lo = static_cast<double>(bits_float(u));
  }
  uint32_t uh = u + 0x10000u;
  double hi = static_cast<double>(bits_float(uh));
  double dl = std::fabs(v - lo), dh = std::fabs(hi - v);
  if (dl < dh) return static_cast<uint16_t>(u >> 16);
  if (dh < dl) return static_cast<uint16_t>(uh >> 16);
  return ((u >> 16) & 1u) ? static_cast<uint16_t>(uh >> 16) : static_cast<uint16_t>(u >> 16);
}

// ---------------------------------------------------------------- shapes

TEST(Shape, NumelStridesAndString) {
  EXPECT_EQ(shape_numel({}), 1);
  EXPECT_EQ(shape_numel({2, 3, 5}), 30);
  EXPECT_EQ(shape_numel({2, 0, 5}), 0);
  EXPECT_EQ(contiguous_strides({2, 3, 5}), (Strides{15, 5, 1}));
  EXPECT_EQ(contiguous_strides({}), Strides{});
  EXPECT_EQ(shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(shape_str({}), "[]");
}

// A shape whose sizes overflow 64-bit counts is refused, also with a zero among them (its
// strides multiply the other sizes): what a damaged file's header could ask for.
TEST(Shape, SizesThatOverflowAreRefusedEvenWithAZeroDim) {
  const int64_t huge = int64_t{1} << 40;
  EXPECT_NE(error_of([&] {
              Tensor::empty({0, huge, huge});
            }).find("more elements than 64-bit"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              Tensor::empty({huge, huge});
            }).find("more elements than 64-bit"),
            std::string::npos);
  EXPECT_EQ(Tensor::empty({0, huge}).numel(), 0);
}

// Well-formed UTF-8 passes; a Latin-1 byte, a truncated sequence, an overlong form, a surrogate
// and a code point past U+10FFFF are found at their offset.
TEST(Utf8, InvalidSequencesAreFoundAtTheirOffset) {
  EXPECT_EQ(invalid_utf8_at("plain \xc3\xa9t\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            std::string_view::npos);
  EXPECT_EQ(invalid_utf8_at("caf\xe9"), 3u);
  EXPECT_EQ(invalid_utf8_at("ab\xe2\x82"), 2u);
  EXPECT_EQ(invalid_utf8_at("\xc0\xaf"), 0u);
  EXPECT_EQ(invalid_utf8_at("x\xed\xa0\x80"), 1u);
  EXPECT_EQ(invalid_utf8_at("\xf4\x90\x80\x80"), 0u);
}

TEST(Shape, WrapDimAcceptsNegativeAndNamesTheRangeWhenOutOfBounds) {
  EXPECT_EQ(wrap_dim(-1, 3), 2);
  EXPECT_EQ(wrap_dim(-3, 3), 0);
  EXPECT_EQ(wrap_dim(2, 3), 2);
  std::string msg = error_of([] { wrap_dim(3, 3, "softmax dim"); });
  EXPECT_HAS(msg, "softmax dim 3");
  EXPECT_HAS(msg, "[-3, 2]");
  msg = error_of([] { wrap_dim(-4, 3); });
  EXPECT_HAS(msg, "-4");
}

TEST(Shape, BroadcastFollowsNumpyRules) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}, "add"), (Shape{2, 3, 4}));
  EXPECT_EQ(broadcast_shapes({}, {3, 2}, "add"), (Shape{3, 2}));
  EXPECT_EQ(broadcast_shapes({5, 1}, {1}, "add"), (Shape{5, 1}));
  EXPECT_EQ(broadcast_shapes({0, 3}, {1, 3}, "add"), (Shape{0, 3}));
}

TEST(Shape, BroadcastErrorNamesTheOpAndBothShapes) {
  std::string msg = error_of([] { broadcast_shapes({2, 3}, {4, 3}, "mul"); });
  EXPECT_HAS(msg, "mul");
  EXPECT_HAS(msg, "[2, 3]");
  EXPECT_HAS(msg, "[4, 3]");
  EXPECT_HAS(msg, "2 vs 4");
}

// ---------------------------------------------------------------- factories and metadata

TEST(Tensor, FactoriesFillValuesAndMetadata) {
  Tensor z = Tensor::zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Strides{3, 1}));
  EXPECT_EQ(z.dim(), 2);
  EXPECT_EQ(z.numel(), 6);
  EXPECT_EQ(z.dtype(), DType::F32);
  EXPECT_EQ(z.nbytes(), 24u);
  EXPECT_TRUE(z.device().is_cpu());
  EXPECT_TRUE(z.is_contiguous());
  for (double v : z.to_vector()) EXPECT_EQ(v, 0.0);

  Tensor o = Tensor::ones({4}, TensorOptions{}.with_dtype(DType::F64));
  EXPECT_EQ(o.dtype(), DType::F64);
  for (double v : o.to_vector()) EXPECT_EQ(v, 1.0);

  Tensor f = Tensor::full({3, 1}, -2.5, TensorOptions{}.with_dtype(DType::BF16));
  EXPECT_EQ(f.nbytes(), 6u);
  for (double v : f.to_vector()) EXPECT_EQ(v, -2.5);

  Tensor s = Tensor::scalar(7.0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 7.0);

  Tensor a = Tensor::arange(5, TensorOptions{}.with_dtype(DType::I64));
  EXPECT_EQ(a.to_vector(), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(a.data<int64_t>()[4], 4);

  Tensor e = Tensor::empty({0, 4});
  EXPECT_EQ(e.numel(), 0);
  EXPECT_TRUE(e.to_vector().empty());
  EXPECT_EQ(Tensor::zeros({2, 3}).str(), "f32[2, 3] cpu");
}

TEST(Tensor, FromVectorConvertsAndChecksTheCount) {
  Tensor t = Tensor::from_vector(std::vector<double>{1.5, -2, 3}, {3},
                                 TensorOptions{}.with_dtype(DType::I64));
  EXPECT_EQ(t.dtype(), DType::I64);
  EXPECT_EQ(t.to_vector(), (std::vector<double>{1, -2, 3}));  // truncation toward zero
  Tensor i = Tensor::from_vector(std::vector<int64_t>{4, 5}, {2});
  EXPECT_EQ(i.dtype(), DType::I64);
  Tensor f = Tensor::from_vector(std::vector<float>{0.25f, 8.f}, {2, 1});
  EXPECT_EQ(f.dtype(), DType::F32);
  EXPECT_EQ(f.to_vector(), (std::vector<double>{0.25, 8}));
  std::string msg = error_of([] { Tensor::from_vector(std::vector<double>{1, 2, 3}, {2, 2}); });
  EXPECT_HAS(msg, "3 values");
  EXPECT_HAS(msg, "[2, 2]");
}

TEST(Tensor, NegativeShapeIsAUserError) {
  std::string msg = error_of([] { Tensor::empty({2, -1}); });
  EXPECT_HAS(msg, "[2, -1]");
}

TEST(Tensor, SizeWrapsNegativeDimsAndRejectsOutOfRange) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_HAS(error_of([&] { t.size(3); }), "3");
  // A scalar has no dims: size(0) must be an error, not a read past the shape.
  Tensor s = Tensor::scalar(1.0);
  EXPECT_HAS(error_of([&] { s.size(0); }), "size");
}

TEST(Tensor, ItemAndItemAtReadLogicalOrder) {
  Tensor t = Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor tt = t.as_strided({3, 2}, {1, 3}, 0);  // transpose view
  EXPECT_EQ(tt.item_at(1), 3.0);
  EXPECT_EQ(tt.item_at(4), 2.0);
  EXPECT_EQ(tt.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_HAS(error_of([&] { t.item(); }), "one element");
  EXPECT_HAS(error_of([&] { t.item_at(6); }), "out of range");
  EXPECT_HAS(error_of([&] { t.item_at(-1); }), "out of range");
}

TEST(Tensor, DataWithTheWrongTypeNamesBothDtypes) {
  Tensor d = Tensor::zeros({2}, TensorOptions{}.with_dtype(DType::F64));
  std::string msg = error_of([&] { d.data<float>(); });
  EXPECT_HAS(msg, "f32");
  EXPECT_HAS(msg, "f64");
  EXPECT_NO_THROW(d.data<double>());
  Tensor b = Tensor::zeros({2}, TensorOptions{}.with_dtype(DType::BF16));
  msg = error_of([&] { b.data<int64_t>(); });
  EXPECT_HAS(msg, "i64");
  EXPECT_HAS(msg, "bf16");
}

TEST(Tensor, MetaTensorsHaveShapeButNoStorage) {
  Tensor m = Tensor::meta({3, 4}, DType::F32);
  EXPECT_FALSE(m.has_storage());
  EXPECT_EQ(m.shape(), (Shape{3, 4}));
  EXPECT_HAS(error_of([&] { m.raw_data(); }), "no storage");
  Tensor c = m.to(DType::BF16);
  EXPECT_FALSE(c.has_storage());
  EXPECT_EQ(c.dtype(), DType::BF16);
  EXPECT_FALSE(m.clone().has_storage());
}

TEST(Tensor, OnlyFloatingTensorsCanRequireGrad) {
  Tensor i = Tensor::zeros({2}, TensorOptions{}.with_dtype(DType::I64));
  std::string msg = error_of([&] { i.set_requires_grad(true); });
  EXPECT_HAS(msg, "i64");
  Tensor f = Tensor::zeros({2}, TensorOptions{}.with_requires_grad(true));
  EXPECT_TRUE(f.requires_grad());
  EXPECT_TRUE(f.is_leaf());
  EXPECT_FALSE(f.grad().defined());
  for (double v : f.to_vector()) EXPECT_EQ(v, 0.0);  // requires_grad does not skip the fill
}

TEST(Tensor, CudaStorageIsRejectedWithTheDeviceNamed) {
  std::string msg =
      error_of([] { Tensor::empty({2}, TensorOptions{}.with_device(Device::cuda(1))); });
  EXPECT_HAS(msg, "cuda:1");
}

// ---------------------------------------------------------------- views share storage

// A view that reaches past its storage (or before it) is refused, naming the range: written
// through, it would corrupt whatever memory follows (a GPU kernel or a host loop alike).
TEST(Tensor, AViewOutsideItsStorageIsAnError) {
  Tensor t = Tensor::zeros({7, 9});
  EXPECT_HAS(test_util::error_of([&] {
               t.as_strided({4, 9}, {18, 1}, 9);
             }),
             "reaches elements 9 to 71 of a storage of 63 f32 elements");
  EXPECT_HAS(test_util::error_of([&] { t.as_strided({3}, {-2}, 3); }), "reaches elements -1 to 3");
  EXPECT_EQ(t.as_strided({3, 9}, {18, 1}, 9).numel(), 27);   // rows 1, 3 and 5: inside
  EXPECT_EQ(t.as_strided({0, 5}, {100, 1}, 62).numel(), 0);  // an empty view reaches nothing
  EXPECT_EQ(t.as_strided({5, 4}, {0, 1}, 59).numel(), 20);   // broadcast rows over the last 4
  // A view of a view is checked against the storage, not the view.
  EXPECT_EQ(t.as_strided({9}, {1}, 0).as_strided({9}, {1}, 54).numel(), 9);
}

TEST(Tensor, AsStridedAndDetachShareStorage) {
  Tensor t = Tensor::from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {2, 3},
                                 TensorOptions{}.with_dtype(DType::F64));
  Tensor row1 = t.as_strided({3}, {1}, 3);
  EXPECT_EQ(row1.to_vector(), (std::vector<double>{3, 4, 5}));
  row1.fill_(9);
  EXPECT_EQ(t.to_vector(), (std::vector<double>{0, 1, 2, 9, 9, 9}));
  Tensor d = t.detach();
  EXPECT_FALSE(d.same(t));
  EXPECT_EQ(d.raw_data(), t.raw_data());
  d.data<double>()[0] = -1;
  EXPECT_EQ(t.item_at(0), -1);
}

TEST(Tensor, IsContiguousIgnoresSizeOneDims) {
  Tensor t = Tensor::zeros({4, 6});
  EXPECT_TRUE(t.as_strided({4, 1, 6}, {6, 99, 1}, 0).is_contiguous());
  EXPECT_FALSE(t.as_strided({6, 4}, {1, 6}, 0).is_contiguous());
  EXPECT_FALSE(t.as_strided({4, 3}, {6, 1}, 0).is_contiguous());  // every other row chunk
  EXPECT_FALSE(t.as_strided({4, 6}, {0, 1}, 0).is_contiguous());  // broadcast rows
  EXPECT_TRUE(t.as_strided({1, 6}, {0, 1}, 6).is_contiguous());
}

TEST(Tensor, FillOfAStridedViewWritesOnlyTheView) {
  Tensor t = Tensor::zeros({3, 4});
  Tensor col = t.as_strided({3}, {4}, 1);  // column 1
  col.fill_(2);
  std::vector<double> want = {0, 2, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0};
  EXPECT_EQ(t.to_vector(), want);
}

// ---------------------------------------------------------------- copies

TEST(Tensor, ContiguousReturnsSelfWhenPackedAndACopyOtherwise) {
  Tensor t = randn({5, 7}, 1);
  EXPECT_TRUE(t.contiguous().same(t));
  Tensor tt = t.as_strided({7, 5}, {1, 7}, 0);
  Tensor c = tt.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.raw_data(), t.raw_data());
  EXPECT_EQ(c.to_vector(), tt.to_vector());
  std::vector<double> src = t.to_vector();
  for (int64_t i = 0; i < 7; ++i)
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(c.item_at(i * 5 + j), src[j * 7 + i]);
}

TEST(Tensor, CloneIsAlwaysAFreshPackedCopy) {
  Tensor t = randn({3, 4}, 2, 0, TensorOptions{}.with_requires_grad(true));
  Tensor c = t.clone();
  EXPECT_NE(c.raw_data(), t.raw_data());
  EXPECT_FALSE(c.requires_grad());
  EXPECT_EQ(c.to_vector(), t.to_vector());
  c.fill_(0);
  EXPECT_NE(t.to_vector()[0], 0.0);
}

TEST(Tensor, StridedCopyHandlesEveryLayoutPairAndConvertsDtype) {
  // A [3, 5, 4] tensor read through a permuted, offset view and written into a strided one.
  Tensor base = randn({4, 5, 6}, 3, 0, TensorOptions{}.with_dtype(DType::F64));
  // view: dims permuted to [6 -> take 4, 5, 3] with an offset: base[1:4, :, 2:6] permuted (2, 1, 0)
  Tensor src = base.as_strided({4, 5, 3}, {1, 6, 30}, 30 + 2);
  std::vector<double> want(4 * 5 * 3);
  std::vector<double> b = base.to_vector();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j)
      for (int64_t k = 0; k < 3; ++k) want[(i * 5 + j) * 3 + k] = b[(k + 1) * 30 + j * 6 + (i + 2)];
  EXPECT_EQ(src.to_vector(), want);

  Tensor dst_base = Tensor::zeros({5, 4, 3}, TensorOptions{}.with_dtype(DType::F32));
  Tensor dst = dst_base.as_strided({4, 5, 3}, {3, 12, 1}, 0);  // transposed destination
  dst.copy_from(src);
  std::vector<double> got = dst.to_vector();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_EQ(got[i], static_cast<double>(static_cast<float>(want[i])));
  EXPECT_HAS(error_of([&] { dst.copy_from(base); }), "[4, 5, 6]");
}

TEST(Tensor, ToDtypeSameTypeIsANoOpAndOtherTypesConvert) {
  Tensor t = Tensor::from_vector(std::vector<double>{-1.75, 0.5, 3.0}, {3});
  EXPECT_TRUE(t.to(DType::F32).same(t));
  Tensor i = t.to(DType::I64);
  EXPECT_EQ(i.to_vector(), (std::vector<double>{-1, 0, 3}));
  Tensor u = Tensor::from_vector(std::vector<double>{0, 1, 255}, {3}).to(DType::U8);
  EXPECT_EQ(u.data<uint8_t>()[2], 255);
  Tensor d = t.to(DType::F64);
  EXPECT_EQ(d.to_vector(), (std::vector<double>{-1.75, 0.5, 3.0}));
  // A non-contiguous view converts in logical order.
  Tensor m = Tensor::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(m.as_strided({2, 2}, {1, 2}, 0).to(DType::F64).to_vector(),
            (std::vector<double>{1, 3, 2, 4}));
  EXPECT_EQ(m.as_strided({2, 2}, {1, 2}, 0).to(DType::F32).to_vector(),
            (std::vector<double>{1, 3, 2, 4}));
}

// Floats to integer dtypes truncate toward zero and saturate at the type's limits, NaN giving 0
// (C++ leaves the out-of-range cases undefined; the CUDA backend converts the same way).
TEST(Tensor, FloatToIntegerConversionsSaturateAndTakeNanToZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> v = {-1.0, 300.0, nan, 2.7, -2.7, 1e30, -1e30, 255.5};
  for (DType from : {DType::F32, DType::F64, DType::BF16}) {
    SCOPED_TRACE(dtype_name(from));
    const Tensor x = Tensor::from_vector(v, {8}, TensorOptions{}.with_dtype(DType::F64)).to(from);
    EXPECT_EQ(x.to(DType::U8).to_vector(), (std::vector<double>{0, 255, 0, 2, 0, 255, 0, 255}));
    const std::vector<double> i = x.to(DType::I64).to_vector();
    EXPECT_EQ(i[0], -1);
    EXPECT_EQ(i[1], 300);
    EXPECT_EQ(i[2], 0);
    EXPECT_EQ(i[3], 2);
    EXPECT_EQ(i[4], -2);
    EXPECT_EQ(x.to(DType::I64).data<int64_t>()[5], std::numeric_limits<int64_t>::max());
    EXPECT_EQ(x.to(DType::I64).data<int64_t>()[6], std::numeric_limits<int64_t>::min());
  }
}

// ---------------------------------------------------------------- bf16

TEST(BF16, EveryFiniteBf16RoundTripsThroughF32Exactly) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    bf16 h;
    h.bits = static_cast<uint16_t>(b);
    float f = static_cast<float>(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(bf16(f).bits, h.bits) << "bits 0x" << std::hex << b;
  }
}

TEST(BF16, RoundsToNearestEvenOnTies) {
  // 1.0 is 0x3f80; halfway to 0x3f81 is 0x3f808000: a tie, rounds to the even 0x3f80.
  EXPECT_EQ(bf16(bits_float(0x3f808000u)).bits, 0x3f80);
  // Halfway between 0x3f81 and 0x3f82 rounds up to the even 0x3f82.
  EXPECT_EQ(bf16(bits_float(0x3f818000u)).bits, 0x3f82);
  EXPECT_EQ(bf16(bits_float(0x3f808001u)).bits, 0x3f81);  // just above half: up
  EXPECT_EQ(bf16(bits_float(0x3f807fffu)).bits, 0x3f80);  // just below half: down
  EXPECT_EQ(bf16(bits_float(0xbf818000u)).bits, 0xbf82);  // sign does not matter
  EXPECT_EQ(bf16(bits_float(0xbf808000u)).bits, 0xbf80);
  // The largest float rounds to infinity; infinities and signed zeros stay.
  EXPECT_EQ(bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_EQ(bf16(-0.0f).bits, 0x8000);
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A signalling NaN whose payload sits only in the low bits must not become infinity.
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(bits_float(0x7f800001u)))));
}

TEST(BF16, TensorConversionMatchesAReferenceRounding) {
  // Random f32 values over many binades, plus every tie pattern near 1.
  Tensor x = randn({4099}, 11, 0, TensorOptions{}.with_dtype(DType::F32));
  std::vector<float> xs = x.to_float_vector();
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::ldexp(xs[i], static_cast<int>(i % 61) - 30);
  for (uint32_t low = 0x7ff0; low <= 0x8010; ++low) xs.push_back(bits_float(0x3fc30000u | low));
  Tensor f = Tensor::from_vector(xs, {static_cast<int64_t>(xs.size())});
  Tensor h = f.to(DType::BF16);
  ASSERT_EQ(h.dtype(), DType::BF16);
  const bf16* p = h.data<bf16>();
  for (size_t i = 0; i < xs.size(); ++i)
    ASSERT_EQ(p[i].bits, reference_bf16_bits(xs[i])) << "value " << xs[i];
  // bf16 -> f32 -> bf16 is exact.
  Tensor back = h.to(DType::F32).to(DType::BF16);
  EXPECT_EQ(std::memcmp(back.raw_data(), h.raw_data(), h.nbytes()), 0);
}

TEST(BF16, F64SourcesRoundOnceToTheNearestBf16) {
  // 1 + 2^-8 is the midpoint between bf16 1.0 and 1.0078125. A double a little above it must
  // round up; rounding to f32 first lands exactly on the midpoint and then ties down to 1.0.
  double above = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  double below = 1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -30);
  double tie = 1.0 + std::ldexp(1.0, -8);
  Tensor d = Tensor::from_vector(std::vector<double>{above, below, tie, -above}, {4},
                                 TensorOptions{}.with_dtype(DType::F64));
  Tensor h = d.to(DType::BF16);
  EXPECT_EQ(h.to_vector(), (std::vector<double>{1.0078125, 1.0, 1.0, -1.0078125}));
  for (double v : {above, below, tie, -above, 3.0e-39, 1.0e38, -7.123456789})
    EXPECT_EQ(convert<bf16>(v).bits, reference_bf16_bits(v)) << v;
  // from_vector straight into bf16 takes the same path.
  Tensor h2 =
      Tensor::from_vector(std::vector<double>{above}, {1}, TensorOptions{}.with_dtype(DType::BF16));
  EXPECT_EQ(h2.item(), 1.0078125);
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
  EXPECT_STREQ(dtype_name(DType::BF16), "bf16");
  EXPECT_TRUE(is_floating(DType::BF16));
  EXPECT_FALSE(is_floating(DType::I64));
  EXPECT_FALSE(is_floating(DType::U8));
}

}  // namespace
}  // namespace hap

// ---- devices: the allocator and copy seams a device backend plugs into ----

namespace hap {
namespace {

// Stands in for the CUDA backend (the real one, when built, is put back afterwards).
class FakeDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ops_ = registered_device_tensor_ops(DeviceKind::CUDA);
    register_device_tensor_ops(DeviceKind::CUDA, {});  // a test registers its own
  }
  void TearDown() override { register_device_tensor_ops(DeviceKind::CUDA, saved_ops_); }
  test_util::StandInDevice device_;  // memory and copies
  test_util::StandInAllocator& allocator_ = device_.allocator;
  DeviceTensorOps saved_ops_;
};

// Fake elementwise operations over the fake device's (host) memory, for f32 tensors, recording
// what they were asked to do.
std::vector<std::string> g_fake_ops;
void fake_fill(const Tensor& t, double value) {
  g_fake_ops.push_back("fill " + shape_str(t.shape()) + (t.is_contiguous() ? "" : " strided"));
  auto* p = static_cast<float*>(t.raw_data());
  for_each_offset(t.shape(), t.strides(), [&](int64_t off) { p[off] = static_cast<float>(value); });
}
void fake_copy_elements(const Tensor& dst, const Tensor& src) {
  g_fake_ops.push_back(std::string("copy ") + dtype_name(src.dtype()) + " -> " +
                       dtype_name(dst.dtype()));
  ASSERT_EQ(dst.dtype(), DType::F32);
  ASSERT_EQ(src.dtype(), DType::F32);
  std::vector<float> values;
  const auto* s = static_cast<const float*>(src.raw_data());
  for_each_offset(src.shape(), src.strides(), [&](int64_t off) { values.push_back(s[off]); });
  auto* d = static_cast<float*>(dst.raw_data());
  size_t i = 0;
  for_each_offset(dst.shape(), dst.strides(), [&](int64_t off) { d[off] = values[i++]; });
}

// Without the CUDA backend in the build, or with it but no GPU, a CUDA tensor is an error that
// says which.
TEST(Devices, WithoutABackendOrAGpuAllocatingOnCudaSaysSo) {
#ifdef HAP_HAVE_CUDA
  ASSERT_TRUE(has_allocator(DeviceKind::CUDA));
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu covers it";
  EXPECT_HAS(test_util::error_of([] { Tensor::ones({2}).to(Device::cuda(0)); }),
             "cuda:0: no CUDA device is visible to this process");
  EXPECT_HAS(
      test_util::error_of([] { Tensor::empty({2}, TensorOptions{}.with_device(Device::cuda(1))); }),
      "cuda:1: no CUDA device is visible");
#else
  ASSERT_FALSE(has_allocator(DeviceKind::CUDA));
  const std::string m =
      test_util::error_of([] { Tensor::empty({2}, TensorOptions{}.with_device(Device::cuda(0))); });
  EXPECT_HAS(m, "no allocator for cuda");
  EXPECT_HAS(m, "no cuda backend");
  EXPECT_HAS(test_util::error_of([] { Tensor::ones({2}).to(Device::cuda(0)); }),
             "no allocator for cuda");
#endif
}

#ifdef HAP_HAVE_CUDA
// cuBLAS is opened on first use, found with or without a GPU (the toolkit's folder as a last
// resort), with every function the GEMM kernels call.
TEST(Devices, CublasOpensOnFirstUseWithTheFunctionsTheKernelsCall) {
  const cuda::Cublas& c = cuda::cublas();
  EXPECT_NE(c.create, nullptr);
  EXPECT_NE(c.gemm_strided_batched, nullptr);
  ASSERT_NE(c.status_string, nullptr);
  EXPECT_NE(std::string(c.status_string(CUBLAS_STATUS_NOT_INITIALIZED)), "");
}
#endif

TEST(Devices, ToTheSameDeviceIsTheTensorItself) {
  Tensor x = Tensor::ones({3});
  EXPECT_TRUE(x.to(Device::cpu()).same(x));
}

TEST_F(FakeDevice, StorageComesFromTheDevicesAllocatorAndToCopiesBothWays) {
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor xt = permute(x, {1, 0});  // not contiguous: to() packs it first
  const int copies = test_util::g_stand_in_copies;
  Tensor d = xt.to(Device::cuda(1));
  EXPECT_EQ(d.device(), Device::cuda(1));
  EXPECT_EQ(allocator_.live, 6 * sizeof(float));
  EXPECT_TRUE(d.is_contiguous());
  Tensor back = d.to(Device::cpu());
  EXPECT_EQ(test_util::g_stand_in_copies, copies + 2);
  EXPECT_EQ(back.to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(d.to_vector(), back.to_vector()) << "reading a device tensor goes through the host";
  d = Tensor();
  EXPECT_EQ(allocator_.live, 0u) << "the device's memory goes back to its allocator";
}

// Waiting for a device goes to its backend, with the device; the CPU has nothing to wait for;
// without a backend's wait, waiting is an error naming the device.
TEST_F(FakeDevice, SynchronizeWaitsThroughTheBackendAndNotForTheCpu) {
  const int syncs = test_util::g_stand_in_syncs;
  synchronize(Device::cpu());
  EXPECT_EQ(test_util::g_stand_in_syncs, syncs);
  synchronize(Device::cuda(3));
  EXPECT_EQ(test_util::g_stand_in_syncs, syncs + 1);
  EXPECT_EQ(test_util::g_stand_in_synced_index, 3);
  // Profiling waits for the device before and after each op (a GPU's kernels run after their
  // launch); a permute runs on any device (a view).
  const Tensor d = Tensor::ones({2, 3}).to(Device::cuda(1));
  ops::call1(ops::OpKind::Permute, {d}, ops::PermuteAttrs{{1, 0}});
  EXPECT_EQ(test_util::g_stand_in_syncs, syncs + 1) << "no waits without profiling";
  ops::set_profiling(true);
  const Tensor t = ops::call1(ops::OpKind::Permute, {d}, ops::PermuteAttrs{{1, 0}});
  ops::set_profiling(false);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(test_util::g_stand_in_syncs, syncs + 3) << "profiling waits around the op";
  EXPECT_EQ(test_util::g_stand_in_synced_index, 1);
  register_device_synchronize(DeviceKind::CUDA, nullptr);
  EXPECT_HAS(test_util::error_of([] { synchronize(Device::cuda(0)); }),
             "waiting for cuda:0: no cuda backend registered how");
  register_device_synchronize(DeviceKind::CUDA, &test_util::stand_in_synchronize);
}

// Profiling also counts a CPU kernel's CPU time (hap-profile splits a step by it: a CPU quota's
// throttled spells are not the kernel's work); on one thread it is at most the wall time, and a
// kernel of another device adds none.
TEST_F(FakeDevice, ProfilingCountsCpuKernelsCpuTime) {
  const int threads = num_threads();
  set_num_threads(1);
  ops::reset_dispatch_stats();
  const Tensor a = randn({192, 192}, 7, 0), b = randn({192, 192}, 7, 1);
  ops::set_profiling(true);
  for (int i = 0; i < 8; ++i) matmul(a, b);
  ops::call1(ops::OpKind::Permute, {Tensor::ones({2, 3}).to(Device::cuda(0))},
             ops::PermuteAttrs{{1, 0}});
  ops::set_profiling(false);
  set_num_threads(threads);
  const ops::DispatchStats& stats = ops::dispatch_stats();
  const size_t mm = static_cast<size_t>(ops::OpKind::MatMul);
  const size_t permute = static_cast<size_t>(ops::OpKind::Permute);
  EXPECT_GT(stats.kernel_cpu_s[mm], 0.0);
  EXPECT_LE(stats.kernel_cpu_s[mm], stats.kernel_s[mm] + 1e-3);
  EXPECT_GT(stats.kernel_s[permute], 0.0);
  EXPECT_EQ(stats.kernel_cpu_s[permute], 0.0) << "a cuda kernel is not timed in CPU time";
  ops::reset_dispatch_stats();
}

TEST_F(FakeDevice, HostAccessToADeviceTensorIsAnErrorThatNamesTheDevice) {
  Tensor d = Tensor::ones({2}).to(Device::cuda(0));
  const std::string m = test_util::error_of([&] { d.data<float>(); });
  EXPECT_HAS(m, "cuda:0");
  EXPECT_HAS(m, "to(Device::cpu())");
  // Without the backend's elementwise operations, what needs them says so.
  const std::string fill = test_util::error_of([&] { d.fill_(3.0); });
  EXPECT_HAS(fill, "fill_");
  EXPECT_HAS(fill, "no backend for cuda:0");
  // Copies from the host need only the byte copies (converting on the host first).
  d.copy_from(
      Tensor::from_vector(std::vector<double>{7, 8}, {2}, TensorOptions{}.with_dtype(DType::F64)));
  EXPECT_EQ(d.to_vector(), (std::vector<double>{7, 8}));
  EXPECT_EQ(d.clone().to_vector(), (std::vector<double>{7, 8}));
}

TEST_F(FakeDevice, FillCloneAndCastOfDeviceViewsGoThroughTheBackendsOperations) {
  register_device_tensor_ops(DeviceKind::CUDA, {fake_fill, fake_copy_elements});
  g_fake_ops.clear();
  Tensor x = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}).to(Device::cuda(0));
  Tensor xt = permute(x, {1, 0});
  Tensor packed = xt.contiguous();
  EXPECT_TRUE(packed.is_contiguous());
  EXPECT_EQ(packed.to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(xt.to(Device::cpu()).to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}))
      << "a device view is packed on its device before it is copied";
  Tensor z = Tensor::zeros({2, 2}, TensorOptions{}.with_device(Device::cuda(0)));
  EXPECT_EQ(z.to_vector(), (std::vector<double>{0, 0, 0, 0}));
  xt.fill_(9.0);  // a strided view: every element of x
  EXPECT_EQ(x.to_vector(), (std::vector<double>{9, 9, 9, 9, 9, 9}));
  // From the host into a device view: packed bytes, then placed by the backend.
  xt.copy_from(Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}));
  EXPECT_EQ(x.to_vector(), (std::vector<double>{1, 3, 5, 2, 4, 6}));
  EXPECT_EQ(g_fake_ops,
            (std::vector<std::string>{"copy f32 -> f32", "copy f32 -> f32", "fill [2, 2]",
                                      "fill [3, 2] strided", "copy f32 -> f32"}));
}

}  // namespace
}  // namespace hap
