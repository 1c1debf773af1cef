// Pre-tokenized corpora in llm.c's shard layout, so that a run trains on the same files llm.c and
// nanoGPT-style pipelines write (for example fineweb_train_000001.bin): a header of 256
// little-endian int32 (magic 20240520, version 1, the number of tokens N), then N uint16 token
// ids. Batches are windows drawn exactly as for the byte corpus (train/text_corpus.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/dataset.h"

namespace hap::train {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 256 * 4;
// At most this many tokens per shard (llm.c's header holds the count as an int32).
inline constexpr int64_t kTokenShardMaxTokens = (int64_t{1} << 31) - 1;

// The tokens of one shard file, checked: a regular file, the header's magic and version, a size of
// exactly the header plus N uint16. Throws hap::Error naming the file and what is wrong.
std::vector<uint16_t> read_token_shard(const std::string& path);

// Writes a shard (for tests and converters).
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// The tokens of a shard file, or of a directory's *.bin shards concatenated in name order.
// `key` names the option in messages (data.path, data.val_path).
std::vector<uint16_t> read_token_shards(const std::string& path, const std::string& key,
                                        int64_t* num_files);

// The dataset "tokens": options `path` (a shard or a folder of shards: the training split),
// `val_path` (the same for the validation split; without it the last `val_fraction` of the
// tokens), giving the inputs "idx" and "targets". Every token id must lie below the model's
// vocabulary (its idx input's number of classes).
DatasetEntry tokens_dataset_entry();

}  // namespace hap::train
