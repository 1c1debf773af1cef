// Mixed precision by op (ops::AutocastGuard, OpDef::autocast): what each policy casts, that the
// result is exactly the explicitly cast computation, that gradients reach f32 parameters in f32,
// and that backward and the outside of the guard are untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "core/allocator.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using namespace test_util;
using ops::AutocastGuard;

// Same dtype, shape and bytes.
void expect_bitwise(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  EXPECT_EQ(std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()), 0) << what;
}

Tensor bf(const Tensor& t) { return cast(t, DType::BF16); }

TEST(Autocast, OffByDefaultAndRestoredByTheGuard) {
  EXPECT_EQ(ops::autocast_dtype(), DType::F32);
  {
    AutocastGuard on(DType::BF16);
    EXPECT_EQ(ops::autocast_dtype(), DType::BF16);
    {
      AutocastGuard off(DType::F32);
      EXPECT_EQ(ops::autocast_dtype(), DType::F32);
    }
    EXPECT_EQ(ops::autocast_dtype(), DType::BF16);
  }
  EXPECT_EQ(ops::autocast_dtype(), DType::F32);
  EXPECT_NE(error_of([] { AutocastGuard g(DType::F64); }).find("expected f32 (off) or bf16, got"),
            std::string::npos);
}

TEST(Autocast, ProductsRunInBf16AsTheExplicitCastsWould) {
  Tensor x = uni({5, 12}, 1, DType::F32), w = uni({7, 12}, 2, DType::F32),
         b = uni({7}, 3, DType::F32);
  Tensor explicit_linear = linear(bf(x), bf(w), bf(b));
  Tensor explicit_matmul = matmul(bf(x), transpose(bf(w), 0, 1));
  AutocastGuard on(DType::BF16);
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.dtype(), DType::BF16);
  expect_bitwise(y, explicit_linear, "linear");
  expect_bitwise(matmul(x, transpose(w, 0, 1)), explicit_matmul, "matmul");
  // Inputs already bf16 are used as they are.
  expect_bitwise(linear(bf(x), w, b), explicit_linear, "linear of a bf16 input");
}

TEST(Autocast, NormsSoftmaxSumsAndTheLossRunInF32) {
  Tensor x = uni({4, 16}, 4, DType::F32);
  Tensor xb = bf(x);
  Tensor g = uni({16}, 5, DType::F32), beta = uni({16}, 6, DType::F32);
  Tensor targets = Tensor::zeros({4}, opts(DType::I64));
  AutocastGuard on(DType::BF16);
  Tensor ln = layer_norm(xb, g, beta);
  EXPECT_EQ(ln.dtype(), DType::F32);
  {
    AutocastGuard off(DType::F32);
    expect_bitwise(ln, layer_norm(cast(xb, DType::F32), g, beta), "layer_norm");
    expect_bitwise(softmax(cast(xb, DType::F32)), softmax(cast(xb, DType::F32)), "softmax");
  }
  EXPECT_EQ(softmax(xb).dtype(), DType::F32);
  EXPECT_EQ(log_softmax(xb).dtype(), DType::F32);
  EXPECT_EQ(sum(xb).dtype(), DType::F32);
  EXPECT_EQ(mean(xb).dtype(), DType::F32);
  EXPECT_EQ(cross_entropy(xb, targets).dtype(), DType::F32);
  EXPECT_EQ(rms_norm(xb, g).dtype(), DType::F32);
}

TEST(Autocast, MixedOperandsArePromotedToF32AndSingleDtypeOpsKeepTheirs) {
  Tensor a = uni({3, 8}, 7, DType::F32);
  Tensor b = bf(uni({3, 8}, 8, DType::F32));
  // Without the guard mixing stays an error that asks for a cast.
  EXPECT_NE(error_of([&] { add(a, b); }).find("inputs mix bf16 and f32"), std::string::npos);
  AutocastGuard on(DType::BF16);
  Tensor s = add(a, b);  // the residual stream: f32 + a bf16 branch
  EXPECT_EQ(s.dtype(), DType::F32);
  {
    AutocastGuard off(DType::F32);
    expect_bitwise(s, add(a, cast(b, DType::F32)), "add");
  }
  EXPECT_EQ(gelu(b).dtype(), DType::BF16);  // elementwise on one bf16 tensor stays bf16
  EXPECT_EQ(gelu(a).dtype(), DType::F32);
  EXPECT_EQ(reshape(b, {8, 3}).dtype(), DType::BF16);
}

