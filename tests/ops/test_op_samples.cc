// Every op of the registry on the CPU, driven by the sample table (tests/ops/op_samples.h): each
// OpKind has samples; each sample runs, its outputs have the shapes and dtypes its inference
// gives; a non-contiguous view of the same values gives the same result; the f32 run agrees with
// the f64 one; the backward rules match central differences in f64; the in-place optimizer
// updates change the parameters and states and nothing else. tests/gpu/test_cuda_registry.cc
// runs the same table on the GPU against the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "ops/dispatch.h"
#include "ops/op.h"
#include "tests/ops/op_samples.h"

namespace hap::op_samples {
namespace {

std::string label(const OpSample& s) {
  return std::string(kind_name(s.kind)) + " [" + s.name + "]";
}

std::vector<OpSample> every_sample() {
  std::vector<OpSample> all;
  for (OpKind k : all_kinds())
    for (OpSample& s : op_samples(k)) all.push_back(std::move(s));
  return all;
}

ops::Metas metas_of(const std::vector<Tensor>& in) {
  ops::Metas m;
  for (const Tensor& t : in) {
    if (t.defined()) {
      m.push_back({t.shape(), t.dtype(), true});
    } else {
      m.push_back({{}, DType::F32, false});
    }
  }
  return m;
}

// Equal values (NaN equal to NaN), shapes and dtypes.
void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const std::vector<double> a = got.to_vector(), b = want.to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(a[i], b[i]) << what << " element " << i;
  }
}

void expect_near_all(const Tensor& got, const Tensor& want, double rtol, double atol,
                     const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> a = got.to_vector(), b = want.to_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    ASSERT_LE(std::abs(a[i] - b[i]), atol + rtol * std::abs(b[i]))
        << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

// What a run of `s` on `in` is judged by: its outputs, or for the in-place updates the inputs
// they wrote.
std::vector<Tensor> results(const OpSample& s, const std::vector<Tensor>& in) {
  std::vector<Tensor> out = ops::call(s.kind, in, s.attrs);
  return s.in_place ? in : out;
}

TEST(OpSamples, EveryOpKindHasASample) {
  ASSERT_EQ(all_kinds().size(), ops::kNumOps);
  std::vector<std::string> missing;
  size_t samples = 0;
  for (OpKind k : all_kinds()) {
    const std::vector<OpSample> v = op_samples(k);
    samples += v.size();
    if (v.empty()) missing.push_back(kind_name(k));
    for (const OpSample& s : v) {
      EXPECT_EQ(s.kind, k) << label(s);
      EXPECT_EQ(s.differentiable.size(), s.inputs.size()) << label(s);
      EXPECT_EQ(s.viewable.size(), s.inputs.size()) << label(s);
    }
  }
  EXPECT_EQ(missing, std::vector<std::string>{}) << "ops without a sample";
  std::printf("%zu samples over %zu op kinds\n", samples, ops::kNumOps);
}

// The view helper really makes non-contiguous views of the same values, so that the view test
// below compares two different memory layouts.
TEST(OpSamples, ViewsAreNonContiguousWithTheSameValues) {
  for (const Shape& s : {Shape{7}, Shape{5, 37}, Shape{3, 5, 7}, Shape{2, 3, 9, 11}}) {
    const Tensor x = rn(s, 1000);
    const Tensor v = noncontig(x);
    EXPECT_FALSE(v.is_contiguous() && v.offset() == 0) << shape_str(s);
    EXPECT_FALSE(v.is_contiguous()) << shape_str(s);
    EXPECT_EQ(v.to_vector(), x.to_vector()) << shape_str(s);
  }
  // Every sample with a float input has a view variant, and its viewable inputs are views.
  for (const OpSample& s : every_sample()) {
    bool any_float = false;
    for (const Tensor& x : s.inputs)
      any_float = any_float || (x.defined() && is_floating(x.dtype()) && x.dim() > 0);
    EXPECT_EQ(has_views(s), any_float) << label(s);
    const std::vector<Tensor> in = materialize(s, DType::F64, true);
    for (size_t i = 0; i < s.inputs.size(); ++i) {
      if (s.viewable[i]) {
        EXPECT_FALSE(in[i].is_contiguous()) << label(s) << " input " << i;
        EXPECT_EQ(in[i].to_vector(), s.inputs[i].to_vector()) << label(s) << " input " << i;
      }
    }
  }
}

TEST(OpSamples, EverySampleRunsWithItsInferredShapesAndDtypes) {
  size_t n = 0;
  for (const OpSample& s : every_sample()) {
    SCOPED_TRACE(label(s));
    const std::vector<Tensor> in = materialize(s, DType::F64, false);
    std::vector<Tensor> out;
    ASSERT_NO_THROW(out = ops::call(s.kind, in, s.attrs));
    const ops::Metas want = ops::op_def(s.kind).infer(metas_of(in), s.attrs);
    if (s.in_place) {
      EXPECT_TRUE(out.empty());
      EXPECT_TRUE(want.empty());
      ++n;
      continue;
    }
    ASSERT_EQ(out.size(), want.size());
    ASSERT_FALSE(out.empty());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(out[i].defined()) << "output " << i;
      EXPECT_EQ(out[i].shape(), want[i].shape) << "output " << i;
      EXPECT_EQ(out[i].dtype(), want[i].dtype) << "output " << i;
      EXPECT_EQ(out[i].device(), Device::cpu()) << "output " << i;
      // No sample makes NaN or infinity: one here is an unwritten (poisoned) or wrong output.
      for (double x : out[i].to_vector()) {
        ASSERT_TRUE(std::isfinite(x)) << "output " << i << " has " << x;
      }
    }
    ++n;
  }
  EXPECT_GT(n, ops::kNumOps);
}

