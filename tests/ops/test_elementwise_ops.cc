// Elementwise ops against plain double-precision references (odd sizes, broadcasting, strided and
// expanded inputs, f32/f64/bf16), their error messages, and a finite-difference gradcheck in f64
// for every differentiable one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "core/error.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using namespace test_util;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Uniform in [lo, hi).
Tensor uni(const Shape& s, uint64_t seed, double lo, double hi, DType dt = DType::F64,
           bool rg = false) {
  Tensor t = Tensor::empty(s, opts(dt));
  fill_uniform(t, seed, 0, lo, hi);
  if (rg) t.set_requires_grad(true);
  return t;
}
// Values in [-hi, -lo] U [lo, hi]: kinks of relu and friends stay far from finite differences.
Tensor away_from_zero(const Shape& s, uint64_t seed, double lo = 0.1, double hi = 2.0,
                      bool rg = false) {
  std::vector<double> v = uni(s, seed, -1.0, 1.0).to_vector();
  for (double& x : v) x = (x < 0 ? -1 : 1) * (lo + (hi - lo) * std::fabs(x));
  return Tensor::from_vector(v, s, opts(DType::F64, rg));
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                  double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i;
      continue;
    }
    ASSERT_LE(std::fabs(got[i] - want[i]), atol + rtol * std::fabs(want[i]))
        << what << " element " << i << ": got " << got[i] << ", want " << want[i];
  }
}

// Reference of a broadcasting binary op in double, by explicit index arithmetic.
std::vector<double> ref_binary(const Tensor& a, const Tensor& b, const Shape& out,
                               const std::function<double(double, double)>& f) {
  std::vector<double> va = a.to_vector(), vb = b.to_vector();
  int64_t n = shape_numel(out), nd = static_cast<int64_t>(out.size());
  std::vector<double> r(n);
  auto index_in = [&](const Shape& s, int64_t flat) {
    int64_t k = static_cast<int64_t>(s.size()), idx = 0, mul = 1, rem = flat;
    std::vector<int64_t> coord(nd);
    for (int64_t d = nd - 1; d >= 0; --d) {
      coord[d] = rem % out[d];
      rem /= out[d];
    }
    for (int64_t d = k - 1; d >= 0; --d) {
      int64_t c = s[d] == 1 ? 0 : coord[d + nd - k];
      idx += c * mul;
      mul *= s[d];
    }
    return idx;
  };
  for (int64_t i = 0; i < n; ++i) r[i] = f(va[index_in(a.shape(), i)], vb[index_in(b.shape(), i)]);
  return r;
}

std::vector<double> ref_unary(const Tensor& a, const std::function<double(double)>& f) {
  std::vector<double> v = a.to_vector();
  for (double& x : v) x = f(x);
  return v;
}

// Tolerances for comparing an op in `dt` with a double reference.
double rtol_for(DType dt) { return dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 2e-6 : 1e-2; }
double atol_for(DType dt) { return dt == DType::F64 ? 1e-14 : dt == DType::F32 ? 1e-6 : 1e-2; }

void expect_gradcheck(const Fn& f, const std::vector<Tensor>& inputs, const std::string& what) {
  autograd::GradcheckResult r = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_erf_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

// ---------------------------------------------------------------- binary forward

struct BinaryCase {
  Shape a, b;
};
const std::vector<BinaryCase> kBinaryCases = {
    {{7, 13}, {7, 13}},                     // same shape, odd sizes
    {{5, 1, 7}, {3, 1}},                    // both sides broadcast, different ranks
    {{}, {4, 3}},                           // 0-d scalar tensor
    {{6, 5}, {1}},                          // one-element tensor
    {{2, 3, 4}, {4}},                       // row vector
    {{3, 1}, {1, 5}},                       // outer product shape
    {{1, 1, 9}, {2, 3, 9}}, {{0, 3}, {3}},  // empty
};

struct BinaryOp {
  const char* name;
  Tensor (*op)(const Tensor&, const Tensor&);
  double (*ref)(double, double);
};
const BinaryOp kBinaryOps[] = {
    {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); },
     [](double x, double y) { return x + y; }},
    {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); },
     [](double x, double y) { return x - y; }},
    {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); },
     [](double x, double y) { return x * y; }},
    {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); },
     [](double x, double y) { return x / y; }},
};

