// Byte-level text corpus: every byte is a token (vocabulary 256). Batches are windows of the
// train or validation split at offsets drawn from the counter-based RNG, so row r of the batch of
// step s is the same on every rank and any rank can read only its own rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "train/dataset.h"

namespace hap::train {

struct TextWindows {
  Tensor idx;      // i64 [rows, T]
  Tensor targets;  // i64 [rows, T]: idx shifted by one
};

// Rows [row_begin, row_end) of batch `step` of windows of seq_len tokens of `data` (with their
// next tokens as targets), at offsets drawn from the counter-based RNG by (seed, split, step, row):
// the same rows whoever reads them. data.size() > seq_len.
template <typename Token>
TextWindows sample_windows(const std::vector<Token>& data, Split s, int64_t seq_len, uint64_t seed,
                           uint64_t step, int64_t row_begin, int64_t row_end);

// The window length T a language model's inputs ask of a token dataset (`dataset` names it in
// messages): idx and, unless the model makes its own (a masked LM), targets, i64 [batch, T] with
// batch dim 0. *vocab is idx's declared number of classes (0: not declared). Throws naming what
// the model needs and what the dataset gives.
int64_t token_window_length(const std::vector<nn::InputSpec>& inputs, const std::string& dataset,
                            const std::string& ids, bool* with_targets, int64_t* vocab);

class TextCorpus {
 public:
  // `path` is a text file or a directory whose regular files (not symlinks, not *.dat) are
  // concatenated in name order. The last `val_fraction` of the bytes is the validation split.
  // Throws hap::Error when the path is missing, the corpus is empty, or a split is shorter than
  // one sequence of seq_len + 1 bytes.
  static TextCorpus load(const std::string& path, double val_fraction, int64_t seq_len);

  const std::vector<uint8_t>& split(Split s) const { return s == Split::kTrain ? train_ : val_; }
  int64_t num_files() const { return num_files_; }
  int64_t total_bytes() const { return static_cast<int64_t>(train_.size() + val_.size()); }

  // Rows [row_begin, row_end) of the global batch of `batch_rows` windows of length seq_len,
  // for the given step (the RNG stream).
  TextWindows batch(Split s, int64_t seq_len, uint64_t seed, uint64_t step, int64_t row_begin,
                    int64_t row_end) const;

 private:
  std::vector<uint8_t> train_, val_;
  int64_t num_files_ = 0;
};

// The dataset "bytes": a TextCorpus (options `path`, `val_fraction`) giving the inputs "idx"
// (tokens) and "targets" (the next tokens), i64 [batch, T] with batch dim 0 and at least 256
// classes: the window length T comes from the model's declared shape.
DatasetEntry bytes_dataset_entry();

}  // namespace hap::train
