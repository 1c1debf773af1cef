// Fuzzes the byte corpus reader, hap::train::TextCorpus::load (train/text_corpus.h). The input's
// first byte chooses seq_len (1 to 64), its second the validation fraction (0 to 255/256); the
// rest is the corpus file. A corpus that loads is split, and windows of both splits are drawn
// as the "bytes" dataset does: every window byte must come from its split.
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/harness.h"
#include "train/text_corpus.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::int64_t seq_len = 1 + data[0] % 64;
  const double val_fraction = data[1] / 256.0;
  hap::fuzz::read_input("corpus.txt", data + 2, size - 2, [&](const std::string& path) {
    const hap::train::TextCorpus corpus = hap::train::TextCorpus::load(path, val_fraction, seq_len);
    if (corpus.total_bytes() != static_cast<std::int64_t>(size - 2)) {
      hap::fuzz::property_failed("a corpus that does not hold every byte of its file");
    }
    for (hap::train::Split split : {hap::train::Split::kTrain, hap::train::Split::kVal}) {
      const hap::train::TextWindows w = corpus.batch(split, seq_len, /*seed=*/size, 1, 0, 3);
      std::bitset<256> in_split;
      for (std::uint8_t b : corpus.split(split)) in_split.set(b);
      const std::int64_t* idx = w.idx.data<std::int64_t>();
      for (std::int64_t i = 0; i < w.idx.numel(); ++i) {
        if (idx[i] < 0 || idx[i] > 255 || !in_split.test(static_cast<std::size_t>(idx[i]))) {
          hap::fuzz::property_failed("a window byte that is not in its split");
        }
      }
    }
  });
  return 0;
}