// A view input gives the contiguous input's result bit for bit: the kernels read views in
// logical order (or copy them to contiguous first) and sum in the same order either way.
TEST(OpSamples, NonContiguousViewsGiveTheContiguousResult) {
  size_t n = 0;
  for (const OpSample& s : every_sample()) {
    if (!has_views(s)) continue;
    SCOPED_TRACE(label(s));
    for (DType d : {DType::F64, DType::F32}) {
      if (d == DType::F32 && !s.f32) continue;
      SCOPED_TRACE(dtype_name(d));
      const std::vector<Tensor> wa = results(s, materialize(s, d, false)),
                                wb = results(s, materialize(s, d, true));
      ASSERT_EQ(wa.size(), wb.size());
      for (size_t i = 0; i < wa.size(); ++i) {
        if (!wa[i].defined()) continue;
        const std::string what = "output " + std::to_string(i);
        if (s.view_rtol == 0) {
          expect_same(wb[i], wa[i], what);
        } else {
          expect_near_all(wb[i], wa[i], s.view_rtol, s.view_rtol, what);
        }
      }
      ++n;
    }
  }
  EXPECT_GT(n, ops::kNumOps);
}

// The f32 kernels against the f64 ones on the same values. f32 keeps 24 bits (6e-8 relative);
// the samples' sums run over at most a few hundred terms of magnitude <= ~10 and the CPU's fast
// exp/tanh approximations add a few ulp, so 1e-4 relative plus 1e-4 absolute bounds the
// difference with a wide margin while still catching a wrong formula or index.
TEST(OpSamples, F32AgreesWithF64) {
  size_t n = 0;
  for (const OpSample& s : every_sample()) {
    if (!s.f32) continue;
    SCOPED_TRACE(label(s));
    const std::vector<Tensor> wa = results(s, materialize(s, DType::F64, false)),
                              wb = results(s, materialize(s, DType::F32, false));
    ASSERT_EQ(wa.size(), wb.size());
    for (size_t i = 0; i < wa.size(); ++i) {
      if (!wa[i].defined()) continue;
      const std::string what = "output " + std::to_string(i);
      if (!is_floating(wa[i].dtype())) {
        expect_same(wb[i], wa[i], what);  // indices, counts, token ids: exact
        continue;
      }
      // Float outputs are f32 (or the dtype a cast asks for) from f32 inputs.
      if (wa[i].dtype() == DType::F64 && s.kind != OpKind::Cast && s.kind != OpKind::SumOfSquares) {
        EXPECT_EQ(wb[i].dtype(), DType::F32) << what;
      }
      const double tol = wb[i].dtype() == DType::BF16 ? 1e-2 : 1e-4;
      expect_near_all(wb[i], wa[i], tol, tol, what);
    }
    ++n;
  }
  EXPECT_GT(n, ops::kNumOps);
}

// The op's float outputs as one f64 tensor (flattened and concatenated when several).
Tensor float_outputs(OpKind k, const std::vector<Tensor>& in, const ops::Attrs& attrs) {
  std::vector<Tensor> parts;
  for (const Tensor& y : ops::call(k, in, attrs))
    if (y.defined() && is_floating(y.dtype()))
      parts.push_back(ops::call1(OpKind::Reshape, {y}, ops::ShapeAttrs{{-1}}));
  HAP_CHECK(!parts.empty(), "no float output");
  if (parts.size() == 1) return parts[0];
  return ops::call1(OpKind::Concat, parts, ops::DimAttrs{0, false});
}

