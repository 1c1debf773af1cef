// Datasets: where a model's inputs come from. A Dataset hands out rows of numbered global batches,
// and any rank reads only its own rows: batch `index`, rows [row_begin, row_end) are the same
// values whoever reads them, so a rank holding rows 5..9 of a batch never touches rows 0..4 and
// the distributed program sees exactly the single-process batch.
//
// Datasets are registered by name with typed options, like models (models/zoo.h): a run config's
// `data.name` selects one (default "bytes", the byte-level text corpus of train/text_corpus.h).
// A program may also implement Dataset itself and pass it to train::Trainer directly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/options.h"

namespace hap::train {

enum class Split { kTrain, kVal };

class Dataset {
 public:
  virtual ~Dataset() = default;

  // Rows [row_begin, row_end) of batch `index` of `split`: one tensor per input the dataset was
  // opened for, holding those rows along the input's batch dimension and all of its other
  // dimensions. Training step s reads batch s of the train split; an evaluation reads batches
  // 0, 1, ... of the validation split. 0 <= row_begin <= row_end <= the batch size.
  virtual nn::Batch read(Split split, std::uint64_t index, std::int64_t row_begin,
                         std::int64_t row_end) const = 0;

  // One line saying what the data is, for the start of a run.
  virtual std::string describe() const = 0;
};

struct DatasetEntry {
  std::string name;     // the value of data.name
  std::string summary;  // one line, for listings
  std::vector<nn::OptionSpec> options;
  // Opens the data for a model's declared inputs (their global shapes for the run's batch size);
  // `seed` orders the batches. Throws hap::Error when the data cannot be read, or cannot give
  // those inputs (naming the input, and what the dataset gives instead).
  std::function<std::shared_ptr<Dataset>(
      const nn::Options& options, const std::vector<nn::InputSpec>& inputs, std::uint64_t seed)>
      open;
};

// The entry called `name`; throws hap::Error listing the registered names.
const DatasetEntry& find_dataset(const std::string& name);
std::vector<std::string> dataset_names();
void register_dataset(DatasetEntry entry);

// Opens a dataset after checking `options` against the entry (what a program does without a
// config file).
std::shared_ptr<Dataset> open_dataset(const DatasetEntry& entry, const nn::Options& options,
                                      const std::vector<nn::InputSpec>& inputs, std::uint64_t seed);

}  // namespace hap::train
