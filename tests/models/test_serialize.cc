// The .hapt format: byte layout, round trips of every dtype, each kind of bad file, atomic
// writes; checkpoints that resume training exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model_test_util.h"
#include "models/gpt.h"
#include "models/layers.h"
#include "models/optim.h"
#include "models/serialize.h"
#include "ops/functional.h"

namespace hap {
namespace {

namespace fs = std::filesystem;
using hap::testing::error_of;
using hap::testing::same_values;

class SerializeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("hap_test_serialize_" + std::to_string(::getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static std::vector<char> read_bytes(const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  static void write_bytes(const std::string& p, const std::vector<char>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  fs::path dir_;
};

NamedTensors every_dtype() {
  NamedTensors t;
  t.emplace_back("f32", randn({2, 3}, 1));
  t.emplace_back("bf16", randn({3}, 2).to(DType::BF16));
  t.emplace_back("f64", randn({2, 2, 2}, 3, 0, TensorOptions{}.with_dtype(DType::F64)));
  t.emplace_back("i64", Tensor::from_vector(std::vector<int64_t>{-5, 0, 1LL << 40}, {3}));
  t.emplace_back("u8", Tensor::from_vector(std::vector<double>{0, 7, 255}, {3, 1},
                                           TensorOptions{}.with_dtype(DType::U8)));
  t.emplace_back("scalar", Tensor::scalar(2.5));
  t.emplace_back("empty", Tensor::zeros({0, 4}));
  // A transposed (non-contiguous) view is written in logical row-major order.
  Tensor m = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  t.emplace_back("blocks.0.transposed", m.as_strided({3, 2}, {1, 3}, 0));
  return t;
}

TEST_F(SerializeTest, RoundTripsEveryDtypeInOrder) {
  NamedTensors saved = every_dtype();
  save_tensors(path("all.hapt"), saved);
  NamedTensors loaded = load_tensors(path("all.hapt"));
  ASSERT_EQ(loaded.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(loaded[i].first, saved[i].first);
    EXPECT_EQ(loaded[i].second.dtype(), saved[i].second.dtype()) << saved[i].first;
    EXPECT_TRUE(same_values(loaded[i].second, saved[i].second)) << saved[i].first;
  }
  EXPECT_EQ(loaded.back().second.to_vector(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(loaded[3].second.item_at(2), static_cast<double>(1LL << 40));
}

TEST_F(SerializeTest, WritesTheDocumentedByteLayout) {
  Tensor t = Tensor::from_vector(std::vector<float>{1.0f, -2.0f}, {1, 2});
  save_tensors(path("one.hapt"), {{"w", t}});
  std::vector<char> b = read_bytes(path("one.hapt"));
  std::vector<char> expected = {
      'H', 'A', 'P', 'T', 1,   0, 0, 0, 1, 0, 0, 0,  // magic, version, count
      1,   0,   0,   0,   'w',                       // name
      0,                                             // f32
      2,   0,   0,   0,                              // ndim
      1,   0,   0,   0,   0,   0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  float data[2] = {1.0f, -2.0f};
  expected.insert(expected.end(), reinterpret_cast<char*>(data), reinterpret_cast<char*>(data) + 8);
  EXPECT_EQ(b, expected);
}

TEST_F(SerializeTest, ReportsMissingFilesBadMagicAndBadVersion) {
  EXPECT_HAS(error_of([&] { load_tensors(path("nope.hapt")); }),
             "load_tensors: cannot open " + path("nope.hapt"));
  write_bytes(path("bad.hapt"), {'N', 'O', 'P', 'E', 1, 0, 0, 0, 0, 0, 0, 0});
  EXPECT_HAS(error_of([&] { load_tensors(path("bad.hapt")); }),
             "is not a .hapt file (its first bytes are not \"HAPT\")");
  write_bytes(path("v2.hapt"), {'H', 'A', 'P', 'T', 2, 0, 0, 0, 0, 0, 0, 0});
  EXPECT_HAS(error_of([&] { load_tensors(path("v2.hapt")); }), "has .hapt version 2");
  write_bytes(path("empty.hapt"), {});
  EXPECT_HAS(error_of([&] { load_tensors(path("empty.hapt")); }),
             "is truncated while reading the magic bytes");
}

TEST_F(SerializeTest, EveryTruncationIsReportedAsTruncated) {
  save_tensors(path("all.hapt"), every_dtype());
  std::vector<char> full = read_bytes(path("all.hapt"));
  for (size_t len = 0; len < full.size(); ++len) {
    write_bytes(path("cut.hapt"), std::vector<char>(full.begin(), full.begin() + len));
    std::string msg = error_of([&] { load_tensors(path("cut.hapt")); });
    EXPECT_HAS(msg, "is truncated while reading");
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "at length " << len << " of " << full.size();
      break;
    }
  }
  std::vector<char> longer = full;
  longer.push_back(0);
  write_bytes(path("long.hapt"), longer);
  EXPECT_HAS(error_of([&] { load_tensors(path("long.hapt")); }),
             "has 1 unexpected bytes after the last of its 8 tensors");
}

TEST_F(SerializeTest, RejectsUnknownDtypesDuplicatesAndHugeDims) {
  std::vector<char> header = {'H', 'A', 'P', 'T', 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'x'};
  std::vector<char> bad_code = header;
  bad_code.insert(bad_code.end(), {9, 0, 0, 0, 0});
  write_bytes(path("code.hapt"), bad_code);
  EXPECT_HAS(error_of([&] { load_tensors(path("code.hapt")); }),
             "tensor 'x' has unknown dtype code 9");
  std::vector<char> huge = header;
  huge.insert(huge.end(), {0, 2, 0, 0, 0});
  for (int d = 0; d < 2; ++d) {
    int64_t dim = int64_t{1} << 40;
    huge.insert(huge.end(), reinterpret_cast<char*>(&dim), reinterpret_cast<char*>(&dim) + 8);
  }
  write_bytes(path("huge.hapt"), huge);
  EXPECT_HAS(error_of([&] { load_tensors(path("huge.hapt")); }),
             "is truncated while reading the data of 'x'");
  Tensor t = Tensor::zeros({1});
  EXPECT_HAS(error_of([&] {
               save_tensors(path("dup.hapt"), {{"a", t}, {"a", t}});
             }),
             "tensor name 'a' appears twice");
  EXPECT_HAS(error_of([&] { save_tensors(path("noname.hapt"), {{"", t}}); }), "non-empty");
  EXPECT_HAS(error_of([&] {
               save_tensors(path("meta.hapt"), {{"m", Tensor::meta({2}, DType::F32)}});
             }),
             "has no storage");
  EXPECT_FALSE(fs::exists(path("dup.hapt")));
}

TEST_F(SerializeTest, SavesAtomicallyAndLeavesNoTemporaryFiles) {
  save_tensors(path("ckpt.hapt"), {{"a", Tensor::ones({2})}});
  save_tensors(path("ckpt.hapt"), {{"b", Tensor::zeros({3})}});  // replaces the old file
  NamedTensors loaded = load_tensors(path("ckpt.hapt"));
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].first, "b");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "ckpt.hapt");
  }
  EXPECT_EQ(files, 1);
  EXPECT_HAS(error_of([&] {
               save_tensors(path("no/such/dir/x.hapt"), {{"a", Tensor::ones({1})}});
             }),
             "save_tensors: cannot create");
}

nn::GPTConfig tiny(uint64_t seed) {
  nn::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.dropout = 0.1;
  c.seed = seed;
  return c;
}

struct TrainingRun {
  std::shared_ptr<nn::GPT> model;
  std::unique_ptr<optim::AdamW> opt;
  explicit TrainingRun(uint64_t seed) : model(std::make_shared<nn::GPT>(tiny(seed))) {
    opt = std::make_unique<optim::AdamW>(
        optim::weight_decay_groups(model->named_parameters(), 0.1),
        optim::AdamWOptions{.lr = 1e-2, .betas = {0.9, 0.95}, .eps = 1e-8, .weight_decay = 0.1});
  }
  void train_step() {
    Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}, {2, 4});
    Tensor targets = Tensor::from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9}, {2, 4});
    opt->zero_grad();
    model->loss(idx, targets).backward();
    opt->step();
  }
};

