// The byte corpus: what it reads, how batches are drawn, and the errors for bad data.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "train/text_corpus.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& tag) {
  fs::path p = fs::temp_directory_path() / ("hap_data_" + tag + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(TextCorpus, ReadsADirectoryInNameOrderSkippingIndexesAndSymlinks) {
  fs::path d = scratch("dir");
  write(d / "b.txt", std::string(50, 'b'));
  write(d / "a.txt", std::string(50, 'a'));
  write(d / "a.dat", "binary index");
  fs::create_symlink(d / "a.txt", d / "a.u8");
  TextCorpus c = TextCorpus::load(d.string(), 0.5, 8);
  EXPECT_EQ(c.num_files(), 2);
  EXPECT_EQ(c.total_bytes(), 100);
  EXPECT_EQ(c.split(Split::kTrain), std::vector<uint8_t>(50, 'a'));
  EXPECT_EQ(c.split(Split::kVal), std::vector<uint8_t>(50, 'b'));
  fs::remove_all(d);
}

TEST(TextCorpus, TargetsAreTheNextBytesAndRowsDependOnlyOnTheirIndex) {
  fs::path d = scratch("rows");
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  write(d / "t.txt", text);
  TextCorpus c = TextCorpus::load((d / "t.txt").string(), 0.2, 16);
  TextWindows whole = c.batch(Split::kTrain, 16, 7, 3, 0, 8);
  TextWindows part = c.batch(Split::kTrain, 16, 7, 3, 5, 8);  // rows 5..7 read alone
  std::vector<double> wi = whole.idx.to_vector(), wt = whole.targets.to_vector(),
                      pi = part.idx.to_vector();
  for (int r = 0; r < 8; ++r)
    for (int t = 0; t < 16; ++t) {
      if (t + 1 < 16) {
        EXPECT_EQ(wt[r * 16 + t], wi[r * 16 + t + 1]);
      }
      int next = static_cast<int>(wi[r * 16 + t]) - 'a';
      EXPECT_EQ(static_cast<int>(wt[r * 16 + t]) - 'a', (next + 1) % 26);
    }
  for (int i = 0; i < 3 * 16; ++i) EXPECT_EQ(pi[i], wi[5 * 16 + i]);
  TextWindows other_step = c.batch(Split::kTrain, 16, 7, 4, 0, 8);
  EXPECT_NE(other_step.idx.to_vector(), wi);
  fs::remove_all(d);
}

TEST(TextCorpus, MissingPathNamesThePathAndThePackage) {
  std::string m = message_of([] { TextCorpus::load("/nonexistent/corpus", 0.1, 8); });
  EXPECT_NE(m.find("'/nonexistent/corpus' does not exist"), std::string::npos) << m;
  EXPECT_NE(m.find("fortunes"), std::string::npos) << m;
}

TEST(TextCorpus, EmptyCorpusIsAnError) {
  fs::path d = scratch("empty");
  write(d / "e.txt", "");
  std::string m = message_of([&] { TextCorpus::load(d.string(), 0.1, 8); });
  EXPECT_NE(m.find("is empty"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(TextCorpus, CorpusShorterThanOneSequenceIsAnError) {
  fs::path d = scratch("short");
  write(d / "s.txt", std::string(30, 'x'));
  std::string m = message_of([&] { TextCorpus::load(d.string(), 0.5, 16); });
  EXPECT_NE(m.find("has 30 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("at least seq_len + 1 = 17 bytes"), std::string::npos) << m;
  fs::remove_all(d);
}

}  // namespace
}  // namespace hap::train
