#include "fuzz/plan_model.h"

#include "ops/dispatch.h"
#include "ops/functional.h"

namespace hap::fuzz {

const synth::Graph& plan_graph() {
  static const synth::Graph graph = [] {
    // x: [B, C] = [8, 12]; blocks.0: [B, C] -> [B, H]; blocks.1: [B, H] -> [B, C], plus x.
    const Tensor x = Tensor::meta({8, 12}, DType::F32), w1 = Tensor::meta({16, 12}, DType::F32),
                 b1 = Tensor::meta({16}, DType::F32), w2 = Tensor::meta({12, 16}, DType::F32);
    return synth::trace(
        [&] {
          Tensor h;
          {
            ops::ScopeGuard block("blocks.0", ops::ScopeGuard::kAbsolute);
            h = gelu(linear(x, w1, b1));
          }
          Tensor y;
          {
            ops::ScopeGuard block("blocks.1", ops::ScopeGuard::kAbsolute);
            y = linear(h, w2) + x;
          }
          return mean(softmax(y, -1));
        },
        {{"w1", w1}, {"b1", b1}, {"w2", w2}}, {{"x", x}});
  }();
  return graph;
}

const synth::Cluster& plan_cluster() {
  static const synth::Cluster cluster = [] {
    synth::Cluster c;
    c.name = "fuzz-two-nodes";
    c.add_node("n0", {1e9, 1e-5},
               {{"a", "cpu", 4e9, std::int64_t{1} << 30, -1},
                {"b", "cpu", 2e9, std::int64_t{1} << 30, -1}});
    c.add_node("n1", {1e9, 1e-5}, {{"c", "cpu", 1e9, std::int64_t{1} << 30, -1}});
    c.inter_node = {1e8, 1e-4};
    c.validate();
    return c;
  }();
  return cluster;
}

const synth::CostModel& plan_cost_model() {
  static const synth::CostModel cost_model(plan_graph(), plan_cluster());
  return cost_model;
}

}  // namespace hap::fuzz
