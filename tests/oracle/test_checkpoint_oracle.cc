// Checkpoints in the safetensors format are readable by any reader: PyTorch parses one by the
// format's layout (tests/oracle/checkpoint_oracle.py, verifying our checksums independently)
// and finds every tensor bitwise equal; a plain safetensors file PyTorch writes (another key
// order, no checksums) is read back here.
#include "models/gpt.h"
#include "models/optim.h"
#include "oracle_util.h"

namespace hap {
namespace {

TEST(CheckpointOracle, PyTorchReadsOurCheckpointsAndWeReadItsSafetensors) {
  const std::filesystem::path dir = oracle::temp_dir("checkpoint");
  nn::GPTConfig c;
  c.vocab_size = 29;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 12;
  c.seed = 11;
  nn::GPT model(c);
  optim::AdamW opt(optim::weight_decay_groups(model.named_parameters(), 0.1),
                   optim::AdamWOptions{.lr = 1e-2});
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
  for (int step = 0; step < 2; ++step) {
    opt.zero_grad();
    model.loss(idx, idx).backward();
    opt.step();
  }
  const std::string ckpt = (dir / "run.safetensors").string();
  const std::string ref = (dir / "run.hapt").string();
  const std::string back = (dir / "torch.safetensors").string();
  save_checkpoint(ckpt, model, &opt, 2);
  const Checkpoint written = read_checkpoint(ckpt);
  save_tensors(ref, written.tensors);  // the same tensors in the oracles' own format
  ASSERT_EQ(oracle::run_script("checkpoint_oracle.py", {ckpt, ref, "2", back}), 0);

  TensorMetadata meta;
  NamedTensors from_torch = load_safetensors(back, &meta);
  EXPECT_EQ(meta, (TensorMetadata{{"written_by", "pytorch"}}));
  ASSERT_EQ(from_torch.size(), written.tensors.size());
  std::map<std::string, Tensor> by_name(from_torch.begin(), from_torch.end());
  for (const auto& [name, t] : written.tensors) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(by_name[name].dtype(), t.dtype()) << name;
    EXPECT_EQ(by_name[name].to_vector(), t.to_vector()) << name;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hap
