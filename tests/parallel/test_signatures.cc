// Every sharding signature every op declares, run on real shards over the ranks: each rank holds
// its part of every input as the signature says (its slice for Sharded, an addend for Partial,
// all of it for Replicated), runs the op on them as the executor does (the op's local hook when it
// has one), and the outputs put together over the ranks (gathered, summed, or as they are) equal
// the unsharded op's, as do the input gradients for a fixed cotangent. Shard lengths are uneven
// and come from synth::ShardLayout, like the executor's.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "parallel/autograd_collectives.h"
#include "parallel/collectives.h"
#include "parallel/shard.h"
#include "parallel_test_util.h"
#include "synth/graph.h"
#include "synth/shard_layout.h"

namespace hap::parallel {
namespace {

using ops::OpKind;
using ops::Prop;
using ops::PropKind;
using testing::world;

TensorOptions f64() { return TensorOptions{}.with_dtype(DType::F64); }
Tensor normal(const Shape& s, uint64_t seed) { return randn(s, seed, 0, f64()); }
Tensor positive(const Shape& s, uint64_t seed) { return exp(normal(s, seed) * 0.5); }
Tensor ids(const Shape& s, int64_t classes, uint64_t seed, bool with_ignored = false) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<int64_t>((i * 7 + seed * 3) % static_cast<uint64_t>(classes));
    if (with_ignored && i % 5 == 3) v[i] = -100;
  }
  return Tensor::from_vector(v, s);
}

struct Case {
  std::string label;
  OpKind kind;
  std::vector<Tensor> inputs;  // the logical tensors (undefined: an omitted optional input)
  ops::Attrs attrs;
};