TEST(ElementwiseForward, BinaryOpsBroadcastLikeNumpy) {
  for (const BinaryOp& op : kBinaryOps) {
    for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
      uint64_t seed = 1;
      for (const BinaryCase& c : kBinaryCases) {
        Tensor a = uni(c.a, seed++, -2, 2, dt);
        Tensor b = uni(c.b, seed++, 0.5, 2, dt);  // positive: a safe denominator for div
        Tensor y = op.op(a, b);
        Shape out = broadcast_shapes(c.a, c.b, op.name);
        EXPECT_EQ(y.shape(), out) << op.name;
        EXPECT_EQ(y.dtype(), dt) << op.name;
        // bf16: the reference is computed from the bf16 inputs, the result rounded once.
        expect_close(y.to_vector(), ref_binary(a, b, out, op.ref), rtol_for(dt), atol_for(dt),
                     std::string(op.name) + " " + shape_str(c.a) + " " + shape_str(c.b) + " " +
                         dtype_name(dt));
        // Swapped operands broadcast the same way.
        Tensor z = op.op(b, a);
        expect_close(z.to_vector(), ref_binary(b, a, out, op.ref), rtol_for(dt), atol_for(dt),
                     std::string(op.name) + " swapped");
      }
    }
  }
}

TEST(ElementwiseForward, BinaryOpsReadStridedAndExpandedInputs) {
  for (const BinaryOp& op : kBinaryOps) {
    for (DType dt : {DType::F64, DType::F32}) {
      Tensor base = uni({9, 7}, 3, 0.5, 2, dt);
      Tensor at = transpose(base, 0, 1);  // [7, 9], strides [1, 7]
      Tensor b = uni({7, 9}, 4, 0.5, 2, dt);
      expect_close(op.op(at, b).to_vector(), ref_binary(at, b, {7, 9}, op.ref), rtol_for(dt),
                   atol_for(dt), std::string(op.name) + " transposed lhs");
      expect_close(op.op(b, at).to_vector(), ref_binary(b, at, {7, 9}, op.ref), rtol_for(dt),
                   atol_for(dt), std::string(op.name) + " transposed rhs");
      Tensor sl = slice(base, 1, 2, 5);  // [9, 3], row stride 7
      Tensor row = uni({3}, 5, 0.5, 2, dt);
      expect_close(op.op(sl, row).to_vector(), ref_binary(sl, row, {9, 3}, op.ref), rtol_for(dt),
                   atol_for(dt), std::string(op.name) + " sliced with broadcast row");
      Tensor ex = expand(uni({1, 9}, 6, 0.5, 2, dt), {7, 9});  // stride 0 rows
      expect_close(op.op(ex, at).to_vector(), ref_binary(ex, at, {7, 9}, op.ref), rtol_for(dt),
                   atol_for(dt), std::string(op.name) + " expanded lhs");
      Tensor col = transpose(uni({1, 7}, 7, 0.5, 2, dt), 0, 1);  // [7, 1] column, broadcast along 1
      expect_close(op.op(at, col).to_vector(), ref_binary(at, col, {7, 9}, op.ref), rtol_for(dt),
                   atol_for(dt), std::string(op.name) + " column broadcast");
    }
  }
}