// Central differences against the backward rules, in f64 (gradcheck's defaults: step 1e-6,
// atol 1e-6, rtol 1e-4: the truncation error is O(step^2) ~ 1e-12 and the rounding error
// ~ 1e-16 / 1e-6 = 1e-10 times the magnitudes, both far below them).
TEST(OpSamples, GradientsMatchFiniteDifferences) {
  size_t checked = 0;
  std::vector<std::string> skipped;
  std::vector<bool> kind_checked(ops::kNumOps, false);
  for (const OpSample& s : every_sample()) {
    if (ops::op_def(s.kind).backward == nullptr || !has_differentiable(s)) continue;
    SCOPED_TRACE(label(s));
    std::vector<Tensor> in = materialize(s, DType::F64, false);
    // gradcheck needs an f64 output: casts to f32 or bf16 are checked through "to f64".
    bool f64_out = true;
    for (const Tensor& y : ops::call(s.kind, in, s.attrs))
      if (is_floating(y.dtype()) && y.dtype() != DType::F64) f64_out = false;
    if (!f64_out) {
      skipped.push_back(label(s) + ": output not f64");
      continue;
    }
    if (!s.no_gradcheck.empty()) {
      skipped.push_back(label(s) + ": " + s.no_gradcheck);
      continue;
    }
    for (size_t i = 0; i < in.size(); ++i)
      if (s.differentiable[i]) in[i].set_requires_grad(true);
    const OpKind k = s.kind;
    const ops::Attrs attrs = s.attrs;
    const autograd::GradcheckResult r = autograd::gradcheck(
        [&](const std::vector<Tensor>& x) { return float_outputs(k, x, attrs); }, in);
    EXPECT_TRUE(r.ok) << r.message << " (max error " << r.max_abs_error << ")";
    kind_checked[static_cast<size_t>(s.kind)] = true;
    ++checked;
  }
  // Every op kind with a backward rule is checked by at least one sample.
  std::vector<std::string> unchecked;
  for (OpKind k : all_kinds()) {
    if (ops::op_def(k).backward != nullptr && !kind_checked[static_cast<size_t>(k)]) {
      unchecked.push_back(kind_name(k));
    }
  }
  EXPECT_EQ(unchecked, std::vector<std::string>{}) << "ops with a backward rule but no gradcheck";
  EXPECT_GE(checked, size_t{40});
  std::printf("gradcheck: %zu samples\n", checked);
  for (const std::string& why : skipped) std::printf("gradcheck skipped: %s\n", why.c_str());
}

// The check above can fail: a function whose recorded gradient misses a term (x * x with one
// factor detached: analytic x, numeric 2x) is caught by the same gradcheck call.
TEST(OpSamples, GradcheckCatchesAWrongGradient) {
  Tensor x = rn({5, 7}, 77);
  x.set_requires_grad(true);
  const autograd::GradcheckResult r = autograd::gradcheck(
      [](const std::vector<Tensor>& in) {
        return ops::call1(OpKind::Mul, {in[0], in[0].detach()});
      },
      {x});
  EXPECT_FALSE(r.ok);
  EXPECT_GT(r.max_abs_error, 0.1);
}

// SgdUpdate and AdamWUpdate: every parameter element and every state element moves, the
// gradients are untouched, everything stays finite, and the op returns nothing.
TEST(OpSamples, InPlaceUpdatesChangeParametersAndStatesOnly) {
  size_t n = 0;
  for (const OpSample& s : every_sample()) {
    if (!s.in_place) continue;
    SCOPED_TRACE(label(s));
    const size_t group = s.kind == OpKind::AdamWUpdate ? 4 : 3;
    std::vector<Tensor> in = materialize(s, DType::F64, false);
    std::vector<std::vector<double>> before;
    for (const Tensor& t : in) before.push_back(t.to_vector());
    EXPECT_TRUE(ops::call(s.kind, in, s.attrs).empty());
    for (size_t i = 0; i < in.size(); ++i) {
      const std::vector<double> after = in[i].to_vector();
      ASSERT_EQ(after.size(), before[i].size());
      for (size_t e = 0; e < after.size(); ++e) {
        ASSERT_TRUE(std::isfinite(after[e])) << "input " << i << " element " << e;
        if (i % group == 1) {
          ASSERT_EQ(after[e], before[i][e]) << "gradient " << i << " element " << e;
        } else {
          ASSERT_NE(after[e], before[i][e]) << "input " << i << " element " << e;
        }
      }
    }
    // SGD, second parameter: step 0 starts the momentum buffer from the gradient itself
    // (no weight decay there), and the nesterov step is p - lr (g + momentum g).
    if (s.kind == OpKind::SgdUpdate) {
      const ops::OptimizerAttrs& a = std::get<ops::OptimizerAttrs>(s.attrs);
      const std::vector<double> p = in[3].to_vector(), buf = in[5].to_vector();
      for (size_t e = 0; e < p.size(); ++e) {
        EXPECT_EQ(buf[e], before[4][e]) << "momentum buffer element " << e;
        const double want = before[3][e] - a.lr[1] * (before[4][e] + a.momentum * before[4][e]);
        EXPECT_NEAR(p[e], want, 1e-14) << "parameter element " << e;
      }
    }
    ++n;
  }
  EXPECT_EQ(n, 2u);
}

}  // namespace
}  // namespace hap::op_samples