// One or more calls of every op that declares sharding signatures.
std::vector<Case> cases() {
  const Shape s = {5, 6};
  std::vector<Case> c;
  for (OpKind k : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div}) {
    c.push_back({"same shapes", k, {normal(s, 1), positive(s, 2)}, {}});
    c.push_back({"broadcast", k, {normal({4, 5, 6}, 3), positive({6}, 4)}, {}});
  }
  for (OpKind k : {OpKind::Neg, OpKind::Exp, OpKind::Tanh, OpKind::Relu, OpKind::Sigmoid})
    c.push_back({"", k, {normal(s, 5)}, {}});
  for (OpKind k : {OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt})
    c.push_back({"", k, {positive(s, 6)}, {}});
  c.push_back({"", OpKind::Gelu, {normal(s, 7)}, ops::GeluAttrs{}});
  c.push_back({"", OpKind::AddScalar, {normal(s, 8)}, ops::ScalarAttrs{1.5}});
  c.push_back({"", OpKind::MulScalar, {normal(s, 9)}, ops::ScalarAttrs{-2.0}});
  c.push_back({"", OpKind::PowScalar, {positive(s, 10)}, ops::ScalarAttrs{1.7}});
  c.push_back({"", OpKind::GeluBackward, {normal(s, 11), normal(s, 12)}, ops::GeluAttrs{}});
  c.push_back({"", OpKind::ReluBackward, {normal(s, 13), normal(s, 14)}, {}});
  {
    std::vector<double> m(30);
    for (size_t i = 0; i < m.size(); ++i) m[i] = i % 3 == 0;
    Tensor mask = Tensor::from_vector(m, s, TensorOptions{}.with_dtype(DType::U8));
    c.push_back({"", OpKind::MaskedFill, {normal(s, 15), mask}, ops::ScalarAttrs{-4.0}});
  }
  c.push_back({"", OpKind::Cast, {normal(s, 16)}, ops::CastAttrs{DType::F32}});
  c.push_back({"", OpKind::TrainEvalSelect, {normal({4, 1, 6}, 71), normal({4, 1, 6}, 72)}, {}});
  c.push_back({"", OpKind::Dropout, {normal({4, 6, 5}, 17)}, ops::RandomAttrs{0.3, 99, 7, {}}});
  {
    // Routing groups of 5 tokens, 2 choices, 3 experts of capacity 3 (some choices dropped).
    const ops::MoeAttrs a{3, 3};
    Tensor x = normal({4, 5, 6}, 90), e = ids({4, 5, 2}, 3, 91), w = normal({4, 5, 2}, 92);
    Tensor b = normal({4, 3, 3, 6}, 93);
    c.push_back({"weighted", OpKind::MoeDispatch, {x, e, w}, a});
    c.push_back({"unweighted", OpKind::MoeDispatch, {x, e, Tensor()}, a});
    c.push_back({"gated", OpKind::MoeCombine, {b, e, w}, a});
    c.push_back({"", OpKind::MoeGateGrad, {x, b, e}, a});
  }
  for (const bool targets : {false, true})
    c.push_back({targets ? "targets" : "inputs",
                 OpKind::MaskTokens,
                 {ids({4, 9}, 11, 8)},
                 ops::MaskTokensAttrs{0.4, 11, 11, -100, targets, 99, 7, {}}});
  c.push_back({"3-D by 2-D", OpKind::MatMul, {normal({3, 4, 5}, 18), normal({5, 6}, 19)}, {}});
  c.push_back({"batched", OpKind::MatMul, {normal({2, 3, 4}, 20), normal({2, 4, 5}, 21)}, {}});
  c.push_back({"with bias",
               OpKind::Linear,
               {normal({4, 3, 5}, 22), normal({6, 5}, 23), normal({6}, 24)},
               {}});
  c.push_back(
      {"without bias", OpKind::Linear, {normal({7, 5}, 25), normal({6, 5}, 26), Tensor()}, {}});
  c.push_back({"", OpKind::Softmax, {normal({4, 5, 6}, 27)}, ops::DimAttrs{-1, false}});
  c.push_back({"", OpKind::LogSoftmax, {normal({4, 5, 6}, 28)}, ops::DimAttrs{1, false}});
  {
    Tensor x = normal({4, 6}, 29), g = normal({4, 6}, 30);
    c.push_back({"",
                 OpKind::SoftmaxBackward,
                 {g, call1(OpKind::Softmax, {x}, ops::DimAttrs{-1, false})},
                 ops::DimAttrs{-1, false}});
    c.push_back({"",
                 OpKind::LogSoftmaxBackward,
                 {g, call1(OpKind::LogSoftmax, {x}, ops::DimAttrs{-1, false})},
                 ops::DimAttrs{-1, false}});
  }
  c.push_back({"",
               OpKind::LayerNorm,
               {normal({4, 5, 6}, 31), normal({6}, 32), normal({6}, 33)},
               ops::NormAttrs{}});
  c.push_back({"", OpKind::RmsNorm, {normal({4, 5, 6}, 34), normal({6}, 35)}, ops::NormAttrs{}});
  c.push_back({"",
               OpKind::LayerNormBackward,
               {normal({4, 5, 6}, 65), normal({4, 5, 6}, 66), normal({6}, 67)},
               ops::NormAttrs{}});
  c.push_back({"",
               OpKind::RmsNormBackward,
               {normal({4, 5, 6}, 68), normal({4, 5, 6}, 69), normal({6}, 70)},
               ops::NormAttrs{}});
  c.push_back({"", OpKind::Embedding, {normal({9, 4}, 36), ids({3, 5}, 9, 1)}, {}});
  c.push_back({"",
               OpKind::EmbeddingBackward,
               {normal({3, 5, 4}, 64), ids({3, 5}, 9, 6)},
               ops::ScatterAttrs{0, 0, {9, 4}}});
  c.push_back({"",
               OpKind::CrossEntropy,
               {normal({8, 9}, 37), ids({8}, 9, 2, true)},
               ops::CrossEntropyAttrs{}});
  c.push_back({"",
               OpKind::CrossEntropyBackward,
               {Tensor::scalar(0.7, f64()), normal({8, 9}, 38), ids({8}, 9, 3, true)},
               ops::CrossEntropyAttrs{}});
  for (ops::Reduction r : {ops::Reduction::Sum, ops::Reduction::None})
    for (double smoothing : {0.0, 0.2}) {
      const ops::CrossEntropyAttrs a{-100, smoothing, r};
      const std::string label = std::string(r == ops::Reduction::Sum ? "sum" : "none") +
                                (smoothing > 0 ? ", label smoothing" : "");
      c.push_back({label, OpKind::CrossEntropy, {normal({8, 9}, 80), ids({8}, 9, 5, true)}, a});
      Tensor g = r == ops::Reduction::Sum ? Tensor::scalar(0.7, f64()) : normal({8}, 81);
      c.push_back(
          {label, OpKind::CrossEntropyBackward, {g, normal({8, 9}, 82), ids({8}, 9, 6, true)}, a});
    }
  c.push_back({"mean, label smoothing",
               OpKind::CrossEntropy,
               {normal({8, 9}, 83), ids({8}, 9, 7, true)},
               ops::CrossEntropyAttrs{-100, 0.1, ops::Reduction::Mean}});
  c.push_back({"",
               OpKind::TargetLogit,
               {normal({8, 9}, 39), ids({8}, 12, 4, true)},
               ops::TargetAttrs{2, -100}});
  c.push_back({"",
               OpKind::TargetLogitBackward,
               {normal({8}, 40), normal({8, 9}, 41), ids({8}, 12, 5, true)},
               ops::TargetAttrs{2, -100}});
  c.push_back({"all dims", OpKind::Sum, {normal({4, 5, 6}, 42)}, ops::ReduceAttrs{}});
  c.push_back({"one dim", OpKind::Mean, {normal({4, 5, 6}, 43)}, ops::ReduceAttrs{{1}, false}});
  c.push_back({"two dims", OpKind::Mean, {normal({4, 5, 6}, 44)}, ops::ReduceAttrs{{0, 2}, true}});
  c.push_back({"", OpKind::LogSumExp, {normal({4, 5, 6}, 45)}, {}});
  c.push_back({"", OpKind::Max, {normal({4, 5, 6}, 46)}, ops::DimAttrs{1, false}});
  c.push_back({"", OpKind::TopK, {normal({4, 5, 6}, 47)}, ops::TopKAttrs{2, -1, true}});
  {
    Tensor x = normal({4, 5, 6}, 48);
    Tensor idx = call(OpKind::TopK, {x}, ops::TopKAttrs{2, 1, true})[1];
    c.push_back({"",
                 OpKind::IndexBackward,
                 {normal({4, 2, 6}, 49), idx},
                 ops::ScatterAttrs{1, 0, {4, 5, 6}}});
  }
  c.push_back({"", OpKind::Argmax, {normal({4, 5, 6}, 47)}, ops::DimAttrs{2, true}});
  c.push_back({"merge", OpKind::Reshape, {normal({4, 3, 6}, 48)}, ops::ShapeAttrs{{12, 6}}});
  c.push_back(
      {"split heads", OpKind::Reshape, {normal({4, 5, 6}, 49)}, ops::ShapeAttrs{{4, 5, 2, 3}}});
  c.push_back({"", OpKind::Permute, {normal({4, 5, 6}, 50)}, ops::PermuteAttrs{{2, 0, 1}}});
  c.push_back({"", OpKind::Slice, {normal({4, 7, 6}, 51)}, ops::SliceAttrs{1, 2, 6}});
  c.push_back({"", OpKind::Expand, {normal({4, 1, 6}, 52)}, ops::ShapeAttrs{{4, 5, 6}}});
  c.push_back({"", OpKind::Contiguous, {permute(normal({6, 4}, 53), {1, 0})}, {}});
  c.push_back({"",
               OpKind::Concat,
               {normal({4, 2, 6}, 54), normal({4, 3, 6}, 55)},
               ops::DimAttrs{1, false}});
  c.push_back({"", OpKind::Split, {normal({4, 5, 6}, 56)}, ops::SplitAttrs{2, {2, 4}}});
  // Key mask [B, T]: batch 0 pads its last two keys, batch 1 its first (a causal query 0 there
  // has no key left).
  const Tensor keys = Tensor::from_vector(std::vector<double>{1, 1, 1, 0, 0, 0, 1, 1, 1, 1}, {2, 5},
                                          TensorOptions{}.with_dtype(DType::U8));
  for (double p : {0.0, 0.25}) {
    ops::AttentionAttrs a;
    a.causal = p == 0;
    a.dropout = {p, 77, 3, {}};
    c.push_back(
        {p > 0 ? "dropout" : "causal",
         OpKind::Attention,
         {normal({2, 3, 5, 4}, 57), normal({2, 3, 5, 4}, 58), normal({2, 3, 5, 4}, 59), Tensor()},
         a});
    c.push_back(
        {p > 0 ? "dropout, key mask" : "causal, key mask",
         OpKind::Attention,
         {normal({2, 3, 5, 4}, 57), normal({2, 3, 5, 4}, 58), normal({2, 3, 5, 4}, 59), keys},
         a});
  }
  for (bool masked : {false, true}) {
    ops::AttentionAttrs a;
    a.causal = !masked;
    Tensor q = normal({2, 3, 5, 4}, 60), k = normal({2, 3, 5, 4}, 61), v = normal({2, 3, 5, 4}, 62);
    const Tensor mask = masked ? keys : Tensor();
    std::vector<Tensor> out = call(OpKind::Attention, {q, k, v, mask}, a);
    c.push_back({masked ? "key mask" : "",
                 OpKind::AttentionBackward,
                 {q, k, v, out[0], out[1], normal({2, 3, 5, 4}, 63), Tensor(), mask},
                 a});
  }
  {
    ops::Conv2dAttrs a;
    a.stride = {2, 1};
    a.padding = {1, 1};
    a.dilation = {1, 2};
    Tensor x = normal({5, 4, 7, 6}, 71), w = normal({6, 4, 3, 2}, 72), b = normal({6}, 73);
    c.push_back({"strided, padded, dilated", OpKind::Conv2d, {x, w, b}, a});
    c.push_back({"without bias", OpKind::Conv2d, {x, w, Tensor()}, a});
    ops::Conv2dAttrs grouped;
    grouped.groups = 2;
    grouped.padding = {1, 0};
    c.push_back(
        {"grouped", OpKind::Conv2d, {x, normal({4, 2, 3, 3}, 74), normal({4}, 75)}, grouped});
    const Shape y = call1(OpKind::Conv2d, {x, w, b}, a).shape();
    c.push_back({"", OpKind::Conv2dBackward, {normal(y, 76), x, w}, a});
  }
  {
    ops::Pool2dAttrs a;  // overlapping, padded windows
    a.kernel = {3, 2};
    a.stride = {2, 1};
    a.padding = {1, 1};
    Tensor x = normal({5, 4, 7, 6}, 77);
    const Shape y = call1(OpKind::MaxPool2d, {x}, a).shape();
    c.push_back({"", OpKind::MaxPool2d, {x}, a});
    c.push_back({"", OpKind::AvgPool2d, {x}, a});
    c.push_back({"", OpKind::MaxPool2dBackward, {normal(y, 78), x}, a});
    c.push_back({"", OpKind::AvgPool2dBackward, {normal(y, 79), x}, a});
  }
  return c;
}