TEST_F(SerializeTest, CheckpointResumesTrainingExactly) {
  TrainingRun a(1);
  a.train_step();
  a.train_step();
  save_checkpoint(path("run.ckpt"), *a.model, a.opt.get(), 2);
  TrainingRun b(999);  // another init: everything must come from the checkpoint
  EXPECT_EQ(load_checkpoint(path("run.ckpt"), *b.model, b.opt.get()), 2);
  EXPECT_EQ(b.model->random_step(), 2u);
  a.train_step();
  b.train_step();  // same weights, same Adam moments and steps, same dropout masks
  for (const auto& [name, p] : a.model->named_parameters())
    EXPECT_TRUE(same_values(p, b.model->parameter(name))) << name;
  EXPECT_EQ(b.opt->state(b.model->wte->weight)->step, 3);

  // Weights only: optimizer entries are ignored when no optimizer is given.
  TrainingRun c(5);
  EXPECT_EQ(load_checkpoint(path("run.ckpt"), *c.model, nullptr), 2);
  for (const auto& [name, t] : read_checkpoint(path("run.ckpt")).tensors)
    if (name.starts_with("model.")) {
      EXPECT_TRUE(same_values(t, c.model->parameter(name.substr(6)))) << name;
    }
  EXPECT_EQ(c.opt->state(c.model->wte->weight)->step, 0);
}

