#include "train/text_corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/input_file.h"
#include "core/philox.h"

namespace hap::train {

namespace fs = std::filesystem;

namespace {
void append_file(const fs::path& p, std::vector<uint8_t>& out) {
  const std::string why =
      unreadable_reason(p.string(), kMaxCorpusBytes - static_cast<int64_t>(out.size()));
  HAP_CHECK(why.empty(), "data.path: '", p.string(), "' ", why,
            why.rfind("has ", 0) == 0 ? " (the corpus may hold at most " +
                                            std::to_string(kMaxCorpusBytes) + " bytes in all)"
                                      : std::string());
  std::ifstream in(p, std::ios::binary);
  HAP_CHECK(in.good(), "data.path: cannot read '", p.string(), "'");
  out.insert(out.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
}  // namespace

TextCorpus TextCorpus::load(const std::string& path, double val_fraction, int64_t seq_len) {
  HAP_CHECK(!path.empty(),
            "data.path: empty path (expected a text file or a directory of text files)");
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  HAP_CHECK(!ec && fs::exists(st), "data.path: '", path,
            "' does not exist (expected a text file or a directory of text files; the default "
            "corpus comes from the Debian package 'fortunes', installed by scripts/setup.sh)");
  std::vector<uint8_t> bytes;
  TextCorpus c;
  if (fs::is_directory(st)) {
    std::vector<fs::path> files;
    for (const std::string& file : regular_files_in(path, "data.path"))
      if (fs::path(file).extension() != ".dat") files.push_back(file);  // .dat: strfile indexes
    std::sort(files.begin(), files.end());
    for (const auto& f : files) append_file(f, bytes);
    c.num_files_ = static_cast<int64_t>(files.size());
  } else {
    append_file(path, bytes);
    c.num_files_ = 1;
  }
  HAP_CHECK(!bytes.empty(), "data.path: corpus '", path, "' is empty (", c.num_files_,
            " files, 0 bytes)");
  auto n = static_cast<int64_t>(bytes.size());
  auto n_val = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
  int64_t need = seq_len + 1;
  HAP_CHECK(n - n_val >= need && n_val >= need, "data.path: corpus '", path, "' has ", n,
            " bytes; with data.val_fraction ", val_fraction, " the train split has ", n - n_val,
            " and the validation split ", n_val,
            " bytes, but each needs at least seq_len + 1 = ", need, " bytes for one sequence");
  c.train_.assign(bytes.begin(), bytes.end() - n_val);
  c.val_.assign(bytes.end() - n_val, bytes.end());
  return c;
}

template <typename Token>
TextWindows sample_windows(const std::vector<Token>& data, Split s, int64_t seq_len, uint64_t seed,
                           uint64_t step, int64_t row_begin, int64_t row_end) {
  int64_t rows = row_end - row_begin;
  HAP_CHECK(rows >= 0 && seq_len >= 1, "batch: bad rows [", row_begin, ", ", row_end,
            ") or seq_len ", seq_len);
  auto span = static_cast<uint64_t>(static_cast<int64_t>(data.size()) - seq_len);  // >= 1
  TextWindows b;
  b.idx = Tensor::empty({rows, seq_len}, TensorOptions{}.with_dtype(DType::I64));
  b.targets = Tensor::empty({rows, seq_len}, TensorOptions{}.with_dtype(DType::I64));
  int64_t* pi = b.idx.data<int64_t>();
  int64_t* pt = b.targets.data<int64_t>();
  // The validation split uses its own stream family so that eval batches never follow training.
  uint64_t stream = (s == Split::kTrain ? 0 : (uint64_t{1} << 62)) + step;
  for (int64_t r = 0; r < rows; ++r) {
    auto w = philox_words(seed, stream, static_cast<uint64_t>(row_begin + r));
    uint64_t x = (static_cast<uint64_t>(w[1]) << 32) | w[0];
    uint64_t off = x % span;
    for (int64_t t = 0; t < seq_len; ++t) {
      pi[r * seq_len + t] = data[off + t];
      pt[r * seq_len + t] = data[off + t + 1];
    }
  }
  return b;
}

template TextWindows sample_windows(const std::vector<uint8_t>&, Split, int64_t, uint64_t, uint64_t,
                                    int64_t, int64_t);
template TextWindows sample_windows(const std::vector<uint16_t>&, Split, int64_t, uint64_t,
                                    uint64_t, int64_t, int64_t);

TextWindows TextCorpus::batch(Split s, int64_t seq_len, uint64_t seed, uint64_t step,
                              int64_t row_begin, int64_t row_end) const {
  return sample_windows(split(s), s, seq_len, seed, step, row_begin, row_end);
}

namespace {

class ByteDataset : public Dataset {
 public:
  ByteDataset(TextCorpus corpus, std::string path, int64_t seq_len, uint64_t seed,
              bool with_targets)
      : corpus_(std::move(corpus)),
        path_(std::move(path)),
        seq_len_(seq_len),
        seed_(seed),
        with_targets_(with_targets) {}

  nn::Batch read(Split split, uint64_t index, int64_t row_begin, int64_t row_end) const override {
    TextWindows w = corpus_.batch(split, seq_len_, seed_, index, row_begin, row_end);
    if (!with_targets_) return {{"idx", w.idx}};
    return {{"idx", w.idx}, {"targets", w.targets}};
  }

  std::string describe() const override {
    return "bytes: " + path_ + ": " + std::to_string(corpus_.total_bytes()) + " bytes from " +
           std::to_string(corpus_.num_files()) + " file(s), windows of " +
           std::to_string(seq_len_) + " tokens";
  }

 private:
  TextCorpus corpus_;
  std::string path_;
  int64_t seq_len_;
  uint64_t seed_;
  bool with_targets_;
};

}  // namespace

int64_t token_window_length(const std::vector<nn::InputSpec>& inputs, const std::string& dataset,
                            const std::string& ids, bool* with_targets, int64_t* vocab) {
  std::string needed;
  for (const nn::InputSpec& in : inputs) needed += (needed.empty() ? "" : ", ") + nn::input_str(in);
  const std::string offer = "data '" + dataset +
                            "' gives the inputs idx and (optionally) targets, i64 [batch, T] with "
                            "batch dim 0 and token ids " +
                            ids + "; the model needs ";
  HAP_CHECK(inputs.size() == 1 || inputs.size() == 2, offer, needed);
  *with_targets = inputs.size() == 2;
  int64_t T = -1;
  for (const std::string name : {"idx", "targets"}) {
    if (name == "targets" && !*with_targets) break;
    auto it = std::find_if(inputs.begin(), inputs.end(),
                           [&](const nn::InputSpec& s) { return s.name == name; });
    HAP_CHECK(it != inputs.end(), offer, needed);
    HAP_CHECK(it->dtype == DType::I64 && it->shape.size() == 2 && it->batch_dim == 0, offer,
              needed);
    HAP_CHECK(T < 0 || it->shape[1] == T, offer, needed);
    T = it->shape[1];
    if (name == "idx") *vocab = it->num_classes;
  }
  return T;
}

DatasetEntry bytes_dataset_entry() {
  DatasetEntry e;
  e.name = "bytes";
  e.summary = "byte-level text corpus: every byte a token (inputs idx, targets)";
  e.options = {
      nn::OptionSpec::string("path", std::nullopt, "a text file or a directory of text files"),
      nn::OptionSpec::number("val_fraction", 0.1, 0.0, 1.0,
                             "share of the corpus held out for evaluation")
          .min_open()
          .max_open(),
  };
  e.open = [](const nn::Options& o, const std::vector<nn::InputSpec>& inputs,
              uint64_t seed) -> std::shared_ptr<Dataset> {
    bool with_targets = true;
    int64_t vocab = 0;
    const int64_t T = token_window_length(inputs, "bytes", "in [0, 256)", &with_targets, &vocab);
    HAP_CHECK(vocab == 0 || vocab >= 256,
              "data 'bytes': byte tokens need a vocabulary of at least ", "256, the model has ",
              vocab, " (set model.vocab_size >= 256)");
    const std::string& path = o.string("path");
    return std::make_shared<ByteDataset>(TextCorpus::load(path, o.number("val_fraction"), T), path,
                                         T, seed, with_targets);
  };
  return e;
}

}  // namespace hap::train