// What the executor's NodeContext gives a local hook, for one node traced from a case.
class Context : public ops::ShardContext {
 public:
  Context(const synth::Graph& g, const ops::ShardSignature& sig, const synth::ShardLayout& layout)
      : g_(g), sig_(sig), layout_(layout) {}
  int rank() const override { return world().rank(); }
  int world_size() const override { return world().size(); }
  const Shape& input_shape(size_t i) const override {
    return g_.tensors[g_.nodes[0].inputs[i]].shape;
  }
  const Shape& output_shape(size_t o) const override {
    return g_.tensors[g_.nodes[0].outputs[o]].shape;
  }
  Prop input_prop(size_t i) const override { return sig_.inputs[i]; }
  Prop output_prop(size_t o) const override { return sig_.outputs[o]; }
  std::vector<int64_t> input_lengths(size_t i) const override {
    return layout_.lengths(g_.nodes[0].inputs[i], sig_.inputs[i].dim, 0);
  }
  std::vector<int64_t> output_lengths(size_t o) const override {
    return layout_.lengths(g_.nodes[0].outputs[o], sig_.outputs[o].dim, 0);
  }
  uint64_t random_offset() const override { return 0; }
  std::optional<uint64_t> random_seed() const override { return std::nullopt; }
  bool training() const override { return true; }
  Tensor all_gather(const Tensor& shard, int64_t dim,
                    const std::vector<int64_t>& lengths) override {
    return functional::all_gather(world(), shard, dim, lengths, CollectiveMethod::Grouped);
  }
  int64_t sum_over_ranks(int64_t value) override { return world().allreduce(value); }

