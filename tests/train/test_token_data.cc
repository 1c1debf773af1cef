// The dataset "tokens": llm.c token shards written here, read alone or as a folder, batches drawn
// as windows like the byte corpus, and the errors for bad shards (in the library and through
// hap-train's exit codes).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"
#include "train/dataset.h"
#include "train/token_data.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / ("hap_tokens_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Tokens first, first + 1, ... modulo `modulo`.
std::vector<uint16_t> counting(size_t n, uint16_t first, uint16_t modulo) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((first + i) % modulo);
  return t;
}

std::vector<nn::InputSpec> lm_inputs(int64_t batch, int64_t T, int64_t vocab) {
  return {{"idx", {batch, T}, DType::I64, 0, vocab},
          {"targets", {batch, T}, DType::I64, 0, vocab, true}};
}

std::shared_ptr<Dataset> open(const std::map<std::string, nn::OptionValue>& set,
                              const std::vector<nn::InputSpec>& in, uint64_t seed = 3) {
  const DatasetEntry& e = find_dataset("tokens");
  nn::Options o(e.options);
  for (const auto& [k, v] : set) o.set(k, v);
  return open_dataset(e, o, in, seed);
}

TEST(TokenData, AShardRoundTripsAndAFolderReadsItsBinShardsInNameOrder) {
  const fs::path d = scratch("folder");
  write_token_shard((d / "b_000001.bin").string(), counting(700, 100, 300));
  write_token_shard((d / "a_000000.bin").string(), counting(500, 0, 300));
  std::ofstream(d / "README.txt") << "not a shard";
  EXPECT_EQ(read_token_shard((d / "a_000000.bin").string()), counting(500, 0, 300));
  int64_t files = 0;
  const std::vector<uint16_t> all = read_token_shards(d.string(), "data.path", &files);
  EXPECT_EQ(files, 2);
  ASSERT_EQ(all.size(), 1200u);
  EXPECT_EQ(std::vector<uint16_t>(all.begin(), all.begin() + 500), counting(500, 0, 300));
  EXPECT_EQ(std::vector<uint16_t>(all.begin() + 500, all.end()), counting(700, 100, 300));
  fs::remove_all(d);
}

