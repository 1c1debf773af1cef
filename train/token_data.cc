#include "train/token_data.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/input_file.h"
#include "train/text_corpus.h"

namespace hap::train {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian; this reader assumes a little-endian host");

std::vector<uint16_t> read_token_shard(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  HAP_CHECK(!ec && fs::exists(st), "token shard '", path, "' does not exist");
  // Not a FIFO or a device: those could block or never end.
  HAP_CHECK(fs::is_regular_file(st), "token shard '", path, "' is not a regular file");
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  HAP_CHECK(!ec, "token shard '", path, "': cannot read its size (", ec.message(), ")");
  HAP_CHECK(size >= kTokenShardHeaderBytes, "token shard '", path, "' has ", size,
            " bytes, fewer than its ", kTokenShardHeaderBytes,
            "-byte header (256 int32: magic, version, number of tokens)");
  std::ifstream in(path, std::ios::binary);
  HAP_CHECK(in.good(), "token shard '", path, "': cannot open it");
  std::array<int32_t, 256> header{};
  in.read(reinterpret_cast<char*>(header.data()), kTokenShardHeaderBytes);
  HAP_CHECK(in.good(), "token shard '", path, "': cannot read its header");
  HAP_CHECK(header[0] == kTokenShardMagic, "token shard '", path, "': magic number ", header[0],
            ", expected ", kTokenShardMagic, " (llm.c's token shard layout)");
  HAP_CHECK(header[1] == kTokenShardVersion, "token shard '", path, "': version ", header[1],
            ", expected ", kTokenShardVersion, " (uint16 token ids)");
  const int64_t n = header[2];
  HAP_CHECK(n >= 0, "token shard '", path, "': the header counts ", n, " tokens");
  HAP_CHECK(size == kTokenShardHeaderBytes + 2 * n, "token shard '", path, "' has ", size,
            " bytes, but its header counts ", n, " tokens (", kTokenShardHeaderBytes + 2 * n,
            " bytes with the header): truncated or not a token shard");
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  in.read(reinterpret_cast<char*>(tokens.data()), 2 * n);
  HAP_CHECK(in.good() || n == 0, "token shard '", path, "': cannot read its ", n, " tokens");
  return tokens;
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  HAP_CHECK(static_cast<int64_t>(tokens.size()) <= kTokenShardMaxTokens, "token shard '", path,
            "': ", tokens.size(), " tokens, at most ", kTokenShardMaxTokens, " fit its header");
  std::array<int32_t, 256> header{};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(header.data()), kTokenShardHeaderBytes);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(2 * tokens.size()));
  out.close();
  HAP_CHECK(out.good(), "cannot write token shard '", path, "'");
}

std::vector<uint16_t> read_token_shards(const std::string& path, const std::string& key,
                                        int64_t* num_files) {
  HAP_CHECK(!path.empty(), key,
            ": empty path (expected a token shard or a folder of *.bin shards)");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  HAP_CHECK(!ec && fs::exists(st), key, ": '", path,
            "' does not exist (expected a token shard or a folder of *.bin shards)");
  if (!fs::is_directory(st)) {
    *num_files = 1;
    return read_token_shard(path);
  }
  std::vector<fs::path> files;
  for (const std::string& file : regular_files_in(path, key))
    if (fs::path(file).extension() == ".bin") files.push_back(file);
  std::sort(files.begin(), files.end());
  HAP_CHECK(!files.empty(), key, ": folder '", path, "' has no *.bin token shards");
  std::vector<uint16_t> tokens;
  for (const fs::path& f : files) {
    const std::vector<uint16_t> part = read_token_shard(f.string());
    tokens.insert(tokens.end(), part.begin(), part.end());
  }
  *num_files = static_cast<int64_t>(files.size());
  return tokens;
}

namespace {

class TokenDataset : public Dataset {
 public:
  TokenDataset(std::vector<uint16_t> train, std::vector<uint16_t> val, std::string what,
               int64_t seq_len, uint64_t seed, bool with_targets)
      : train_(std::move(train)),
        val_(std::move(val)),
        what_(std::move(what)),
        seq_len_(seq_len),
        seed_(seed),
        with_targets_(with_targets) {}