 private:
  const synth::Graph& g_;
  const ops::ShardSignature& sig_;
  const synth::ShardLayout& layout_;
};

// Rank r's addend of a Partial tensor: shares 0.5, 0.3, 0.2, ... of the whole (the last takes the
// rest), so the addends sum to it.
Tensor addend(const Tensor& full, int r, int n) {
  if (n == 1) return full;
  const std::vector<double> w = testing::ratios_for(n, testing::Split::Uneven);
  return full * w[static_cast<size_t>(r)];
}

// This rank's part of `full` under property p (lengths: every rank's along p.dim).
Tensor part(const Tensor& full, const Prop& p, const std::vector<int64_t>& lengths) {
  switch (p.kind) {
    case PropKind::Replicated:
      return full;
    case PropKind::Sharded:
      return ShardSpec(p.dim, lengths).slice_of(full, world().rank()).clone();
    case PropKind::Partial:
      return addend(full, world().rank(), world().size());
  }
  return Tensor();
}

// The whole tensor from every rank's part under property p: gathered, summed, or as it is.
Tensor whole(const Tensor& local, const Prop& p) {
  switch (p.kind) {
    case PropKind::Replicated:
      return local;
    case PropKind::Sharded: {
      std::vector<int64_t> lengths;
      for (int64_t len : world().allgather(local.size(p.dim))) lengths.push_back(len);
      return all_gather(world(), local.contiguous(), p.dim, lengths, CollectiveMethod::Grouped);
    }
    case PropKind::Partial:
      return all_reduce(world(), local.contiguous());
  }
  return Tensor();
}