TEST(ElementwiseForward, LargeInputsTakeTheParallelPathsCorrectly) {
  Tensor a = uni({301, 257}, 8, -1, 1, DType::F32);
  Tensor b = uni({257}, 9, -1, 1, DType::F32);
  expect_close(mul(a, b).to_vector(),
               ref_binary(a, b, {301, 257}, [](double x, double y) { return x * y; }), 1e-6, 1e-7,
               "large broadcast mul");
  Tensor at = transpose(uni({257, 301}, 10, -1, 1, DType::F32), 0, 1);
  expect_close(add(at, a).to_vector(),
               ref_binary(at, a, {301, 257}, [](double x, double y) { return x + y; }), 1e-6, 1e-7,
               "large strided add");
  expect_close(exp(at).to_vector(), ref_unary(at, [](double x) { return std::exp(x); }), 4e-7, 0,
               "large exp");
}

TEST(ElementwiseForward, OperatorOverloadsMatchTheirFunctions) {
  Tensor a = uni({3, 5}, 11, 0.5, 2), b = uni({5}, 12, 0.5, 2);
  auto same = [](const Tensor& x, const std::vector<double>& want) {
    expect_close(x.to_vector(), want, 1e-15, 1e-15, "operator");
  };
  same(a + b, add(a, b).to_vector());
  same(a - b, sub(a, b).to_vector());
  same(a * b, mul(a, b).to_vector());
  same(a / b, div(a, b).to_vector());
  same(a + 2.5, ref_unary(a, [](double x) { return x + 2.5; }));
  same(2.5 + a, ref_unary(a, [](double x) { return x + 2.5; }));
  same(a - 2.5, ref_unary(a, [](double x) { return x - 2.5; }));
  same(2.5 - a, ref_unary(a, [](double x) { return 2.5 - x; }));
  same(a * 3.0, ref_unary(a, [](double x) { return 3 * x; }));
  same(3.0 * a, ref_unary(a, [](double x) { return 3 * x; }));
  same(a / 4.0, ref_unary(a, [](double x) { return x / 4; }));
  same(-a, ref_unary(a, [](double x) { return -x; }));
  EXPECT_HAS(error_of([&] { (void)(a / 0.0); }), "scalar 0");
}

// ---------------------------------------------------------------- binary errors

TEST(ElementwiseErrors, BroadcastFailureNamesTheOpAndBothShapes) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4, 3});
  for (const BinaryOp& op : kBinaryOps) {
    std::string msg = error_of([&] { op.op(a, b); });
    EXPECT_HAS(msg, op.name);
    EXPECT_HAS(msg, "[2, 3]");
    EXPECT_HAS(msg, "[4, 3]");
  }
}

TEST(ElementwiseErrors, MixedOrIntegerDtypesAreRejectedNamingTheDtypes) {
  Tensor f = Tensor::zeros({2}), d = Tensor::zeros({2}, opts(DType::F64));
  std::string msg = error_of([&] { add(f, d); });
  EXPECT_HAS(msg, "add");
  EXPECT_HAS(msg, "f32");
  EXPECT_HAS(msg, "f64");
  Tensor i = Tensor::zeros({2}, opts(DType::I64));
  msg = error_of([&] { mul(i, i); });
  EXPECT_HAS(msg, "i64");
  msg = error_of([&] { exp(i); });
  EXPECT_HAS(msg, "exp");
  EXPECT_HAS(msg, "i64");
}

// ---------------------------------------------------------------- unary and scalar forward

struct UnaryOp {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  double lo, hi;  // input range
};
std::vector<UnaryOp> unary_ops() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -3, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -10,
       10},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 1e-3,
       50},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0,
       50},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); },
       1e-3, 50},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -5,
       5},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); },
       [](double x) { return 1 / (1 + std::exp(-x)); }, -12, 12},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; },
       -3, 3},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); }, gelu_tanh_ref, -6,
       6},
      {"gelu_erf", [](const Tensor& x) { return gelu(x, GeluApprox::None); }, gelu_erf_ref, -6, 6},
      {"add_scalar", [](const Tensor& x) { return add(x, -1.25); },
       [](double x) { return x - 1.25; }, -3, 3},
      {"mul_scalar", [](const Tensor& x) { return mul(x, 0.3); }, [](double x) { return 0.3 * x; },
       -3, 3},
      {"pow2", [](const Tensor& x) { return pow(x, 2.0); }, [](double x) { return x * x; }, -3, 3},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }, -3,
       3},
      {"pow0.5", [](const Tensor& x) { return pow(x, 0.5); }, [](double x) { return std::sqrt(x); },
       0, 9},
      {"pow-1.5", [](const Tensor& x) { return pow(x, -1.5); },
       [](double x) { return std::pow(x, -1.5); }, 0.1, 9},
  };
}