TEST(Autocast, AProductWithoutABf16KernelRunsInF32OnceWithoutRecursing) {
  // conv2d has no bf16 CPU kernel: lowered to bf16, computed in f32 from the bf16 values, rounded
  // to bf16 once.
  Tensor x = uni({2, 3, 6, 6}, 9, DType::F32), w = uni({4, 3, 3, 3}, 10, DType::F32);
  Tensor expected;
  {
    Tensor y32 = conv2d(cast(bf(x), DType::F32), cast(bf(w), DType::F32));
    expected = bf(y32);
  }
  AutocastGuard on(DType::BF16);
  Tensor y = conv2d(x, w);
  EXPECT_EQ(y.dtype(), DType::BF16);
  expect_bitwise(y, expected, "conv2d");
}

TEST(Autocast, GradientsReachF32ParametersInF32AndBackwardIgnoresTheGuard) {
  Tensor x = uni({6, 10}, 11, DType::F32);
  auto run = [&](bool backward_inside) {
    Tensor w = uni({4, 10}, 12, DType::F32, true), b = uni({4}, 13, DType::F32, true);
    Tensor g = uni({4}, 14, DType::F32, true), beta = uni({4}, 15, DType::F32, true);
    Tensor loss;
    {
      AutocastGuard on(DType::BF16);
      Tensor h = layer_norm(gelu(linear(x, w, b)), g, beta);
      loss = sum(mul(h, h));
      if (backward_inside) loss.backward();
    }
    if (!backward_inside) loss.backward();
    return std::vector<Tensor>{loss, w.grad(), b.grad(), g.grad(), beta.grad()};
  };
  std::vector<Tensor> outside = run(false), inside = run(true);
  EXPECT_EQ(outside[0].dtype(), DType::F32);
  for (size_t i = 1; i < outside.size(); ++i) {
    ASSERT_TRUE(outside[i].defined());
    EXPECT_EQ(outside[i].dtype(), DType::F32) << "gradient " << i;
  }
  for (size_t i = 0; i < outside.size(); ++i) expect_bitwise(outside[i], inside[i], "backward");

  // The same computation with every cast written out gives the same bits.
  Tensor w = uni({4, 10}, 12, DType::F32, true), b = uni({4}, 13, DType::F32, true);
  Tensor g = uni({4}, 14, DType::F32, true), beta = uni({4}, 15, DType::F32, true);
  Tensor y = gelu(linear(bf(x), bf(w), bf(b)));  // bf16
  Tensor h = layer_norm(cast(y, DType::F32), g, beta);
  Tensor loss = sum(mul(h, h));
  loss.backward();
  expect_bitwise(outside[0], loss, "loss");
  expect_bitwise(outside[1], w.grad(), "weight gradient");
  expect_bitwise(outside[2], b.grad(), "bias gradient");
  expect_bitwise(outside[3], g.grad(), "layer-norm gain gradient");
}

// An op given bf16 inputs without a bf16 kernel computes in f32 between casts: its own kernel runs
// with ops::in_bf16_route() set (a GPU's GEMMs there may use TF32), the casts around it and
// plain f32 ops without. The record hook sees each of those kernel calls in the route's scope,
// then the op once as itself (bf16 in and out), which autograd records.
struct Seen {
  ops::OpKind kind;
  bool route, scope, routed_call;
  DType in, out;
  bool operator==(const Seen& o) const {
    return kind == o.kind && route == o.route && scope == o.scope && routed_call == o.routed_call &&
           in == o.in && out == o.out;
  }
};
std::vector<Seen> g_route_seen;
ops::RecordHook g_route_chained = nullptr;
void note_route(ops::OpKind kind, const std::vector<Tensor>& in, std::vector<Tensor>& out,
                const ops::Attrs& attrs) {
  g_route_seen.push_back({kind, ops::in_bf16_route(), ops::in_route_scope(),
                          ops::recording_routed_call(), in[0].dtype(), out[0].dtype()});
  if (g_route_chained) g_route_chained(kind, in, out, attrs);
}

TEST(Autocast, OnlyTheKernelOfAnOpComputingBf16InF32RunsInTheBf16Route) {
  const Tensor x = randn({4, 6}, 1), xb = bf(x);
  g_route_chained = ops::record_hook();
  ops::set_record_hook(&note_route);
  g_route_seen.clear();
  const Tensor yb = gelu(xb);  // no bf16 kernel: cast, gelu in f32, cast back
  const Tensor y = gelu(x);    // f32: no route
  ops::set_record_hook(g_route_chained);
  EXPECT_FALSE(ops::in_bf16_route());
  EXPECT_EQ(yb.dtype(), DType::BF16);
  using ops::OpKind;
  const DType B = DType::BF16, F = DType::F32;
  const std::vector<Seen> want = {{OpKind::Cast, false, true, false, B, F},
                                  {OpKind::Gelu, true, true, false, F, F},
                                  {OpKind::Cast, false, true, false, F, B},
                                  {OpKind::Gelu, false, false, true, B, B},
                                  {OpKind::Gelu, false, false, false, F, F}};
  EXPECT_EQ(g_route_seen, want);
}