// f64 results agree to rounding; f32 ones (a cast) to f32 rounding of reassociated sums.
::testing::AssertionResult close(const Tensor& got, const Tensor& want) {
  const double tol = want.dtype() == DType::F64 ? 1e-10 : 1e-5;
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(got.shape()) << ", expected " << shape_str(want.shape());
  return testing::close_values(got.to(DType::F64), want.to(DType::F64), tol);
}

std::vector<Tensor> run_local(const Case& c, ops::ShardContext& ctx,
                              const std::vector<Tensor>& inputs) {
  const ops::OpDef& def = ops::op_def(c.kind);
  return def.local ? def.local(ctx, inputs, c.attrs) : ops::call(c.kind, inputs, c.attrs);
}

void check_case(const Case& c) {
  const ops::OpDef& def = ops::op_def(c.kind);
  SCOPED_TRACE(std::string(def.name) + (c.label.empty() ? "" : " (" + c.label + ")"));
  // The one-node graph of the call, for the signatures at its shapes and the shard lengths.
  synth::Graph g;
  synth::GraphNode node;
  node.id = 0;
  node.kind = c.kind;
  node.attrs = c.attrs;
  ops::Metas in_meta;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (!c.inputs[i].defined()) {
      node.inputs.push_back(-1);
      in_meta.push_back({{}, DType::F32, false});
      continue;
    }
    synth::GraphTensor t;
    t.id = static_cast<int>(g.tensors.size());
    t.name = "in" + std::to_string(i);
    t.shape = c.inputs[i].shape();
    t.dtype = c.inputs[i].dtype();
    t.role = synth::TensorRole::Input;
    t.consumers = {0};
    node.inputs.push_back(t.id);
    in_meta.push_back({t.shape, t.dtype, true});
    g.tensors.push_back(t);
  }
  for (const ops::TensorMeta& m : def.infer(in_meta, c.attrs)) {
    synth::GraphTensor t;
    t.id = static_cast<int>(g.tensors.size());
    t.shape = m.shape;
    t.dtype = m.dtype;
    t.producer = 0;
    node.outputs.push_back(t.id);
    g.tensors.push_back(t);
  }
  g.nodes.push_back(node);
  ASSERT_EQ(g.nodes.size(), 1u);
  const std::vector<ops::ShardSignature> sigs = synth::signatures_of(g, g.nodes[0]);
  ASSERT_FALSE(sigs.empty());

  // The unsharded op, and the input gradients of sum(out * cotangent) over the float outputs.
  const bool differentiable = def.backward != nullptr;
  std::vector<Tensor> full_in;
  for (const Tensor& t : c.inputs) {
    Tensor x = t.defined() ? t.clone() : Tensor();
    if (x.defined() && differentiable && is_floating(x.dtype())) x.set_requires_grad(true);
    full_in.push_back(x);
  }
  const std::vector<Tensor> want = ops::call(c.kind, full_in, c.attrs);
  std::vector<Tensor> cot;
  Tensor loss;
  for (size_t o = 0; o < want.size(); ++o) {
    cot.push_back(is_floating(want[o].dtype())
                      ? normal(want[o].shape(), 100 + o).to(want[o].dtype())
                      : Tensor());
    if (differentiable && want[o].requires_grad()) {
      Tensor term = sum(want[o] * cot[o]);
      loss = loss.defined() ? loss + term : term;
    }
  }
  if (loss.defined()) loss.backward();

  for (size_t si = 0; si < sigs.size(); ++si) {
    const ops::ShardSignature& sig = sigs[si];
    std::string text;
    for (const Prop& p : sig.inputs) text += p.str() + " ";
    text += "->";
    for (const Prop& p : sig.outputs) text += " " + p.str();
    SCOPED_TRACE("signature " + text);
    synth::Instruction in;
    in.kind = synth::InstrKind::Compute;
    in.node = 0;
    in.signature = static_cast<int>(si);
    const synth::ShardLayout layout(g, {in},
                                    {testing::ratios_for(world().size(), testing::Split::Uneven)});
    Context ctx(g, sig, layout);
    std::vector<Tensor> local_in;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      if (!c.inputs[i].defined()) {
        local_in.emplace_back();
        continue;
      }
      const Prop p = sig.inputs[i];
      Tensor x = part(c.inputs[i], p,
                      p.kind == PropKind::Sharded ? ctx.input_lengths(i) : std::vector<int64_t>{});
      if (full_in[i].requires_grad()) x = x.detach().set_requires_grad(true);
      local_in.push_back(x);
    }
    const std::vector<Tensor> got = run_local(c, ctx, local_in);
    ASSERT_EQ(got.size(), want.size());
    Tensor local_loss;
    for (size_t o = 0; o < got.size(); ++o) {
      EXPECT_TRUE(close(whole(got[o].detach(), sig.outputs[o]), want[o].detach()))
          << "output " << o;
      if (!(differentiable && want[o].requires_grad() && got[o].requires_grad())) continue;
      // This rank's share of sum(out * cotangent): the Partial sum over ranks is the whole.
      const Prop p = sig.outputs[o];
      Tensor c_local =
          p.kind == PropKind::Sharded
              ? ShardSpec(p.dim, ctx.output_lengths(o)).slice_of(cot[o], world().rank()).clone()
              : cot[o];
      Tensor term = sum(got[o] * c_local);
      if (p.kind == PropKind::Replicated) term = functional::to_partial(world(), term);
      local_loss = local_loss.defined() ? local_loss + term : term;
    }
    if (!local_loss.defined()) continue;
    local_loss.backward();
    for (size_t i = 0; i < local_in.size(); ++i) {
      if (!local_in[i].defined() || !full_in[i].requires_grad()) continue;
      const Tensor expected = full_in[i].grad();
      Tensor g_local = local_in[i].grad();
      if (!g_local.defined())
        g_local = Tensor::zeros(local_in[i].shape(), f64().with_dtype(local_in[i].dtype()));
      // The gradient's property is the dual of the input's: Replicated -> Partial, Sharded(d) ->
      // Sharded(d), Partial -> Replicated.
      const Prop p = sig.inputs[i];
      const Prop dual = p.kind == PropKind::Replicated ? Prop::partial()
                        : p.kind == PropKind::Partial  ? Prop::replicated()
                                                       : p;
      ASSERT_TRUE(expected.defined()) << "input " << i;
      EXPECT_TRUE(close(whole(g_local, dual), expected)) << "gradient of input " << i;
    }
  }
}

TEST(Signatures, EveryOpThatDeclaresSignaturesHasACaseHere) {
  std::set<OpKind> covered;
  for (const Case& c : cases()) covered.insert(c.kind);
  for (size_t k = 0; k < ops::kNumOps; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    if (ops::op_def(kind).shard) {
      EXPECT_TRUE(covered.count(kind)) << ops::op_name(kind) << " has no case";
    }
  }
}

TEST(Signatures, EverySignatureOnRealShardsEqualsTheUnshardedOpWithGradients) {
  for (const Case& c : cases()) check_case(c);
}

}  // namespace
}  // namespace hap::parallel
