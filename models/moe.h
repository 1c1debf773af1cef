// A top-k mixture of experts in place of a transformer block's MLP (GShard / DeepSpeed-MoE):
// a linear gate scores E experts per token, softmax, the top k (2 by default) are kept with their
// probabilities renormalised to sum to 1; each routing group (a sequence: dim 0 of [B, T, C]) sends
// its tokens to the experts' buffers of capacity = ceil(T x capacity_factor / E) slots (GShard's
// order; a choice past the capacity is dropped and a token with no kept choice passes through the
// block's residual alone); every expert is an MLP (C -> hidden -> C, gelu) applied to its buffer
// by one batched product over the experts; the outputs are combined with the gates. Since the
// routing depends only on the group, it does not depend on how the batch is split; the expert
// weights [E, ...] may be split by expert (expert parallelism) with all-to-all between the
// group-split buffers and the expert-split ones.
//
// The load-balancing loss (GShard): E x sum_e (mean gate probability of e) x (share of tokens
// whose first choice is e), over all tokens of the batch; aux_loss() holds the last forward's.
//
// Parameters: gate.weight [E, C], w1 [E, C, hidden], b1 [E, hidden], w2 [E, hidden, C], b2 [E, C].
// Initialisation: weights N(0, 0.02), biases 0.
#pragma once
#include <cstdint>
#include <memory>

#include "models/layers.h"

namespace hap::nn {

struct MoEOptions {
  MoEOptions(int64_t dim, int64_t hidden, int64_t experts)
      : dim_(dim), hidden_(hidden), experts_(experts) {}
  HAP_ARG(int64_t, dim);
  HAP_ARG(int64_t, hidden);
  HAP_ARG(int64_t, experts);
  HAP_ARG(int64_t, top_k) = 2;
  HAP_ARG(double, capacity_factor) = 2.5;
  HAP_ARG(double, dropout) = 0.0;  // on the combined output
};

class MoE : public Module {
 public:
  explicit MoE(const MoEOptions& options);
  // x [B, T, C] -> [B, T, C]; sets aux_loss().
  Tensor forward(const Tensor& x);
  // Expert slots per routing group of T tokens.
  int64_t capacity(int64_t tokens) const;
  const Tensor& aux_loss() const { return aux_loss_; }
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const MoEOptions& options() const { return options_; }

  std::shared_ptr<Linear> gate;  // C -> E, no bias
  Tensor w1, b1, w2, b2;
  std::shared_ptr<Dropout> drop;

 private:
  MoEOptions options_;
  Tensor aux_loss_;
};

// A pre-norm transformer block whose MLP is a MoE: x + attn(ln1(x)), then x + moe(ln2(x)).
class MoEBlock : public Module {
 public:
  MoEBlock(const TransformerBlockOptions& block, const MoEOptions& moe);
  Tensor forward(const Tensor& x, const Tensor& key_mask = Tensor());

  std::shared_ptr<LayerNorm> ln1;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<LayerNorm> ln2;
  std::shared_ptr<MoE> moe;
};

}  // namespace hap::nn