// Autograd records such an op once, saving its bf16 inputs rather than their f32 copies (the
// memory of bf16 activations: GELU's input in a bf16 MLP, attention's q, k and v), and its
// backward runs in f32 on the widened tensors: the gradients equal, bit for bit, those of the
// explicit casts around the f32 op.
TEST(Autocast, ARoutedOpKeepsItsBf16InputsForBackwardAndItsGradientsEqualTheCasts) {
  const Tensor x0 = bf(mul(uni({64, 256}, 7, DType::F32), 3.0)),
               g = bf(uni({64, 256}, 8, DType::F32));
  auto leaf = [&] {
    Tensor x = x0.clone();
    x.set_requires_grad(true);
    return x;
  };
  // The explicit casts: the f32 copy of x is what GELU's node keeps.
  Tensor xa = leaf();
  Tensor ya = cast(gelu(cast(xa, DType::F32)), DType::BF16);
  ya.backward(g);
  // The route: the same values; GELU keeps x itself.
  hap::cpu_allocator_reset_peak();
  const size_t before = hap::cpu_allocator_stats().allocated_bytes;
  Tensor xb = leaf();
  Tensor yb = gelu(xb);
  const size_t held = hap::cpu_allocator_stats().allocated_bytes - before;
  expect_bitwise(yb, ya, "output");
  // x (bf16), y (bf16): the f32 copies were freed with the forward.
  EXPECT_EQ(held, 2 * x0.nbytes());
  yb.backward(g);
  expect_bitwise(xb.grad(), xa.grad(), "gradient");
  // Attention: q, k, v kept in bf16; out and lse as computed in f32 (lse is f32 anyway).
  auto qkv = [&](uint64_t seed) {
    Tensor t = bf(uni({2, 3, 9, 8}, seed, DType::F32));
    t.set_requires_grad(true);
    return t;
  };
  std::vector<Tensor> a = {qkv(11), qkv(12), qkv(13)}, b = {qkv(11), qkv(12), qkv(13)};
  const Tensor go = bf(uni({2, 3, 9, 8}, 14, DType::F32));
  Tensor oa = cast(scaled_dot_product_attention(cast(a[0], DType::F32), cast(a[1], DType::F32),
                                                cast(a[2], DType::F32)),
                   DType::BF16);
  oa.backward(go);
  Tensor ob = scaled_dot_product_attention(b[0], b[1], b[2]);
  ob.backward(go);
  expect_bitwise(ob, oa, "attention output");
  const char* what[] = {"dq", "dk", "dv"};
  for (size_t i = 0; i < 3; ++i) expect_bitwise(b[i].grad(), a[i].grad(), what[i]);
}

