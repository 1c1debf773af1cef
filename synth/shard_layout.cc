#include "synth/shard_layout.h"

#include <numeric>
#include <tuple>

#include "core/split.h"

namespace hap::synth {

ShardLayout::ShardLayout(const Graph& graph, const std::vector<Instruction>& instructions,
                         std::vector<std::vector<double>> ratios)
    : graph_(graph), ratios_(std::move(ratios)) {
  granule_.resize(graph_.tensors.size());
  for (const GraphTensor& t : graph_.tensors) granule_[t.id].assign(t.shape.size(), 1);
  struct Dim {
    int tensor;
    int64_t dim;
  };
  std::vector<std::vector<Dim>> groups;               // operands that must split alike
  std::vector<std::tuple<Dim, Dim, int64_t>> merges;  // out = in x factor (reshape)
  for (const Instruction& in : instructions) {
    if (in.kind != InstrKind::Compute || in.signature < 0) continue;
    const GraphNode& n = graph_.nodes[in.node];
    const ops::ShardSignature sig = signatures_of(graph_, n)[static_cast<size_t>(in.signature)];
    std::vector<Dim> group;
    for (size_t k = 0; k < n.inputs.size(); ++k)
      if (n.inputs[k] >= 0 && sig.inputs[k].kind == ops::PropKind::Sharded)
        group.push_back({n.inputs[k], sig.inputs[k].dim});
    std::vector<Dim> outs;
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (sig.outputs[o].kind == ops::PropKind::Sharded)
        outs.push_back({n.outputs[o], sig.outputs[o].dim});
    // A sharded dim that a reshape merges with inner dims ([B, T] -> [B * T], or back): the
    // merged one's shards come in whole multiples of the inner size.
    if (group.size() == 1 && outs.size() == 1) {
      const int64_t a = graph_.tensors[group[0].tensor].shape[group[0].dim];
      const int64_t b = graph_.tensors[outs[0].tensor].shape[outs[0].dim];
      if (a != b) {
        if (a > 0 && b % a == 0) merges.push_back({group[0], outs[0], b / a});
        if (b > 0 && a % b == 0) merges.push_back({outs[0], group[0], a / b});
        continue;
      }
    }
    group.insert(group.end(), outs.begin(), outs.end());
    if (group.size() > 1) groups.push_back(group);
  }
  auto& g = granule_;
  for (bool changed = true; changed;) {
    changed = false;
    auto raise = [&](const Dim& d, int64_t v) {
      int64_t n = graph_.tensors[d.tensor].shape[d.dim];
      int64_t cur = g[d.tensor][d.dim];
      int64_t want = std::lcm(cur, v);
      if (want != cur && n % want == 0) {
        g[d.tensor][d.dim] = want;
        changed = true;
      }
    };
    for (const auto& group : groups) {
      int64_t l = 1;
      for (const Dim& d : group) l = std::lcm(l, g[d.tensor][d.dim]);
      for (const Dim& d : group) raise(d, l);
    }
    for (const auto& [in, out, factor] : merges) {
      raise(out, g[in.tensor][in.dim] * factor);
      if (g[out.tensor][out.dim] % factor == 0) raise(in, g[out.tensor][out.dim] / factor);
    }
  }
}

int64_t ShardLayout::granule(int tensor, int64_t dim) const {
  return granule_[static_cast<size_t>(tensor)][static_cast<size_t>(dim)];
}

std::vector<int64_t> ShardLayout::lengths(int tensor, int64_t dim, int segment) const {
  return lengths(tensor, dim, ratios_[static_cast<size_t>(segment)]);
}

std::vector<double> ShardLayout::shares(int tensor, int64_t dim, int segment) const {
  return shares(tensor, dim, ratios_[static_cast<size_t>(segment)]);
}

std::vector<int64_t> ShardLayout::lengths(int tensor, int64_t dim,
                                          const std::vector<double>& ratios) const {
  const int64_t n = graph_.tensors[static_cast<size_t>(tensor)].shape[static_cast<size_t>(dim)];
  int64_t g = granule(tensor, dim);
  if (g <= 0 || n % g != 0) g = 1;
  std::vector<int64_t> l = shard_lengths(n / g, ratios);
  for (int64_t& x : l) x *= g;
  return l;
}

std::vector<double> ShardLayout::shares(int tensor, int64_t dim,
                                        const std::vector<double>& ratios) const {
  const std::vector<int64_t> l = lengths(tensor, dim, ratios);
  const double n = static_cast<double>(
      graph_.tensors[static_cast<size_t>(tensor)].shape[static_cast<size_t>(dim)]);
  std::vector<double> out;
  for (int64_t x : l) out.push_back(n > 0 ? static_cast<double>(x) / n : 0.0);
  return out;
}

}  // namespace hap::synth