  nn::Batch read(Split split, uint64_t index, int64_t row_begin, int64_t row_end) const override {
    const TextWindows w = sample_windows(split == Split::kTrain ? train_ : val_, split, seq_len_,
                                         seed_, index, row_begin, row_end);
    if (!with_targets_) return {{"idx", w.idx}};
    return {{"idx", w.idx}, {"targets", w.targets}};
  }

  std::string describe() const override {
    return "tokens: " + what_ + ", windows of " + std::to_string(seq_len_) + " tokens";
  }

 private:
  std::vector<uint16_t> train_, val_;
  std::string what_;
  int64_t seq_len_;
  uint64_t seed_;
  bool with_targets_;
};

// Throws when a token id is outside the model's vocabulary (the first one, and where).
void check_vocabulary(const std::vector<uint16_t>& tokens, int64_t vocab, const std::string& key,
                      const std::string& path) {
  if (vocab <= 0) return;
  const auto bad = std::find_if(tokens.begin(), tokens.end(),
                                [vocab](uint16_t t) { return static_cast<int64_t>(t) >= vocab; });
  HAP_CHECK(bad == tokens.end(), key, ": '", path, "' holds token id ", *bad, " (token ",
            bad - tokens.begin(), "), outside the model's vocabulary of ", vocab,
            " (model.vocab_size)");
}

}  // namespace

DatasetEntry tokens_dataset_entry() {
  DatasetEntry e;
  e.name = "tokens";
  e.summary = "pre-tokenized uint16 shards in llm.c's layout (inputs idx, targets)";
  e.options = {
      nn::OptionSpec::string("path", std::nullopt,
                             "a token shard (.bin) or a folder of them: the training split"),
      nn::OptionSpec::string("val_path", "",
                             "shards of the validation split (empty: the last val_fraction of "
                             "path's tokens)")
          .empty_allowed(),
      nn::OptionSpec::number("val_fraction", 0.1, 0.0, 1.0,
                             "share of the tokens held out for evaluation when val_path is empty")
          .min_open()
          .max_open(),
  };
  e.open = [](const nn::Options& o, const std::vector<nn::InputSpec>& inputs,
              uint64_t seed) -> std::shared_ptr<Dataset> {
    bool with_targets = true;
    int64_t vocab = 0;
    const int64_t T =
        token_window_length(inputs, "tokens", "in [0, model.vocab_size)", &with_targets, &vocab);
    const std::string& path = o.string("path");
    const std::string& val_path = o.string("val_path");
    int64_t files = 0, val_files = 0;
    std::vector<uint16_t> train = read_token_shards(path, "data.path", &files);
    check_vocabulary(train, vocab, "data.path", path);
    std::vector<uint16_t> val;
    if (val_path.empty()) {
      const auto n = static_cast<int64_t>(train.size());
      const auto n_val = static_cast<int64_t>(static_cast<double>(n) * o.number("val_fraction"));
      val.assign(train.end() - n_val, train.end());
      train.resize(static_cast<size_t>(n - n_val));
    } else {
      val = read_token_shards(val_path, "data.val_path", &val_files);
      check_vocabulary(val, vocab, "data.val_path", val_path);
    }
    const int64_t need = T + 1;
    HAP_CHECK(
        static_cast<int64_t>(train.size()) >= need && static_cast<int64_t>(val.size()) >= need,
        "data.path: the training split has ", train.size(), " and the validation split ",
        val.size(), " tokens, but each needs at least seq_len + 1 = ", need,
        " tokens for one sequence");
    std::string what =
        path + ": " + std::to_string(train.size()) + " training tokens from " +
        std::to_string(files) + " shard(s), " + std::to_string(val.size()) + " validation tokens " +
        (val_path.empty() ? std::string("held out")
                          : "from " + val_path + " (" + std::to_string(val_files) + " shard(s))");
    return std::make_shared<TokenDataset>(std::move(train), std::move(val), std::move(what), T,
                                          seed, with_targets);
  };
  return e;
}

}  // namespace hap::train