// Attention has no bf16 kernel: on bf16 operands it computes in f32 between casts. Its row
// log-sum-exp is a statistic: it leaves the route in f32 as computed (rounded to bf16 at lse ~ 7
// it would be off by up to 2^-6, and P = exp(s - lse) recomputed from it in backward by as much
// relatively), and the backward takes it in f32 beside bf16 operands. Each result equals the f32
// computation on the widened operands, the bf16 ones rounded once at the end.
TEST(Autocast, AttentionKeepsItsLogSumExpInF32AcrossTheBf16Route) {
  using ops::OpKind;
  auto f32 = [](const Tensor& t) { return cast(t, DType::F32); };
  // Scores of up to ~25 over 9 keys: lse of several units, where bf16 would round it coarsely.
  const Tensor q = bf(mul(uni({2, 3, 9, 8}, 1, DType::F32), 3.0)),
               k = bf(mul(uni({2, 3, 9, 8}, 2, DType::F32), 3.0)),
               v = bf(uni({2, 3, 9, 8}, 3, DType::F32)), go = bf(uni({2, 3, 9, 8}, 4, DType::F32)),
               glse = uni({2, 3, 9}, 5, DType::F32);
  for (const bool causal : {true, false}) {
    ops::AttentionAttrs a;
    a.causal = causal;
    const std::vector<Tensor> fwd = ops::call(OpKind::Attention, {q, k, v, Tensor()}, a);
    const std::vector<Tensor> ref =
        ops::call(OpKind::Attention, {f32(q), f32(k), f32(v), Tensor()}, a);
    EXPECT_EQ(fwd[0].dtype(), DType::BF16);
    expect_bitwise(fwd[0], bf(ref[0]), "out");
    expect_bitwise(fwd[1], ref[1], "lse: f32, not rounded");
    double most = 0;
    const Tensor lse = ref[1].contiguous();
    for (int64_t i = 0; i < lse.numel(); ++i)
      most = std::max(most, std::abs(static_cast<double>(lse.data<float>()[i])));
    EXPECT_GT(most, 4.0) << "the case should have lse of several units";
    for (const bool with_glse : {false, true}) {
      const Tensor gl = with_glse ? glse : Tensor();
      const std::vector<Tensor> g =
          ops::call(OpKind::AttentionBackward, {q, k, v, fwd[0], fwd[1], go, gl, Tensor()}, a);
      const std::vector<Tensor> g32 =
          ops::call(OpKind::AttentionBackward,
                    {f32(q), f32(k), f32(v), f32(fwd[0]), fwd[1], f32(go), gl, Tensor()}, a);
      const char* what[] = {"dq", "dk", "dv"};
      for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(g[i].dtype(), DType::BF16) << what[i];
        expect_bitwise(g[i], bf(g32[i]), what[i]);
      }
    }
  }
  // A rounded lse is refused, as is f32 in an operand's place.
  const std::vector<Tensor> fwd =
      ops::call(OpKind::Attention, {q, k, v, Tensor()}, ops::AttentionAttrs{});
  EXPECT_NE(error_of([&] {
              ops::call(OpKind::AttentionBackward,
                        {q, k, v, fwd[0], bf(fwd[1]), go, Tensor(), Tensor()},
                        ops::AttentionAttrs{});
            }).find("attention_backward: lse is bf16 but q is bf16 (expected f32)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ops::call(OpKind::AttentionBackward,
                        {q, k, v, f32(fwd[0]), fwd[1], go, Tensor(), Tensor()},
                        ops::AttentionAttrs{});
            }).find("inputs mix bf16 and f32"),
            std::string::npos);
  // Mixed precision leaves the statistic alone too.
  AutocastGuard on(DType::BF16);
  const std::vector<Tensor> under =
      ops::call(OpKind::AttentionBackward, {q, k, v, fwd[0], fwd[1], go, glse, Tensor()},
                ops::AttentionAttrs{});
  EXPECT_EQ(under[0].dtype(), DType::BF16);
}

// Under mixed precision a product reads a bf16 copy of its f32 weight. Kept for backward, those
// copies would be a second set of weights held through the step (248 MiB for GPT-2 124M): the op
// keeps a way to cast the parameter again instead, and its backward gives the same gradients.
TEST(Autocast, TheBf16CopyOfAParameterIsCastAgainForBackwardInsteadOfKept) {
  const Tensor x = uni({8, 256}, 21, DType::F32), g = bf(uni({8, 512}, 22, DType::F32));
  auto param = [] {
    Tensor w = uni({512, 256}, 23, DType::F32);
    w.set_requires_grad(true);
    return w;
  };
  Tensor wa = param(), wb = param();
  Tensor ya = linear(bf(x), cast(wa, DType::BF16));  // outside the guard: the copy is kept
  ya.backward(g);
  const size_t before = hap::cpu_allocator_stats().allocated_bytes;
  Tensor yb;
  {
    AutocastGuard on(DType::BF16);
    yb = linear(x, wb);
  }
  // Held: x's bf16 copy (saved) and the output; not the weight's bf16 copy.
  const size_t held = hap::cpu_allocator_stats().allocated_bytes - before;
  EXPECT_EQ(held, x.numel() * 2 + yb.nbytes());
  expect_bitwise(yb, ya, "output");
  yb.backward(g);
  expect_bitwise(wb.grad(), wa.grad(), "weight gradient");
}