TEST(ElementwiseForward, UnaryAndScalarOpsMatchLibm) {
  for (const UnaryOp& op : unary_ops()) {
    for (DType dt : {DType::F64, DType::F32}) {
      Tensor x = uni({11, 17}, 21, op.lo, op.hi, dt);
      // f32: the fast exp/tanh are within a few ulp; gelu's tanh has an absolute error ~1e-7.
      double rtol = dt == DType::F64 ? 1e-13 : 4e-6, atol = dt == DType::F64 ? 1e-15 : 1e-6;
      Tensor y = op.op(x);
      EXPECT_EQ(y.dtype(), dt);
      expect_close(y.to_vector(), ref_unary(x, op.ref), rtol, atol,
                   std::string(op.name) + " " + dtype_name(dt));
      // Non-contiguous input: a transposed view.
      Tensor xt = transpose(uni({17, 11}, 22, op.lo, op.hi, dt), 0, 1);
      expect_close(op.op(xt).to_vector(), ref_unary(xt, op.ref), rtol, atol,
                   std::string(op.name) + " transposed");
      // 0-d and empty inputs keep their shape.
      EXPECT_EQ(op.op(uni({}, 23, op.lo, op.hi, dt)).shape(), Shape{});
      EXPECT_EQ(op.op(Tensor::zeros({0, 4}, opts(dt))).shape(), (Shape{0, 4}));
    }
  }
}

TEST(ElementwiseForward, SpecialValuesFollowIeee) {
  double inf = std::numeric_limits<double>::infinity();
  Tensor x =
      Tensor::from_vector(std::vector<double>{-inf, -800, 0, 800, inf}, {5}, opts(DType::F64));
  EXPECT_EQ(exp(x).to_vector(), (std::vector<double>{0, 0, 1, inf, inf}));
  expect_close(sigmoid(x).to_vector(), {0, 0, 0.5, 1, 1}, 0, 0, "sigmoid saturates");
  expect_close(tanh(x).to_vector(), {-1, -1, 0, 1, 1}, 0, 0, "tanh saturates");
  EXPECT_EQ(relu(x).to_vector(), (std::vector<double>{0, 0, 0, 800, inf}));
  Tensor f = Tensor::from_vector(std::vector<double>{-100, -20, 0, 20, 100}, {5});
  expect_close(sigmoid(f).to_vector(),
               ref_unary(f, [](double v) { return 1 / (1 + std::exp(-v)); }), 1e-6, 1e-30,
               "f32 sigmoid tails");
  expect_close(gelu(f).to_vector(), {0, 0, 0, 20, 100}, 1e-6, 1e-6, "f32 gelu tails");
  EXPECT_TRUE(std::isnan(log(Tensor::scalar(-1.0)).item()));
  EXPECT_TRUE(std::isnan(sqrt(Tensor::scalar(-1.0, opts(DType::F64))).item()));
}

