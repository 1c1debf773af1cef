// Input files never block a reader or make it read without end: a FIFO, a device or an oversized
// file given as config, cluster, plan, checkpoint or corpus is refused at once, naming the path.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/input_file.h"
#include "models/serialize.h"
#include "tests/test_util.h"
#include "train/cluster_config.h"
#include "train/config.h"
#include "train/output_path.h"
#include "train/text_corpus.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;

struct Scratch {
  fs::path dir = fs::temp_directory_path() / ("hap_input_files_" + std::to_string(::getpid()));
  Scratch() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Scratch() { fs::remove_all(dir); }
  std::string fifo() const {
    const fs::path p = dir / "fifo";
    if (!fs::exists(p)) {
      EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
    }
    return p.string();
  }
};

TEST(InputFiles, ReasonsNameWhatThePathIs) {
  Scratch s;
  std::ofstream(s.dir / "ok.txt") << "12345";
  int64_t bytes = 0;
  EXPECT_EQ(unreadable_reason((s.dir / "ok.txt").string(), 10, &bytes), "");
  EXPECT_EQ(bytes, 5);
  EXPECT_EQ(unreadable_reason((s.dir / "ok.txt").string(), 4),
            "has 5 bytes, more than the limit of 4");
  EXPECT_EQ(unreadable_reason((s.dir / "none").string(), 10), "does not exist");
  EXPECT_EQ(unreadable_reason(s.dir.string(), 10), "is a directory");
  EXPECT_EQ(unreadable_reason(s.fifo(), 10), "is not a regular file (a FIFO, device or socket)");
  EXPECT_EQ(unreadable_reason("/dev/zero", 10), "is not a regular file (a FIFO, device or socket)");
}

TEST(InputFiles, EveryReaderRefusesAFifoOrADeviceAtOnce) {
  Scratch s;
  const std::string fifo = s.fifo();
  EXPECT_HAS(test_util::error_of([&] { load_run_config(fifo, {}); }),
             "cannot read the config file: it is not a regular file");
  EXPECT_HAS(test_util::error_of([&] { load_cluster_config(fifo); }),
             "cannot read the cluster file: it is not a regular file");
  EXPECT_HAS(test_util::error_of([&] { load_tensors(fifo); }), "it is not a regular file");
  for (const std::string& corpus : {fifo, std::string("/dev/zero")})
    EXPECT_HAS(test_util::error_of([&] { TextCorpus::load(corpus, 0.1, 8); }),
               "data.path: '" + corpus + "' is not a regular file");
}

TEST(InputFiles, AConfigLargerThanItsLimitIsRefusedWithTheLimit) {
  Scratch s;
  const fs::path big = s.dir / "big.yaml";
  {
    std::ofstream out(big);
    const std::string comment = "# " + std::string(1021, 'x') + "\n";
    for (int64_t written = 0; written <= kMaxConfigBytes; written += 1024) out << comment;
  }
  EXPECT_HAS(test_util::error_of([&] { load_run_config(big.string(), {}); }),
             "more than the limit of " + std::to_string(kMaxConfigBytes));
}

// An output path relative to the current folder whose folders do not exist yet: they are made
// (train.log_file, train.checkpoint_dir), so it is writable with create_parents.
TEST(InputFiles, ARelativeOutputPathWithNewFoldersIsWritable) {
  Scratch s;
  const fs::path before = fs::current_path();
  fs::current_path(s.dir);
  EXPECT_EQ(unwritable_reason("runs/sub/run.jsonl", /*create_parents=*/true), "");
  EXPECT_EQ(unwritable_reason("runs/sub/run.jsonl"), "the folder 'runs/sub' does not exist");
  std::ofstream("plain") << "x";
  EXPECT_EQ(unwritable_reason("plain/run.jsonl", true), "'plain' is not a directory");
  fs::current_path(before);
}

// A huge value quoted in an error is cut: the message keeps the key and the end, and says how
// much was cut.
TEST(InputFiles, AHugeValueIsQuotedCutShort) {
  EXPECT_EQ(cut_message("short", 2000), "short");
  const std::string cut = cut_message("key: got '" + std::string(5000, 'x') + "'", 300);
  EXPECT_LT(cut.size(), 360u);
  EXPECT_EQ(cut.rfind("key: got 'xxx", 0), 0u);
  EXPECT_HAS(cut, "characters cut ...]");
  EXPECT_EQ(cut.back(), '\'');
  Scratch s;
  std::ifstream in(std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("name: gpt");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 9, "name: " + std::string(3'000'000, 'g'));
  std::ofstream(s.dir / "huge.yaml") << text;
  const std::string out = (s.dir / "err.txt").string();
  const int rc = std::system(
      (std::string(HAP_TRAIN_BIN) + " --config " + (s.dir / "huge.yaml").string() + " 2> " + out)
          .c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 2) << rc;
  std::ifstream err(out);
  const std::string message((std::istreambuf_iterator<char>(err)),
                            std::istreambuf_iterator<char>());
  EXPECT_LT(message.size(), 2200u);
  EXPECT_HAS(message, "model.name: expected one of");
  EXPECT_HAS(message, "characters cut");
}

}  // namespace
}  // namespace hap::train