// The stacked q, k, v weight is read through views (split, reshape): the bf16 copy of such a view
// of a parameter is cast again for backward as well, from the view made again of the parameter.
TEST(Autocast, TheBf16CopyOfAViewOfAParameterIsCastAgainForBackward) {
  const Tensor x = uni({8, 64}, 24, DType::F32), g = bf(uni({8, 32}, 25, DType::F32));
  auto param = [] {
    Tensor w = uni({3, 32, 64}, 26, DType::F32);
    w.set_requires_grad(true);
    return w;
  };
  Tensor wa = param(), wb = param();
  Tensor ya = linear(bf(x), cast(reshape(split(wa, {1, 1, 1}, 0)[1], {32, 64}), DType::BF16));
  ya.backward(g);
  const size_t before = hap::cpu_allocator_stats().allocated_bytes;
  Tensor yb;
  {
    AutocastGuard on(DType::BF16);
    yb = linear(x, reshape(split(wb, {1, 1, 1}, 0)[1], {32, 64}));
  }
  // Held: x's bf16 copy (saved) and the output; not the bf16 copy of the weight's slice.
  const size_t held = hap::cpu_allocator_stats().allocated_bytes - before;
  EXPECT_EQ(held, x.numel() * 2 + yb.nbytes());
  expect_bitwise(yb, ya, "output");
  yb.backward(g);
  expect_bitwise(wb.grad(), wa.grad(), "weight gradient");
}

// An op given f32 copies of bf16 operands (a norm, the loss: Autocast::Float; or an addition of
// f32 and bf16: Promote) keeps the bf16 operands for backward, not the f32 copies (the logits of
// a language model in bf16 are half the bytes), and widens them there: the casts are exact, so
// the loss and the gradients equal, bit for bit, those of the explicit casts.
TEST(Autocast, AnOpTakingF32CopiesOfBf16OperandsKeepsTheBf16OnesForBackward) {
  const Tensor logits0 = bf(mul(uni({64, 1000}, 31, DType::F32), 4.0));
  std::vector<int64_t> t;
  for (int64_t i = 0; i < 64; ++i) t.push_back((i * 37) % 1000);
  const Tensor targets = Tensor::from_vector(t, {64});
  auto leaf = [](const Tensor& v) {
    Tensor x = v.clone();
    x.set_requires_grad(true);
    return x;
  };
  Tensor la = leaf(logits0);
  Tensor loss_a = cross_entropy(cast(la, DType::F32), targets);
  loss_a.backward();
  const size_t before = hap::cpu_allocator_stats().allocated_bytes;
  Tensor lb = leaf(logits0), loss_b;
  {
    AutocastGuard on(DType::BF16);
    loss_b = cross_entropy(lb, targets);
  }
  const size_t held = hap::cpu_allocator_stats().allocated_bytes - before;
  // The bf16 logits and what the loss keeps of its own; not the logits' f32 copy.
  EXPECT_LT(held, logits0.numel() * 4);
  ASSERT_TRUE(loss_b.grad_fn());
  EXPECT_EQ(loss_b.grad_fn()->saved_inputs[0].dtype(), DType::BF16);
  expect_bitwise(loss_b, loss_a, "loss");
  loss_b.backward();
  expect_bitwise(lb.grad(), la.grad(), "logits gradient");

  // f32 + bf16: the sum in f32; the addition keeps no operand (its backward reads shapes).
  const Tensor r0 = uni({16, 128}, 32, DType::F32), b0 = bf(uni({16, 128}, 33, DType::F32));
  const Tensor g = uni({16, 128}, 34, DType::F32);
  Tensor ra = leaf(r0), ba = leaf(b0), rb = leaf(r0), bb = leaf(b0);
  Tensor sa = add(ra, cast(ba, DType::F32));
  sa.backward(g);
  const size_t before_add = hap::cpu_allocator_stats().allocated_bytes;
  Tensor sb;
  {
    AutocastGuard on(DType::BF16);
    sb = add(rb, bb);
  }
  EXPECT_EQ(hap::cpu_allocator_stats().allocated_bytes - before_add, sb.nbytes());
  expect_bitwise(sb, sa, "sum");
  sb.backward(g);
  expect_bitwise(rb.grad(), ra.grad(), "f32 operand's gradient");
  expect_bitwise(bb.grad(), ba.grad(), "bf16 operand's gradient");
}

TEST(Autocast, OutsideTheGuardNothingChanges) {
  Tensor x = uni({3, 5}, 16, DType::F32), w = uni({2, 5}, 17, DType::F32);
  EXPECT_EQ(linear(x, w).dtype(), DType::F32);
  EXPECT_EQ(layer_norm(x, Tensor(), Tensor()).dtype(), DType::F32);
  Tensor x64 = uni({3, 5}, 18, DType::F64), w64 = uni({2, 5}, 19, DType::F64);
  AutocastGuard on(DType::BF16);
  EXPECT_EQ(linear(x64, w64).dtype(), DType::F64) << "only f32 is lowered";
}

}  // namespace
}  // namespace hap