TEST(TokenData, BadShardsNameTheFileAndWhatIsWrong) {
  const fs::path d = scratch("bad");
  const std::string good = (d / "good.bin").string();
  write_token_shard(good, counting(64, 0, 50));
  auto corrupt = [&](const std::string& name, int64_t at, int32_t value) {
    fs::copy_file(good, d / name);
    std::fstream f(d / name, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(at);
    f.write(reinterpret_cast<const char*>(&value), 4);
    return (d / name).string();
  };
  EXPECT_HAS(test_util::error_of([&] { read_token_shard(corrupt("magic.bin", 0, 1234)); }),
             "magic number 1234, expected 20240520");
  EXPECT_HAS(test_util::error_of([&] { read_token_shard(corrupt("version.bin", 4, 2)); }),
             "version 2, expected 1");
  EXPECT_HAS(test_util::error_of([&] { read_token_shard(corrupt("count.bin", 8, 65)); }),
             "counts 65 tokens");
  fs::copy_file(good, d / "truncated.bin");
  fs::resize_file(d / "truncated.bin", 1024 + 2 * 64 - 1);
  const std::string m =
      test_util::error_of([&] { read_token_shard((d / "truncated.bin").string()); });
  EXPECT_HAS(m, (d / "truncated.bin").string());
  EXPECT_HAS(m, "has 1151 bytes, but its header counts 64 tokens");
  std::ofstream(d / "short.bin") << "tiny";
  EXPECT_HAS(test_util::error_of([&] { read_token_shard((d / "short.bin").string()); }),
             "fewer than its 1024-byte header");
  // A FIFO would block a reader that opens it: refused before opening.
  ASSERT_EQ(::mkfifo((d / "fifo.bin").c_str(), 0600), 0);
  EXPECT_HAS(test_util::error_of([&] { read_token_shard((d / "fifo.bin").string()); }),
             "is not a regular file");
  EXPECT_HAS(test_util::error_of([&] { read_token_shard((d / "none.bin").string()); }),
             "does not exist");
  const fs::path empty = scratch("empty");
  int64_t files = 0;
  EXPECT_HAS(test_util::error_of([&] { read_token_shards(empty.string(), "data.path", &files); }),
             "data.path: folder '" + empty.string() + "' has no *.bin token shards");
  fs::remove_all(d);
  fs::remove_all(empty);
}

TEST(TokenData, BatchesAreWindowsWithTheNextTokensAsTargetsAndRowsReadAloneAgree) {
  const fs::path d = scratch("batches");
  write_token_shard((d / "train.bin").string(), counting(2000, 0, 300));
  write_token_shard((d / "val.bin").string(), counting(400, 7, 300));
  auto ds = open({{"path", (d / "train.bin").string()}, {"val_path", (d / "val.bin").string()}},
                 lm_inputs(6, 16, 300));
  EXPECT_HAS(ds->describe(), "2000 training tokens from 1 shard(s), 400 validation tokens");
  for (Split split : {Split::kTrain, Split::kVal}) {
    const nn::Batch whole = ds->read(split, 4, 0, 6), part = ds->read(split, 4, 2, 5);
    const std::vector<double> idx = whole.at("idx").to_vector(),
                              tgt = whole.at("targets").to_vector(),
                              pidx = part.at("idx").to_vector();
    for (int r = 0; r < 6; ++r)
      for (int t = 0; t < 16; ++t) {
        const double x = idx[static_cast<size_t>(r * 16 + t)];
        // Counting data: every token is its predecessor + 1 (mod 300), targets are the next ones.
        EXPECT_EQ(tgt[static_cast<size_t>(r * 16 + t)], std::fmod(x + 1, 300.0));
        if (t > 0) {
          EXPECT_EQ(x, std::fmod(idx[static_cast<size_t>(r * 16 + t - 1)] + 1, 300.0));
        }
      }
    for (size_t i = 0; i < pidx.size(); ++i) EXPECT_EQ(pidx[i], idx[2 * 16 + i]);
  }
  // Without val_path the last val_fraction of the tokens is held out.
  auto held =
      open({{"path", (d / "train.bin").string()}, {"val_fraction", 0.25}}, lm_inputs(2, 16, 300));
  EXPECT_HAS(held->describe(), "1500 training tokens from 1 shard(s), 500 validation tokens");
  fs::remove_all(d);
}

TEST(TokenData, TokensOutsideTheVocabularyOrSplitsTooShortAreRefused) {
  const fs::path d = scratch("vocab");
  std::vector<uint16_t> tokens = counting(300, 0, 250);
  tokens[123] = 260;
  write_token_shard((d / "t.bin").string(), tokens);
  std::string m = test_util::error_of([&] {
    open({{"path", (d / "t.bin").string()}}, lm_inputs(2, 8, 256));
  });
  EXPECT_HAS(m, "token id 260 (token 123), outside the model's vocabulary of 256");
  write_token_shard((d / "small.bin").string(), counting(40, 0, 250));
  m = test_util::error_of([&] {
    open({{"path", (d / "small.bin").string()}}, lm_inputs(2, 16, 256));
  });
  EXPECT_HAS(m, "the training split has 36 and the validation split 4 tokens");
  m = test_util::error_of([&] {
    open({{"path", (d / "small.bin").string()}}, {{"images", {2, 3, 8, 8}, DType::F32, 0}});
  });
  EXPECT_HAS(m, "data 'tokens' gives the inputs idx and (optionally) targets");
  fs::remove_all(d);
}

// hap-train trains a GPT on token shards; a bad shard exits 1 naming the file.
int run_train(const std::string& args, std::string* out) {
  const std::string outfile =
      (fs::temp_directory_path() / ("hap_tokens_out_" + std::to_string(::getpid()))).string();
  const std::string cmd = std::string(HAP_TRAIN_BIN) + " --config " + HAP_SOURCE_DIR +
                          "/configs/gpt-tiny.yaml --set data.name=tokens --set train.steps=4 " +
                          "--set train.eval_every=2 --set model.vocab_size=320 " + args + " > " +
                          outfile + " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(outfile);
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  fs::remove(outfile);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(TokenData, HapTrainTrainsOnShardsAndExitsWithOneForABadShard) {
  const fs::path d = scratch("train");
  write_token_shard((d / "shard_000000.bin").string(), counting(3000, 0, 320));
  write_token_shard((d / "shard_000001.bin").string(), counting(3000, 11, 320));
  std::string out;
  ASSERT_EQ(run_train("--set data.path=" + d.string(), &out), 0) << out;
  EXPECT_HAS(out, "tokens: " + d.string() + ": 5400 training tokens from 2 shard(s)");
  EXPECT_HAS(out, "val");
  std::vector<uint16_t> tokens = counting(3000, 0, 320);
  tokens[5] = 400;
  write_token_shard((d / "shard_000001.bin").string(), tokens);
  EXPECT_EQ(run_train("--set data.path=" + d.string(), &out), 1) << out;
  EXPECT_HAS(out, "token id 400");
  fs::remove_all(d);
}

}  // namespace
}  // namespace hap::train
