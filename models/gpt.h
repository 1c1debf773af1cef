// GPT-2: token and position embeddings, n_layer pre-norm transformer blocks, a final LayerNorm and
// an output head tied to the token embedding (logits = x wte^T, no separate parameter).
//
// Parameter names (what checkpoints and the PyTorch oracle use), in this order:
//   wte.weight [V, C], wpe.weight [block_size, C], then for each block i:
//   blocks.{i}.ln1.weight/bias [C], blocks.{i}.attn.qkv.weight [3, C, C] / .bias [3, C] (q, k,
//   v stacked: GPT-2's c_attn [3C, C] / [3C] reshaped; checkpoints in that older shape load),
//   blocks.{i}.attn.proj.weight [C, C] / .bias [C], blocks.{i}.ln2.weight/bias [C],
//   blocks.{i}.mlp.fc.weight [4C, C] / .bias [4C], blocks.{i}.mlp.proj.weight [C, 4C] / .bias [C],
//   and ln_f.weight/bias [C]. Without `bias`, every .bias is absent.
// Initialisation (GPT-2): weights N(0, 0.02), the residual projections attn.proj.weight and
// mlp.proj.weight N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weights 1.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "models/layers.h"
#include "models/model.h"
#include "models/zoo.h"

namespace hap::nn {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t block_size = 128;  // maximum sequence length
  int64_t seq_len = 0;       // tokens per training sequence (inputs()); 0 means block_size
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 256;
  double dropout = 0.0;  // embedding, attention, residual and MLP dropout
  bool bias = true;      // biases in Linear and LayerNorm
  double layer_norm_eps = 1e-5;
  uint64_t seed = 1337;  // initialisation and dropout

  // Throws naming the first bad field.
  void validate() const;
  // The number of parameters the model will have (closed form).
  int64_t num_parameters() const;
};

// Trained as a Model: inputs "idx" and "targets", i64 [B, seq_len] (batch dim 0); the loss is
// the mean next-token cross-entropy.
class GPT : public Model {
 public:
  // Builds the model, draws its parameters with config.seed and binds its dropout to that seed.
  explicit GPT(const GPTConfig& config);

  // idx: i64 [B, T] token ids in [0, vocab_size), T <= block_size -> logits [B, T, V].
  // In training mode, each call is one step of the model's dropout counter.
  Tensor forward(const Tensor& idx);
  // Mean cross-entropy of forward(idx) against targets (i64 [B, T]); a target of -100 is ignored.
  Tensor loss(const Tensor& idx, const Tensor& targets);

  std::vector<InputSpec> inputs(int64_t batch_size) const override;
  Tensor loss(const Batch& batch) override;
  int64_t tokens_per_example() const override {
    return config_.seq_len > 0 ? config_.seq_len : config_.block_size;
  }

  std::optional<ParamInit> init_rule(const std::string& name, const Tensor& p) const override;
  const GPTConfig& config() const { return config_; }

  std::shared_ptr<Embedding> wte;  // [V, C]; also the output head
  std::shared_ptr<Embedding> wpe;  // [block_size, C]
  std::shared_ptr<Dropout> drop;
  std::shared_ptr<ModuleList> blocks;  // TransformerBlock "0" .. "n_layer-1"
  std::shared_ptr<LayerNorm> ln_f;

 private:
  GPTConfig config_;
  std::vector<std::shared_ptr<TransformerBlock>> block_list_;
};

// The zoo entry "gpt": options vocab_size, block_size, seq_len, n_layer, n_head, n_embd,
// dropout, bias (GPTConfig's fields); sizes bounded so that no tensor of a step overflows.
ModelEntry gpt_model_entry();

}  // namespace hap::nn