TEST(ElementwiseForward, Bf16InputsComputeInF32AndRoundTheResult) {
  Tensor a = uni({5, 9}, 31, -4, 4, DType::BF16), b = uni({9}, 32, -4, 4, DType::BF16);
  Tensor y = mul(a, b);
  EXPECT_EQ(y.dtype(), DType::BF16);
  Tensor want = mul(a.to(DType::F32), b.to(DType::F32)).to(DType::BF16);
  EXPECT_EQ(y.to_vector(), want.to_vector());
  Tensor g = gelu(a);
  EXPECT_EQ(g.dtype(), DType::BF16);
  EXPECT_EQ(g.to_vector(), gelu(a.to(DType::F32)).to(DType::BF16).to_vector());
}

// ---------------------------------------------------------------- masked_fill, cast, dropout

TEST(ElementwiseForward, MaskedFillBroadcastsTheMask) {
  for (DType dt : {DType::F64, DType::F32}) {
    Tensor x = uni({2, 3, 5, 5}, 41, -1, 1, dt);
    Tensor m = causal_mask(5);
    Tensor y = masked_fill(x, m, -1e9);
    std::vector<double> vx = x.to_vector(), vy = y.to_vector();
    for (int64_t i = 0; i < x.numel(); ++i) {
      int64_t r = (i / 5) % 5, c = i % 5;
      double want = c > r ? -1e9 : vx[i];  // -1e9 is exact in f32
      ASSERT_EQ(vy[i], want) << i;
    }
    // A [3, 1, 1] mask over a strided input.
    Tensor xt = transpose(uni({5, 3}, 42, -1, 1, dt), 0, 1);  // [3, 5]
    Tensor m3 = Tensor::from_vector(std::vector<double>{1, 0, 1}, {3, 1}, opts(DType::U8));
    std::vector<double> got = masked_fill(xt, m3, 7).to_vector(), src = xt.to_vector();
    for (int64_t i = 0; i < 15; ++i) EXPECT_EQ(got[i], (i / 5) == 1 ? src[i] : 7.0);
  }
}

TEST(ElementwiseErrors, MaskedFillChecksTheMask) {
  Tensor x = Tensor::zeros({3, 4});
  EXPECT_HAS(error_of([&] { masked_fill(x, Tensor::zeros({3, 4}), 0); }), "u8");
  std::string msg = error_of([&] { masked_fill(x, Tensor::zeros({2, 3, 4}, opts(DType::U8)), 0); });
  EXPECT_HAS(msg, "[2, 3, 4]");
  EXPECT_HAS(msg, "[3, 4]");
  msg = error_of([&] { masked_fill(x, Tensor::zeros({5}, opts(DType::U8)), 0); });
  EXPECT_HAS(msg, "masked_fill");
  EXPECT_HAS(error_of([] { causal_mask(-1); }), "-1");
}

TEST(ElementwiseForward, CastConvertsAndIsANoOpForTheSameDtype) {
  Tensor x = uni({4, 6}, 51, -3, 3, DType::F64);
  EXPECT_TRUE(cast(x, DType::F64).same(x));
  Tensor f = cast(x, DType::F32);
  EXPECT_EQ(f.dtype(), DType::F32);
  std::vector<double> vx = x.to_vector(), vf = f.to_vector();
  for (size_t i = 0; i < vx.size(); ++i)
    EXPECT_EQ(vf[i], static_cast<double>(static_cast<float>(vx[i])));
  Tensor h = cast(transpose(x, 0, 1), DType::BF16);
  EXPECT_EQ(h.to_vector(), transpose(x, 0, 1).to(DType::BF16).to_vector());
  Tensor i = cast(x, DType::I64);
  EXPECT_EQ(i.dtype(), DType::I64);
  EXPECT_EQ(i.item_at(0), std::trunc(vx[0]));
}

TEST(Dropout, IdentityWhenNotTrainingOrPZero) {
  Tensor x = uni({4, 5}, 61, -1, 1);
  EXPECT_TRUE(dropout(x, 0.5, false, 1, 0).same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, 1, 0).same(x));
  EXPECT_HAS(error_of([&] { dropout(x, 1.0, true, 1, 0); }), "[0, 1)");
  EXPECT_HAS(error_of([&] { dropout(x, -0.1, true, 1, 0); }), "-0.1");
}

