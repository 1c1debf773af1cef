// BERT-style encoder over token ids, in the two forms HAP's paper and users train:
//  - objective "causal" (the paper's "BERT-Base" setting: causal mask, next-token loss; inputs
//    idx and targets as GPT's), and
//  - objective "mlm" (true bidirectional masked-language modelling: 15% of positions chosen,
//    of those 80% replaced by a [MASK] token, 10% by a random token, 10% kept, drawn from the
//    counter-based generator so that every shard draws its slice; the loss is the mean
//    cross-entropy over the chosen positions; input idx only).
// Layers: token and learned position embeddings, an embedding LayerNorm, n_layer pre-norm
// transformer blocks (bidirectional for mlm, causal otherwise), a final LayerNorm, and BERT's
// prediction head (dense -> gelu -> LayerNorm -> the token embedding transposed + a bias).
//
// Parameter names: wte.weight [V', C] (V' = vocab_size + 1 with the [MASK] token, whose id is
// vocab_size, under mlm; vocab_size otherwise), wpe.weight [seq_len, C], ln_emb.weight / .bias,
// blocks.{i}.* (GPT's block names; mlp.fc [hidden, C]), ln_f.*, head.dense.weight [C, C] /
// .bias, head.ln.*, head.bias [V']. Initialisation: weights N(0, 0.02), biases 0, LayerNorm 1.
// The paper's size: 12 layers, width 768, MLP 3072, 12 heads, sequence 128.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/layers.h"
#include "models/model.h"
#include "models/moe.h"
#include "models/zoo.h"

namespace hap::nn {

struct BERTConfig {
  int64_t vocab_size = 256;  // token ids in [0, vocab_size)
  int64_t seq_len = 128;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t hidden = 3072;
  double dropout = 0.0;
  std::string objective = "causal";  // "causal" or "mlm"
  double mask_prob = 0.15;           // mlm: share of positions chosen for prediction
  double layer_norm_eps = 1e-5;
  uint64_t seed = 1337;
  // BERT-MoE (models/moe.h): with num_experts > 0 every second block (1, 3, ...) has a top-k
  // mixture of experts for its MLP, and the loss adds aux_loss_coef x their load-balancing losses.
  int64_t num_experts = 0;
  int64_t top_k = 2;
  double capacity_factor = 2.5;
  double aux_loss_coef = 0.01;

  void validate() const;
  bool mlm() const { return objective == "mlm"; }
  // Rows of the token embedding and classes of the output: vocab_size (+1 for [MASK] under mlm).
  int64_t table_size() const { return vocab_size + (mlm() ? 1 : 0); }
};

class BERT : public Model {
 public:
  explicit BERT(const BERTConfig& config);

  // idx: i64 [B, seq_len] ids in [0, table_size()) -> logits [B, seq_len, table_size()].
  Tensor forward(const Tensor& idx);
  // mlm: the corrupted ids and the targets (the original id at chosen positions, -100
  // elsewhere) this step's loss uses: in training drawn for the model's random step, in
  // evaluation a fixed draw.
  std::pair<Tensor, Tensor> masked(const Tensor& idx) const;

  std::vector<InputSpec> inputs(int64_t batch_size) const override;
  Tensor loss(const Batch& batch) override;
  int64_t tokens_per_example() const override { return config_.seq_len; }
  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const BERTConfig& config() const { return config_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::shared_ptr<LayerNorm> ln_emb;
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> blocks;  // TransformerBlock (or MoEBlock) "0" .. "n_layer-1"
  std::shared_ptr<LayerNorm> ln_f;
  std::shared_ptr<Module> head;  // dense, ln and the output bias
  std::shared_ptr<Linear> head_dense;
  std::shared_ptr<LayerNorm> head_ln;
  Tensor head_bias;  // [table_size()]

 private:
  // loss + aux_loss_coef x the MoE blocks' load-balancing losses of the last forward.
  Tensor with_aux_loss(const Tensor& loss) const;

  BERTConfig config_;
  Tensor aux_total_;  // the MoE blocks' load-balancing losses of the last forward, summed
};

// The zoo entry "bert" (options vocab_size, seq_len, n_layer, n_head, n_embd, hidden, dropout,
// objective, mask_prob; default data "bytes").
ModelEntry bert_model_entry();
// The zoo entry "bert_moe": bert's options and num_experts, top_k, capacity_factor,
// aux_loss_coef.
ModelEntry bert_moe_model_entry();

}  // namespace hap::nn
