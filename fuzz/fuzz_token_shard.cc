// Fuzzes the token shard reader, hap::train::read_token_shard (train/token_data.h; llm.c's
// layout). The tokens of a shard that reads are then cut into training windows, as the "tokens"
// dataset does: every target must be the token after its input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/harness.h"
#include "train/text_corpus.h"
#include "train/token_data.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  hap::fuzz::read_input("shard.bin", data, size, [](const std::string& path) {
    const std::vector<std::uint16_t> tokens = hap::train::read_token_shard(path);
    if (tokens.size() < 2) return;
    const auto seq_len = static_cast<std::int64_t>(std::min<std::size_t>(tokens.size() - 1, 8));
    const hap::train::TextWindows w = hap::train::sample_windows(
        tokens, hap::train::Split::kTrain, seq_len, /*seed=*/tokens.size(), /*step=*/1, 0, 3);
    const std::int64_t* idx = w.idx.data<std::int64_t>();
    const std::int64_t* targets = w.targets.data<std::int64_t>();
    for (std::int64_t i = 0; i + 1 < w.idx.numel(); ++i) {
      if ((i + 1) % seq_len != 0 && targets[i] != idx[i + 1]) {
        hap::fuzz::property_failed("a token window whose targets are not its next tokens");
      }
    }
  });
  return 0;
}
