// The op registry: every OpKind has a complete, uniquely named entry; dispatch checks arity,
// optional inputs and devices; FLOP counts and sharding signatures of the core ops are well
// formed; attributes print.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "ops/op.h"
#include "tests/test_util.h"

namespace hap::ops {
namespace {

using namespace test_util;

TEST(Registry, TableBuildsAndEveryOpHasACompleteEntry) {
  ASSERT_NO_THROW(op_table());
  for (size_t i = 0; i < kNumOps; ++i) {
    OpKind k = static_cast<OpKind>(i);
    const OpDef& d = op_def(k);
    SCOPED_TRACE(op_name(k));
    ASSERT_NE(op_name(k), nullptr);
    ASSERT_NE(d.name, nullptr);
    EXPECT_GT(std::string(d.name).size(), 0u);
    EXPECT_NE(d.infer, nullptr);
    EXPECT_NE(d.cpu, nullptr);
    EXPECT_TRUE(d.num_inputs == -1 || d.num_inputs >= 1) << d.num_inputs;
    if (d.num_inputs > 0) {
      EXPECT_LT(d.optional_inputs, 1u << d.num_inputs);
    }
  }
}

// Where the CUDA backend is built, every op runs on a GPU: its own kernel, or a CPU kernel that
// serves any device (views, copies through the backend's tensor operations).
TEST(Registry, EveryOpHasACudaKernel) {
#ifndef HAP_HAVE_CUDA
  GTEST_SKIP() << "built without the CUDA backend";
#else
  std::vector<std::string> missing;
  for (size_t i = 0; i < kNumOps; ++i) {
    const OpDef& d = op_def(static_cast<OpKind>(i));
    if (d.cuda == nullptr && !d.any_device) missing.push_back(d.name);
  }
  EXPECT_EQ(missing, std::vector<std::string>{});
#endif
}

TEST(Registry, OpNamesAreUniqueAndLowerSnakeCase) {
  std::set<std::string> names, kinds;
  for (size_t i = 0; i < kNumOps; ++i) {
    OpKind k = static_cast<OpKind>(i);
    std::string n = op_def(k).name;
    EXPECT_TRUE(names.insert(n).second) << "duplicate op name " << n;
    EXPECT_TRUE(kinds.insert(op_name(k)).second) << "duplicate kind name " << op_name(k);
    for (char c : n) EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') << n;
  }
  EXPECT_EQ(names.size(), kNumOps);
  EXPECT_STREQ(op_def(OpKind::MatMul).name, "matmul");
  EXPECT_STREQ(op_def(OpKind::AddScalar).name, "add_scalar");
  EXPECT_STREQ(op_name(OpKind::MatMul), "MatMul");
}

TEST(Registry, DifferentiableOpsHaveBackwardRules) {
  for (OpKind k : {OpKind::MatMul,    OpKind::Linear,     OpKind::Add,        OpKind::Sub,
                   OpKind::Mul,       OpKind::Div,        OpKind::AddScalar,  OpKind::MulScalar,
                   OpKind::PowScalar, OpKind::Neg,        OpKind::Exp,        OpKind::Log,
                   OpKind::Sqrt,      OpKind::Rsqrt,      OpKind::Tanh,       OpKind::Gelu,
                   OpKind::Relu,      OpKind::Sigmoid,    OpKind::Softmax,    OpKind::LogSoftmax,
                   OpKind::LayerNorm, OpKind::RmsNorm,    OpKind::Embedding,  OpKind::Dropout,
                   OpKind::Sum,       OpKind::Mean,       OpKind::Max,        OpKind::Reshape,
                   OpKind::Permute,   OpKind::Slice,      OpKind::Expand,     OpKind::Concat,
                   OpKind::Split,     OpKind::Contiguous, OpKind::MaskedFill, OpKind::CrossEntropy,
                   OpKind::Attention, OpKind::TopK,       OpKind::Cast})
    EXPECT_NE(op_def(k).backward, nullptr) << op_name(k);
  // Integer-valued outputs have no gradient.
  EXPECT_EQ(op_def(OpKind::Argmax).backward, nullptr);
}

TEST(Registry, AttrsPrintAsKeyValuePairs) {
  EXPECT_EQ(attrs_str(NoAttrs{}), "");
  EXPECT_EQ(attrs_str(ScalarAttrs{2.5}), "value=2.5");
  EXPECT_EQ(attrs_str(ReduceAttrs{{0, 2}, true}), "dims=[0, 2] keepdim");
  EXPECT_EQ(attrs_str(SliceAttrs{1, 2, 5}), "dim=1 start=2 end=5");
  EXPECT_EQ(attrs_str(CastAttrs{DType::BF16}), "dtype=bf16");
  EXPECT_EQ(attrs_str(GeluAttrs{GeluApprox::None}), "approx=none");
  EXPECT_EQ(attrs_str(TopKAttrs{3, -1, false}), "k=3 dim=-1 smallest");
}

// ---------------------------------------------------------------- dispatch checks

TEST(Dispatch, WrongArityAndMissingInputsNameTheOp) {
  Tensor a = Tensor::zeros({2});
  std::string msg = error_of([&] { call(OpKind::Add, {a}); });
  EXPECT_HAS(msg, "add");
  EXPECT_HAS(msg, "expected 2 inputs, got 1");
  msg = error_of([&] { call(OpKind::Add, {a, Tensor()}); });
  EXPECT_HAS(msg, "add");
  EXPECT_HAS(msg, "input 1 is an undefined tensor");
  msg = error_of([&] { call(OpKind::Concat, {}, DimAttrs{0, false}); });
  EXPECT_HAS(msg, "concat");
  // Linear's bias is optional, its weight is not.
  EXPECT_NO_THROW(call(OpKind::Linear, {Tensor::zeros({3, 2}), Tensor::zeros({4, 2}), Tensor()}));
  msg = error_of([&] { call(OpKind::Linear, {Tensor::zeros({3, 2}), Tensor(), Tensor()}); });
  EXPECT_HAS(msg, "input 1");
}

TEST(Dispatch, OutputsNeverAliasAnInputsImpl) {
  Tensor x = Tensor::zeros({3});
  Tensor y = call1(OpKind::Reshape, {x}, ShapeAttrs{{3}});
  EXPECT_FALSE(y.same(x));
  EXPECT_EQ(y.raw_data(), x.raw_data());
}

TEST(Dispatch, StatsCountCallsPerOp) {
  reset_dispatch_stats();
  Tensor x = Tensor::ones({2, 3});
  for (int i = 0; i < 4; ++i) x = exp(x);
  sum(x);
  transpose(x, 0, 1);  // one Permute
  EXPECT_EQ(dispatch_stats().calls[static_cast<size_t>(OpKind::Exp)], 4u);
  EXPECT_EQ(dispatch_stats().calls[static_cast<size_t>(OpKind::Sum)], 1u);
  EXPECT_EQ(dispatch_stats().calls[static_cast<size_t>(OpKind::Permute)], 1u);
  uint64_t total = 0;
  for (uint64_t c : dispatch_stats().calls) total += c;
  EXPECT_EQ(total, 6u);
  reset_dispatch_stats();
  for (uint64_t c : dispatch_stats().calls) EXPECT_EQ(c, 0u);
}

// ---------------------------------------------------------------- FLOPs and sharding signatures

struct Example {
  OpKind kind;
  Metas in;
  Attrs attrs;
};

TensorMeta m(Shape s, DType dt = DType::F32) { return {std::move(s), dt, true}; }

std::vector<Example> examples() {
  return {
      {OpKind::MatMul, {m({4, 6}), m({6, 5})}, NoAttrs{}},
      {OpKind::MatMul, {m({2, 1, 4, 6}), m({3, 6, 5})}, NoAttrs{}},
      {OpKind::MatMul, {m({4, 6}), m({3, 6, 5})}, NoAttrs{}},
      {OpKind::Linear, {m({2, 3, 6}), m({5, 6}), m({5})}, NoAttrs{}},
      {OpKind::Linear, {m({3, 6}), m({5, 6}), {{}, DType::F32, false}}, NoAttrs{}},
      {OpKind::Add, {m({3, 1, 5}), m({4, 5})}, NoAttrs{}},
      {OpKind::Sub, {m({3, 4}), m({3, 4})}, NoAttrs{}},
      {OpKind::Mul, {m({3, 4}), m({4})}, NoAttrs{}},
      {OpKind::Div, {m({3, 4}), m({})}, NoAttrs{}},
      {OpKind::AddScalar, {m({3, 4})}, ScalarAttrs{1}},
      {OpKind::MulScalar, {m({3, 4})}, ScalarAttrs{2}},
      {OpKind::PowScalar, {m({3, 4})}, ScalarAttrs{2}},
      {OpKind::Gelu, {m({3, 4})}, GeluAttrs{}},
      {OpKind::Exp, {m({3, 4})}, NoAttrs{}},
      {OpKind::MaskedFill, {m({2, 4, 4}), m({4, 4}, DType::U8)}, ScalarAttrs{0}},
      {OpKind::Dropout, {m({3, 4})}, RandomAttrs{0.1, 1, 0, {}}},
      {OpKind::Cast, {m({3, 4})}, CastAttrs{DType::BF16}},
      {OpKind::Sum, {m({3, 4, 5})}, ReduceAttrs{{1}, false}},
      {OpKind::Mean, {m({3, 4, 5})}, ReduceAttrs{{0, 2}, true}},
      {OpKind::Max, {m({3, 4, 5})}, DimAttrs{1, false}},
      {OpKind::Argmax, {m({3, 4, 5})}, DimAttrs{-1, true}},
      {OpKind::TopK, {m({3, 4, 5})}, TopKAttrs{2, 1, true}},
      {OpKind::Reshape, {m({4, 6})}, ShapeAttrs{{2, 2, 6}}},
      {OpKind::Reshape, {m({2, 3, 4})}, ShapeAttrs{{6, 4}}},
      {OpKind::Permute, {m({2, 3, 4})}, PermuteAttrs{{2, 0, 1}}},
      {OpKind::Slice, {m({4, 6})}, SliceAttrs{1, 1, 4}},
      {OpKind::Expand, {m({3, 1})}, ShapeAttrs{{2, 3, 4}}},
      {OpKind::Concat, {m({2, 3}), m({2, 5})}, DimAttrs{1, false}},
      {OpKind::Split, {m({2, 7})}, SplitAttrs{1, {3, 4}}},
      {OpKind::Contiguous, {m({2, 7})}, NoAttrs{}},
  };
}

TEST(Registry, FlopCountsOfCoreOps) {
  const OpDef& mm = op_def(OpKind::MatMul);
  Metas in = {m({4, 6}), m({6, 5})};
  Metas out = mm.infer(in, NoAttrs{});
  ASSERT_NE(mm.flops, nullptr);
  EXPECT_EQ(mm.flops(in, out, NoAttrs{}), 2.0 * 4 * 6 * 5);
  Metas bin = {m({2, 1, 4, 6}), m({3, 6, 5})};
  EXPECT_EQ(mm.flops(bin, mm.infer(bin, NoAttrs{}), NoAttrs{}), 2.0 * 6 * 4 * 6 * 5);
  const OpDef& li = op_def(OpKind::Linear);
  Metas lin = {m({2, 3, 6}), m({5, 6}), m({5})};
  EXPECT_EQ(li.flops(lin, li.infer(lin, NoAttrs{}), NoAttrs{}), 2.0 * 6 * 6 * 5);
  const OpDef& add = op_def(OpKind::Add);
  Metas ain = {m({3, 1, 5}), m({4, 5})};
  EXPECT_EQ(add.flops(ain, add.infer(ain, NoAttrs{}), NoAttrs{}), 60.0);
  const OpDef& sm = op_def(OpKind::Sum);
  Metas sin = {m({3, 4, 5})};
  EXPECT_EQ(sm.flops(sin, sm.infer(sin, ReduceAttrs{{1}, false}), ReduceAttrs{{1}, false}), 60.0);
  for (const Example& e : examples()) {
    const OpDef& d = op_def(e.kind);
    if (!d.flops) continue;
    EXPECT_GE(d.flops(e.in, d.infer(e.in, e.attrs), e.attrs), 0.0) << d.name;
  }
}

TEST(Registry, ShardingSignaturesAreWellFormed) {
  for (const Example& e : examples()) {
    const OpDef& d = op_def(e.kind);
    SCOPED_TRACE(d.name);
    Metas out = d.infer(e.in, e.attrs);
    if (!d.shard) continue;
    std::vector<ShardSignature> sigs = d.shard(e.in, out, e.attrs);
    for (const ShardSignature& s : sigs) {
      ASSERT_EQ(s.inputs.size(), e.in.size());
      ASSERT_EQ(s.outputs.size(), out.size());
      bool any_split = false;
      for (size_t i = 0; i < s.inputs.size(); ++i) {
        const Prop& p = s.inputs[i];
        if (p.kind == PropKind::Sharded) {
          ASSERT_TRUE(e.in[i].defined);
          EXPECT_GE(p.dim, 0);
          EXPECT_LT(p.dim, static_cast<int64_t>(e.in[i].shape.size()))
              << "input " << i << " " << p.str();
          any_split = true;
        }
        if (p.kind != PropKind::Replicated) any_split = true;
      }
      for (size_t i = 0; i < s.outputs.size(); ++i) {
        const Prop& p = s.outputs[i];
        if (p.kind == PropKind::Sharded) {
          EXPECT_GE(p.dim, 0);
          EXPECT_LT(p.dim, static_cast<int64_t>(out[i].shape.size()))
              << "output " << i << " " << p.str();
        }
        if (p.kind != PropKind::Replicated) any_split = true;
      }
      // The all-Replicated signature is implicit and must not be listed.
      EXPECT_TRUE(any_split) << "an all-Replicated signature is listed";
    }
  }
}

TEST(Registry, ShardingSignaturesOfMatmulAndLinear) {
  auto has = [](const std::vector<ShardSignature>& sigs, const std::vector<Prop>& in,
                const std::vector<Prop>& out) {
    for (const ShardSignature& s : sigs)
      if (s.inputs == in && s.outputs == out) return true;
    return false;
  };
  Metas in = {m({4, 6}), m({6, 5})};
  const OpDef& mm = op_def(OpKind::MatMul);
  auto sigs = mm.shard(in, mm.infer(in, NoAttrs{}), NoAttrs{});
  EXPECT_TRUE(has(sigs, {Prop::sharded(0), Prop::replicated()}, {Prop::sharded(0)}));
  EXPECT_TRUE(has(sigs, {Prop::replicated(), Prop::sharded(1)}, {Prop::sharded(1)}));
  EXPECT_TRUE(has(sigs, {Prop::sharded(1), Prop::sharded(0)}, {Prop::partial()}));
  Metas lin = {m({2, 3, 6}), m({5, 6}), m({5})};
  const OpDef& li = op_def(OpKind::Linear);
  auto ls = li.shard(lin, li.infer(lin, NoAttrs{}), NoAttrs{});
  EXPECT_TRUE(has(ls, {Prop::replicated(), Prop::sharded(0), Prop::sharded(0)},
                  {Prop::sharded(2)}));  // column
  EXPECT_TRUE(
      has(ls, {Prop::sharded(2), Prop::sharded(1), Prop::partial()}, {Prop::partial()}));  // row
  EXPECT_TRUE(has(ls, {Prop::sharded(0), Prop::replicated(), Prop::replicated()},
                  {Prop::sharded(0)}));  // data
}

}  // namespace
}  // namespace hap::ops