TEST(Dropout, KeepsAboutOneMinusPAndScalesTheKept) {
  const double p = 0.3;
  Tensor x = uni({200, 501}, 62, 0.5, 1.5, DType::F32);
  Tensor y = dropout(x, p, true, 1234, 5);
  std::vector<double> vx = x.to_vector(), vy = y.to_vector();
  int64_t kept = 0;
  for (size_t i = 0; i < vx.size(); ++i) {
    if (vy[i] == 0) continue;
    ++kept;
    ASSERT_NEAR(vy[i], vx[i] / (1 - p), 1e-6 * vx[i]) << i;
  }
  EXPECT_NEAR(kept / static_cast<double>(vx.size()), 1 - p, 0.005);  // sd 0.0009
  // The mask is the Bernoulli draw of the same seed and stream, element by element.
  Tensor mask = Tensor::empty({200, 501});
  fill_bernoulli(mask, 1234, 5, 1 - p);
  std::vector<double> vm = mask.to_vector();
  for (size_t i = 0; i < vm.size(); ++i) ASSERT_EQ(vy[i] != 0, vm[i] != 0) << i;
  // Same seed reproduces, another stream differs.
  EXPECT_EQ(dropout(x, p, true, 1234, 5).to_vector(), vy);
  EXPECT_NE(dropout(x, p, true, 1234, 6).to_vector(), vy);
}

TEST(Dropout, AShardDropsExactlyItsSliceOfTheSingleDeviceMask) {
  Tensor x = uni({6, 10}, 63, 0.5, 1.5, DType::F64);
  std::vector<double> whole = dropout(x, 0.4, true, 99, 2).to_vector();
  // Rank holding columns [3, 10) of the logical [6, 10] tensor, from a strided view of x.
  Tensor shard = slice(x, 1, 3, 10);
  std::vector<double> local =
      dropout(shard, 0.4, true, 99, 2, LogicalSlice{{6, 10}, {0, 3}}).to_vector();
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 7; ++c) EXPECT_EQ(local[r * 7 + c], whole[r * 10 + c + 3]);
}

// ---------------------------------------------------------------- dispatch stats

TEST(DispatchStats, CountsEveryCallOfEachOp) {
  Tensor a = uni({3}, 71, 0, 1), b = uni({3}, 72, 0, 1);
  ops::reset_dispatch_stats();
  add(a, b);
  add(a, b);
  mul(a, 2.0);
  const auto& st = ops::dispatch_stats();
  EXPECT_EQ(st.calls[static_cast<size_t>(ops::OpKind::Add)], 2u);
  EXPECT_EQ(st.calls[static_cast<size_t>(ops::OpKind::MulScalar)], 1u);
  EXPECT_EQ(st.calls[static_cast<size_t>(ops::OpKind::Mul)], 0u);
  // bf16 inputs go through casts: two in, one out.
  ops::reset_dispatch_stats();
  add(a.to(DType::BF16), b.to(DType::BF16));
  EXPECT_EQ(ops::dispatch_stats().calls[static_cast<size_t>(ops::OpKind::Cast)], 3u);
  EXPECT_EQ(ops::dispatch_stats().calls[static_cast<size_t>(ops::OpKind::Add)], 1u);
  // Errors in inference count nothing.
  ops::reset_dispatch_stats();
  EXPECT_THROW(add(a, Tensor::zeros({4}, opts(DType::F64))), Error);
  EXPECT_EQ(ops::dispatch_stats().calls[static_cast<size_t>(ops::OpKind::Add)], 0u);
}

