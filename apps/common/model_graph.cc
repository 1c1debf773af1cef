#include "apps/common/model_graph.h"

namespace hap::app {

nn::GPTConfig gpt_config(const TrainRunConfig& c) {
  nn::GPTConfig g;
  g.vocab_size = c.model.vocab_size;
  g.block_size = c.model.block_size;
  g.n_layer = c.model.n_layer;
  g.n_head = c.model.n_head;
  g.n_embd = c.model.n_embd;
  g.dropout = c.model.dropout;
  g.bias = c.model.bias;
  g.seed = c.train.seed;
  return g;
}

TracedModel trace_model(const TrainRunConfig& config, std::optional<uint64_t> dropout_seed) {
  TracedModel tm;
  {
    MetaGuard meta;  // the graph needs shapes only: no parameter is allocated or drawn
    tm.model = std::make_shared<nn::GPT>(gpt_config(config));
  }
  tm.model->train();
  if (dropout_seed) tm.model->set_random_seed(*dropout_seed);
  Shape batch = {config.train.batch_size, config.train.seq_len};
  Tensor idx = Tensor::meta(batch, DType::I64);
  Tensor targets = Tensor::meta(batch, DType::I64);
  tm.graph = synth::trace([&] { return tm.model->loss(idx, targets); }, tm.model->named_parameters(),
                          {{"idx", idx}, {"targets", targets}});
  return tm;
}

}  // namespace hap::app