// Checkpoints written while attention's q, k, v weights were one [3C, C] matrix (and their biases
// one [3C] vector), optimizer moments included, resume on the stacked [3, C, C] / [3, C] layout:
// the same numbers in the same order.
TEST_F(SerializeTest, CheckpointsOfTheUnstackedQkvLayoutResume) {
  TrainingRun a(1);
  a.train_step();
  save_checkpoint(path("new.ckpt"), *a.model, a.opt.get(), 1);
  Checkpoint old = read_checkpoint_as_written(path("new.ckpt"));
  int rewritten = 0;
  for (auto& [name, t] : old.tensors) {
    if (name.find("attn.qkv.") == std::string::npos || name.starts_with("optim.step.")) continue;
    const Tensor packed = t.contiguous();
    const Shape flat = t.dim() == 3 ? Shape{3 * t.size(1), t.size(2)} : Shape{3 * t.size(1)};
    t = packed.as_strided(flat, contiguous_strides(flat), packed.offset());
    ++rewritten;
  }
  EXPECT_EQ(rewritten, 2 * 2 * 3);  // 2 blocks x (weight, bias) x (model, exp_avg, exp_avg_sq)
  write_checkpoint(path("old.ckpt"), old);
  EXPECT_EQ(read_checkpoint_as_written(path("old.ckpt")).tensors.size(), old.tensors.size());
  TrainingRun b(999);
  EXPECT_EQ(load_checkpoint(path("old.ckpt"), *b.model, b.opt.get()), 1);
  a.train_step();
  b.train_step();
  for (const auto& [name, p] : a.model->named_parameters())
    EXPECT_TRUE(same_values(p, b.model->parameter(name))) << name;
}

TEST_F(SerializeTest, CheckpointsHoldBuffers) {
  nn::BatchNorm a(nn::BatchNormOptions(3));
  a.forward(randn({5, 3, 2}, 3) * 2.0 + 1.0);  // running statistics away from their start
  save_checkpoint(path("bn.ckpt"), a, nullptr, 1);
  nn::BatchNorm b(nn::BatchNormOptions(3));
  EXPECT_EQ(load_checkpoint(path("bn.ckpt"), b, nullptr), 1);
  EXPECT_TRUE(same_values(b.running_mean, a.running_mean));
  EXPECT_TRUE(same_values(b.running_var, a.running_var));
  // Without its running statistics a checkpoint does not fit a model that keeps them.
  nn::BatchNorm plain(nn::BatchNormOptions(3).track_running_stats(false));
  save_checkpoint(path("plain.ckpt"), plain, nullptr, 0);
  EXPECT_HAS(error_of([&] { load_checkpoint(path("plain.ckpt"), b, nullptr); }),
             "has no tensor 'model.running_mean'");
}

TEST_F(SerializeTest, CheckpointMismatchesAreReportedByName) {
  TrainingRun a(1);
  save_checkpoint(path("weights.ckpt"), *a.model, nullptr, 0);
  TrainingRun b(1);
  EXPECT_HAS(error_of([&] { load_checkpoint(path("weights.ckpt"), *b.model, b.opt.get()); }),
             "has no tensor 'optim.exp_avg.wte.weight'");
  nn::GPTConfig wider = tiny(1);
  wider.n_embd = 16;
  nn::GPT w(wider);
  EXPECT_HAS(error_of([&] { load_checkpoint(path("weights.ckpt"), w, nullptr); }),
             "tensor 'model.wte.weight' has shape [13, 8], expected [13, 16]");
  nn::GPTConfig deeper = tiny(1);
  deeper.n_layer = 3;
  nn::GPT d(deeper);
  EXPECT_HAS(error_of([&] { load_checkpoint(path("weights.ckpt"), d, nullptr); }),
             "has no tensor 'model.blocks.2.ln1.weight'");
  nn::GPTConfig shallower = tiny(1);
  shallower.n_layer = 1;
  nn::GPT s(shallower);
  EXPECT_HAS(error_of([&] { load_checkpoint(path("weights.ckpt"), s, nullptr); }),
             "has an unexpected tensor 'model.blocks.1.ln1.weight'");
}

}  // namespace
}  // namespace hap