// An emulated slower device (ops::EmulatedSpeed, HAP_EMULATE_SPEED): a kernel owes its CPU time
// / speed of wall time less what it took; the debt is paid by a sleep once it reaches
// kPayAtLeastS, what the sleep took is subtracted (an oversleep is credit, up to kPayAtLeastS),
// and time outside kernels is never credited. Worked by hand at speed 0.25.
TEST(EmulatedSpeed, KernelsOweTheirCpuTimeOverTheSpeedAndPayInSleeps) {
  ops::EmulatedSpeed e(0.25);
  const double pay = ops::EmulatedSpeed::kPayAtLeastS;
  // A short kernel: 10 us of CPU in 10 us owes 30 us, too little to sleep for.
  EXPECT_EQ(e.owe(10e-6, 10e-6), 0.0);
  EXPECT_NEAR(e.debt_s(), 30e-6, 1e-15);
  // A longer one tips it over: 1 ms of CPU in 1 ms owes 3 ms more; sleep all 3.03 ms.
  EXPECT_NEAR(e.owe(1e-3, 1e-3), 3.03e-3, 1e-12);
  // The sleep overslept by 0.1 ms: credit for the next kernels.
  e.paid(3.13e-3);
  EXPECT_NEAR(e.debt_s(), -0.1e-3, 1e-12);
  EXPECT_EQ(e.owe(10e-6, 10e-6), 0.0);
  EXPECT_NEAR(e.debt_s(), -0.07e-3, 1e-12);
  // A kernel slowed past its emulated time by other work (1 ms of CPU in 10 ms) earns at most
  // kPayAtLeastS of credit.
  EXPECT_EQ(e.owe(1e-3, 10e-3), 0.0);
  EXPECT_NEAR(e.debt_s(), -pay, 1e-15);
  // Full speed owes nothing; bad speeds are refused.
  ops::EmulatedSpeed full(1.0);
  EXPECT_EQ(full.owe(1e-3, 1e-3), 0.0);
  EXPECT_THROW(ops::EmulatedSpeed(0.0), Error);
  EXPECT_THROW(ops::EmulatedSpeed(1.5), Error);
  // This process emulates no slower device unless HAP_EMULATE_SPEED says so.
  if (std::getenv("HAP_EMULATE_SPEED") == nullptr) {
    EXPECT_EQ(ops::emulated_speed(), 1.0);
  }
}

// ---------------------------------------------------------------- gradcheck (f64)

TEST(ElementwiseGrad, BinaryOpsWithBroadcasting) {
  struct Shapes {
    Shape a, b;
  };
  for (const Shapes& s : std::vector<Shapes>{
           {{3, 4}, {3, 4}}, {{3, 1, 4}, {2, 4}}, {{}, {2, 3}}, {{2, 3}, {1}}, {{5, 1}, {1, 3}}}) {
    for (const BinaryOp& op : kBinaryOps) {
      Tensor a = uni(s.a, 81, -2, 2, DType::F64, true);
      Tensor b = uni(s.b, 82, 0.5, 2, DType::F64, true);
      expect_gradcheck([&](const std::vector<Tensor>& in) { return op.op(in[0], in[1]); }, {a, b},
                       std::string(op.name) + " " + shape_str(s.a) + " " + shape_str(s.b));
    }
  }
}

TEST(ElementwiseGrad, OnlyTheInputsThatRequireGrad) {
  Tensor a = uni({3, 4}, 83, -2, 2, DType::F64, true);
  Tensor b = uni({4}, 84, 0.5, 2, DType::F64, false);
  for (const BinaryOp& op : kBinaryOps) {
    expect_gradcheck([&](const std::vector<Tensor>& in) { return op.op(in[0], in[1]); }, {a, b},
                     op.name);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return op.op(in[1], in[0]); }, {a, b},
                     std::string(op.name) + " swapped");
  }
}

