// Labelled images for classification models: the CIFAR-10 binary format, or a deterministic
// synthetic set when no path is given. Either way the dataset "images" gives the inputs "images"
// (f32 [batch, C, H, W], batch dim 0) and "labels" (i64 [batch], class indices).
//
// CIFAR-10 binary (https://www.cs.toronto.edu/~kriz/cifar.html): records of 1 label byte and
// 3072 pixel bytes (32 x 32 red, then green, then blue, rows top to bottom). `path` is one such
// file or a directory holding data_batch_*.bin (the training split, files in name order) and,
// when present, test_batch.bin (the validation split; without it the last `val_fraction` of the
// training records is held out). Pixels are scaled to [0, 1] and normalised with CIFAR-10's
// per-channel mean and standard deviation.
//
// Synthetic images (no path): example i of a split has a class drawn from (seed, i) and is that
// class's pattern (a colour sinusoid whose frequency and phase depend on the class) plus Gaussian
// noise: learnable, the same on every rank, for any channel count and image size.
//
// Training batches visit the examples in a fresh permutation each epoch (drawn from the seed and
// the epoch); validation batches read the examples in order. Row r of batch s is the same on
// every rank, so a rank reads only its own rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/dataset.h"

namespace hap::train {

inline constexpr std::int64_t kCifarImageBytes = 3 * 32 * 32;
inline constexpr std::int64_t kCifarRecordBytes = 1 + kCifarImageBytes;

// Records of CIFAR-10 binary files: labels and pixels side by side.
struct CifarRecords {
  std::vector<std::uint8_t> labels;  // one per record
  std::vector<std::uint8_t> pixels;  // kCifarImageBytes per record
  std::int64_t size() const { return static_cast<std::int64_t>(labels.size()); }
};

// Reads `files` in order. Throws hap::Error naming the file when one cannot be read, is empty or
// is not a whole number of 3073-byte records, or holds a label >= num_classes (with its record).
CifarRecords read_cifar(const std::vector<std::string>& files, std::int64_t num_classes);

// The dataset "images": options path (empty: synthetic), val_fraction, augment (random crops with
// 4 pixels of padding and horizontal flips on the training split), synthetic_size, and
// synthetic_noise.
DatasetEntry images_dataset_entry();

}  // namespace hap::train
