#include "models/moe.h"

#include <cmath>

#include "ops/dispatch.h"
#include "ops/functional.h"

namespace hap::nn {

MoE::MoE(const MoEOptions& o) : Module("MoE"), options_(o) {
  HAP_CHECK(o.dim() >= 1 && o.hidden() >= 1 && o.experts() >= 1,
            "MoE: dim, hidden and experts must be >= 1, got ", o.dim(), ", ", o.hidden(), " and ",
            o.experts());
  HAP_CHECK(o.top_k() >= 1 && o.top_k() <= o.experts(),
            "MoE: top_k must be in [1, experts = ", o.experts(), "], got ", o.top_k());
  HAP_CHECK(o.capacity_factor() > 0, "MoE: capacity_factor must be > 0, got ", o.capacity_factor());
  const int64_t E = o.experts(), C = o.dim(), H = o.hidden();
  gate = register_module("gate", std::make_shared<Linear>(LinearOptions(C, E).bias(false)));
  w1 = register_parameter("w1", Tensor::zeros({E, C, H}));
  b1 = register_parameter("b1", Tensor::zeros({E, H}));
  w2 = register_parameter("w2", Tensor::zeros({E, H, C}));
  b2 = register_parameter("b2", Tensor::zeros({E, C}));
  drop = register_module("drop", std::make_shared<Dropout>(o.dropout()));
}

std::optional<ParamInit> MoE::init_rule(const std::string& name, const Tensor&) const {
  if (name == "w1" || name == "w2") return ParamInit::normal(0.0, kGpt2InitStd);
  if (name == "b1" || name == "b2") return ParamInit::zeros();
  return std::nullopt;
}

int64_t MoE::capacity(int64_t tokens) const {
  const double slots = std::ceil(static_cast<double>(tokens) * options_.capacity_factor() /
                                 static_cast<double>(options_.experts()));
  return std::max<int64_t>(1, static_cast<int64_t>(slots));
}

Tensor MoE::forward(const Tensor& x) {
  auto scope = enter_scope();
  HAP_CHECK(x.defined() && x.dim() == 3 && x.size(2) == options_.dim(), "MoE: x must be [B, T, ",
            options_.dim(), "], got ", x.defined() ? x.str() : "undefined");
  const int64_t B = x.size(0), T = x.size(1), E = options_.experts(), H = options_.hidden();
  const int64_t C = options_.dim(), cap = capacity(T);
  Tensor probs = softmax(gate->forward(x), -1);             // [B, T, E]
  auto [top, experts] = topk(probs, options_.top_k(), -1);  // [B, T, k]
  Tensor gates = top / sum(top, {-1}, /*keepdim=*/true);    // renormalised over the kept k
  // Load balance: the share of first choices per expert (ones scattered at each token's first
  // choice: a one-hot [B, T, E] without gradient) against the mean gate probability.
  Tensor ones = slice(top, 2, 0, 1) * 0.0 + 1.0;  // [B, T, 1]
  Tensor one_hot = ops::call1(ops::OpKind::IndexBackward, {ones, slice(experts, 2, 0, 1)},
                              ops::ScatterAttrs{2, 0, {B, T, E}});
  Tensor share = mean(one_hot, {0, 1});  // [E]
  aux_loss_ = sum(mean(probs, {0, 1}) * share) * static_cast<double>(E);
  // (Computed before the experts run, so that the gate probabilities are no longer live: fewer
  // live tensors keep the program search small.)
  Tensor buf = moe_dispatch(x, experts, Tensor(), E, cap);    // [B, E, cap, C]
  Tensor h = gelu(matmul(buf, w1) + reshape(b1, {E, 1, H}));  // [B, E, cap, H]
  Tensor out = matmul(h, w2) + reshape(b2, {E, 1, C});        // [B, E, cap, C]
  Tensor y = moe_combine(out, experts, gates, E, cap);        // [B, T, C]
  return drop->forward(y);
}

MoEBlock::MoEBlock(const TransformerBlockOptions& b, const MoEOptions& m) : Module("MoEBlock") {
  const int64_t C = b.dim();
  auto ln = [&] {
    return std::make_shared<LayerNorm>(LayerNormOptions(C).eps(b.layer_norm_eps()).bias(b.bias()));
  };
  ln1 = register_module("ln1", ln());
  attn = register_module("attn", std::make_shared<SelfAttention>(SelfAttentionOptions(C, b.n_head())
                                                                     .bias(b.bias())
                                                                     .dropout(b.dropout())
                                                                     .causal(b.causal())));
  ln2 = register_module("ln2", ln());
  moe = register_module("moe", std::make_shared<MoE>(m));
}

Tensor MoEBlock::forward(const Tensor& x, const Tensor& key_mask) {
  auto scope = enter_scope();
  Tensor h = x + attn->forward(ln1->forward(x), key_mask);
  return h + moe->forward(ln2->forward(h));
}

}  // namespace hap::nn