TEST(ElementwiseGrad, UnaryAndScalarOps) {
  for (const UnaryOp& op : unary_ops()) {
    // Keep away from the poles of log, sqrt, rsqrt and negative powers.
    double lo = op.lo >= 0 ? std::max(op.lo, 0.1) : op.lo;
    double hi = std::min(op.hi, 4.0);
    Tensor x = op.name == std::string("relu") ? away_from_zero({3, 5}, 91, 0.1, 2.0, true)
                                              : uni({3, 5}, 91, lo, hi, DType::F64, true);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return op.op(in[0]); }, {x}, op.name);
    // Through a non-contiguous view of the input.
    Tensor x2 = op.name == std::string("relu") ? away_from_zero({5, 3}, 92, 0.1, 2.0, true)
                                               : uni({5, 3}, 92, lo, hi, DType::F64, true);
    expect_gradcheck([&](const std::vector<Tensor>& in) { return op.op(transpose(in[0], 0, 1)); },
                     {x2}, std::string(op.name) + " transposed");
  }
}

TEST(ElementwiseGrad, GeluBothApproximationsAcrossTheRange) {
  Tensor x = Tensor::from_vector(std::vector<double>{-5, -2.5, -1, -0.3, 0.2, 0.7, 1.5, 3, 6}, {9},
                                 opts(DType::F64, true));
  for (GeluApprox a : {GeluApprox::Tanh, GeluApprox::None})
    expect_gradcheck([&](const std::vector<Tensor>& in) { return gelu(in[0], a); }, {x},
                     a == GeluApprox::Tanh ? "gelu tanh" : "gelu erf");
}

TEST(ElementwiseGrad, MaskedFill) {
  Tensor x = uni({2, 4, 4}, 93, -1, 1, DType::F64, true);
  Tensor m = causal_mask(4);
  expect_gradcheck([&](const std::vector<Tensor>& in) { return masked_fill(in[0], m, -3.0); }, {x},
                   "masked_fill");
}

TEST(ElementwiseGrad, DropoutWithAFixedSeed) {
  Tensor x = uni({5, 7}, 94, -1, 1, DType::F64, true);
  expect_gradcheck([&](const std::vector<Tensor>& in) { return dropout(in[0], 0.35, true, 17, 3); },
                   {x}, "dropout");
  Tensor x2 = uni({7, 5}, 95, -1, 1, DType::F64, true);
  expect_gradcheck(
      [&](const std::vector<Tensor>& in) {
        return dropout(transpose(in[0], 0, 1), 0.5, true, 17, 4, LogicalSlice{{5, 9}, {0, 2}});
      },
      {x2}, "dropout of a shard of a strided view");
}

TEST(ElementwiseGrad, CastRoundTripThroughF32KeepsTheLeafDtype) {
  // f64 -> f32 -> f64 loses precision, so no finite differences: check the rule directly.
  Tensor x = uni({4}, 96, -1, 1, DType::F64, true);
  Tensor y = mul(cast(cast(x, DType::F32), DType::F64), 3.0);
  sum(y).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::F64);
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{3, 3, 3, 3}));
}

TEST(ElementwiseGrad, Bf16LeavesGetBf16Gradients) {
  Tensor x = uni({3, 4}, 97, -1, 1, DType::BF16, true);
  Tensor w = uni({4}, 98, -1, 1, DType::BF16, false);
  sum(mul(x, w)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::BF16);
  std::vector<double> g = x.grad().to_vector(), vw = w.to_vector();
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(g[i], vw[i % 4]);
}

}  // namespace
}  // namespace hap

namespace hap {
namespace {

TEST(Bf16, MixingBf16WithF32NamesTheOpAndBothTensors) {
  Tensor a = Tensor::ones({2, 3}, TensorOptions{}.with_dtype(DType::BF16));
  Tensor b = Tensor::ones({2, 3});
  std::string m = test_util::error_of([&] { add(a, b); });
  EXPECT_HAS(m, "op add: inputs mix bf16 and f32");
  EXPECT_HAS(m, "bf16[2, 3]");
  EXPECT_HAS(m, "cast one of them first");
  EXPECT_EQ(add(a, a).dtype(), DType::BF16);
}

}  // namespace
}  // namespace hap
