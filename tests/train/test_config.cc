// The typed run config: the shipped files load with the documented values, --set overrides apply,
// and every kind of bad input gives one message naming the file, the key, the value and the
// expectation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/engine.h"
#include "yaml_file_test.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;

std::string shipped(const std::string& name) {
  return std::string(HAP_SOURCE_DIR) + "/configs/" + name;
}

// A valid run, small enough to read in a test; each bad-input test breaks one line of it.
constexpr const char* kValidRun = R"(model:
  block_size: 64
  seq_len: 64
  n_layer: 2
  n_head: 2
  n_embd: 32
data:
  path: corpus.txt
train:
  batch_size: 4
  steps: 10
  optimizer: sgd
  lr: 0.1
)";

// Writes YAML files into a per-test directory and removes it afterwards.
class ConfigFileTest : public YamlFileTest {
 protected:
  std::string write(const std::string& text, const std::string& name = "run.yaml") const {
    return YamlFileTest::write(text, name);
  }

  // The valid document with the first occurrence of `from` replaced by `to`.
  static std::string edited(const std::string& from, const std::string& to) {
    return replace_first(kValidRun, from, to);
  }
};

// The message of the ConfigError that loading throws; fails the test when nothing is thrown.
std::string load_error(const std::string& path, const std::vector<ConfigOverride>& overrides = {}) {
  try {
    load_run_config(path, overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading " << path << " did not throw a ConfigError";
  return "";
}

void expect_contains(const std::string& message, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts)
    EXPECT_NE(message.find(part), std::string::npos)
        << "message lacks \"" << part << "\":\n  " << message;
}

// A config cut short at any byte inside a line (a copy or write interrupted) is refused: it
// no longer ends with a newline, and a value cut mid-line ("steps: 2" of "steps: 20") would read
// as another valid value. (A cut exactly after a newline is a shorter valid file: it is caught
// only when it drops a required key or section; docs/architecture.md, "Input files".)
TEST_F(ConfigFileTest, AConfigCutShortInsideALineIsRefused) {
  std::ifstream in(shipped("gpt-tiny.yaml"));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  ASSERT_GT(text.size(), 100u);
  int refused = 0, line_ends = 0;
  for (size_t cut = 1; cut < text.size(); ++cut) {
    if (text[cut - 1] == '\n') {
      ++line_ends;
      continue;
    }
    const std::string path = write(text.substr(0, cut));
    const std::string message = load_error(path);
    EXPECT_NE(message.find("does not end with a newline: it looks cut short (truncated)"),
              std::string::npos)
        << "cut after byte " << cut << ": " << message;
    ++refused;
  }
  EXPECT_GT(refused, 20 * line_ends) << "nearly every cut is inside a line";
  expect_contains(load_error(write("model:\n  name: gpt\ntrain:\n  steps: 2")),
                  {"run.yaml", "in its last line \"  steps: 2\""});
}

TEST(ShippedConfig, GptLoadsWithTheDocumentedValues) {
  const RunConfig c = load_run_config(shipped("gpt.yaml"), {});
  EXPECT_EQ(c.source_file, shipped("gpt.yaml"));
  EXPECT_EQ(c.model.name, "gpt");
  EXPECT_EQ(c.model.options.integer("vocab_size"), 256);
  EXPECT_EQ(c.model.options.integer("block_size"), 128);
  EXPECT_EQ(c.model.options.integer("n_layer"), 4);
  EXPECT_EQ(c.model.options.integer("n_head"), 4);
  EXPECT_EQ(c.model.options.integer("n_embd"), 128);
  EXPECT_EQ(c.model.options.number("dropout"), 0.0);
  EXPECT_TRUE(c.model.options.boolean("bias"));
  EXPECT_EQ(c.data.options.string("path"), "/usr/share/games/fortunes");
  EXPECT_DOUBLE_EQ(c.data.options.number("val_fraction"), 0.1);
  EXPECT_EQ(c.train.batch_size, 16);
  EXPECT_EQ(c.model.options.integer("seq_len"), 128);
  EXPECT_EQ(c.train.steps, 400);
  EXPECT_EQ(c.train.optimizer, Optimizer::kAdamW);
  EXPECT_EQ(c.train.precision, DType::F32);  // not in the file: f32
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.train.min_lr, 1e-4);
  EXPECT_EQ(c.train.warmup_steps, 20);
  EXPECT_DOUBLE_EQ(c.train.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.train.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.train.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.train.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.train.seed, 1337u);
  EXPECT_EQ(c.train.log_every, 10);
  EXPECT_EQ(c.train.eval_every, 100);
  EXPECT_EQ(c.train.eval_batches, 8);
  EXPECT_EQ(c.train.log_file, "runs/gpt.jsonl");
  EXPECT_EQ(c.train.threads, 0);
  EXPECT_EQ(c.train.device, Device::cpu());
}

TEST(ShippedConfig, TheTrainingDeviceIsCpuCudaOrCudaN) {
  EXPECT_EQ(load_run_config(shipped("gpt-tiny.yaml"), {"train.device=cuda"}).train.device,
            Device::cuda(0));
  EXPECT_EQ(load_run_config(shipped("gpt-tiny.yaml"), {"train.device=cuda:3"}).train.device,
            Device::cuda(3));
  EXPECT_EQ(load_run_config(shipped("gpt-tiny.yaml"), {"train.device=cpu"}).train.device,
            Device::cpu());
  for (const char* bad : {"cuda:", "cuda:1x", "CUDA", "cuda:+1", "cpu:0", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(parse_device(bad).has_value());
  }
}

TEST(ShippedConfig, GptTinyIsASmallVariant) {
  const RunConfig c = load_run_config(shipped("gpt-tiny.yaml"), {});
  EXPECT_EQ(c.model.options.integer("n_layer"), 2);
  EXPECT_EQ(c.model.options.integer("n_embd"), 32);
  EXPECT_EQ(c.model.options.integer("n_head"), 2);
  EXPECT_EQ(c.model.options.integer("block_size"), 32);
  EXPECT_EQ(c.train.batch_size, 4);
  EXPECT_EQ(c.model.options.integer("seq_len"), 32);
  EXPECT_EQ(c.train.steps, 20);
  EXPECT_EQ(c.train.log_file, "");
}

TEST(ShippedConfig, SetOverridesTakeEffect) {
  const RunConfig c = load_run_config(
      shipped("gpt.yaml"),
      {"train.steps=7", "train.warmup_steps=2", "train.optimizer=sgd", "model.bias=false",
       "train.lr=0.5", "train.min_lr=0", "data.path=other dir/corpus.txt", "train.log_file="});
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.warmup_steps, 2);
  EXPECT_EQ(c.train.min_lr, 0.0);
  EXPECT_EQ(c.train.optimizer, Optimizer::kSgd);
  EXPECT_FALSE(c.model.options.boolean("bias"));
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
  EXPECT_EQ(c.data.options.string("path"), "other dir/corpus.txt");
  EXPECT_EQ(c.train.log_file, "");
  EXPECT_EQ(c.train.batch_size, 16) << "keys without an override keep the file's value";
}

TEST(ShippedConfig, TheLastOverrideOfAKeyWins) {
  const RunConfig c = load_run_config(shipped("gpt.yaml"), {"train.steps=70", "train.steps=90"});
  EXPECT_EQ(c.train.steps, 90);
}

TEST(ShippedConfig, ErrorMessageHasTheDocumentedFormat) {
  const std::string path = shipped("gpt.yaml");
  EXPECT_EQ(load_error(path, {"train.steps=0"}),
            path +
                ": train.steps: expected an integer >= 1, got 0"
                " (value from --set train.steps=0)");
}

TEST(ShippedConfig, JsonHasEveryValueUnderItsYamlKey) {
  const RunConfig c = load_run_config(shipped("gpt.yaml"), {});
  const nlohmann::json j = to_json(c);
  EXPECT_EQ(j["source_file"], shipped("gpt.yaml"));
  EXPECT_EQ(j["model"]["name"], "gpt");
  EXPECT_EQ(j["model"]["n_embd"], 128);
  EXPECT_EQ(j["model"]["bias"], true);
  EXPECT_EQ(j["data"]["path"], "/usr/share/games/fortunes");
  EXPECT_EQ(j["train"]["optimizer"], "adamw");
  EXPECT_EQ(j["train"]["precision"], "f32");
  EXPECT_EQ(j["train"]["seed"], 1337u);
  EXPECT_DOUBLE_EQ(j["train"]["min_lr"].get<double>(), 1e-4);
  EXPECT_EQ(j["model"]["seq_len"], 128);
  EXPECT_EQ(j["data"]["name"], "bytes");
  EXPECT_EQ(j["model"].size(), 9u);
  EXPECT_EQ(j["data"].size(), 3u);
  EXPECT_EQ(j["train"].size(), 23u);
  EXPECT_EQ(j["train"]["device"], "cpu");
  EXPECT_EQ(j["train"]["checkpoint_every"], 0);
  EXPECT_EQ(j["train"]["checkpoint_dir"], "");
  EXPECT_EQ(j["train"]["keep_checkpoints"], 3);
}

TEST(ShippedConfig, DescribeSummarisesTheRun) {
  const std::string text = describe(load_run_config(shipped("gpt.yaml"), {}));
  expect_contains(text, {"gpt.yaml", "model: gpt: ", "n_layer 4", "n_embd 128", "seq_len 128",
                         "data:  bytes: path /usr/share/games/fortunes", "400 steps", "16 examples",
                         "adamw", "runs/gpt.jsonl"});
}

// Configs are UTF-8 text (their names and paths end up in JSON logs and plans): a Latin-1 byte
// is refused naming its line and column, in the file and in a --set argument.
TEST_F(ConfigFileTest, TextThatIsNotUtf8IsRefusedNamingWhere) {
  expect_contains(load_error(write(edited("path: corpus.txt", "path: caf\xe9.txt"))),
                  {"run.yaml", "not UTF-8 text: byte 0xe9 at line 8, column 12"});
  expect_contains(load_error(write(kValidRun), {ConfigOverride("data.path=caf\xe9")}),
                  {"data.path", "not UTF-8 text (byte 14)"});
}

// A --set value that yaml-cpp reads as null though it is not spelt null (an indicator first, a
// comment) is refused, as the file's reader refuses it; spelt null, or quoted, it is taken.
TEST_F(ConfigFileTest, SetValuesThatAreNotYamlAreRefusedNotReadAsNull) {
  const std::string run = write(kValidRun);
  for (const std::string value : {",cpu1", ",", "#corpus.txt", " , "})
    expect_contains(load_error(run, {ConfigOverride("data.path=" + value)}),
                    {"data.path", "is not a YAML value", "must be quoted"});
  EXPECT_EQ(load_run_config(run, {ConfigOverride("data.path=\"#corpus.txt\"")})
                .data.options.string("path"),
            "#corpus.txt");
  EXPECT_EQ(load_run_config(run, {ConfigOverride("train.log_file=~")}).train.log_file, "");
}

TEST_F(ConfigFileTest, DefaultsFillOptionalKeys) {
  const RunConfig c = load_run_config(write(kValidRun), {});
  EXPECT_EQ(c.model.options.integer("vocab_size"), 256);
  EXPECT_EQ(c.model.options.number("dropout"), 0.0);
  EXPECT_TRUE(c.model.options.boolean("bias"));
  EXPECT_DOUBLE_EQ(c.data.options.number("val_fraction"), 0.1);
  EXPECT_DOUBLE_EQ(c.train.min_lr, c.train.lr) << "min_lr defaults to lr: no decay";
  EXPECT_EQ(c.train.warmup_steps, 0);
  EXPECT_EQ(c.train.seed, 1337u);
  EXPECT_EQ(c.train.log_file, "");
  EXPECT_EQ(c.data.options.string("path"), "corpus.txt")
      << "paths are kept as written, relative to the cwd";
}

TEST_F(ConfigFileTest, UnknownKeyListsTheValidKeys) {
  const std::string path = write(edited("  batch_size: 4", "  batchsize: 4"));
  expect_contains(load_error(path),
                  {path, "train.batchsize", "unknown key", "valid keys of train: batch_size, steps",
                   "did you mean 'batch_size'?"});
}

TEST_F(ConfigFileTest, UnknownSectionListsTheValidSections) {
  const std::string path = write(std::string(kValidRun) + "optim:\n  lr: 1\n");
  expect_contains(load_error(path), {path, "optim", "unknown section", "model, data, train"});
}

TEST_F(ConfigFileTest, DuplicateKeyIsRejected) {
  const std::string path = write(std::string(kValidRun) + "  steps: 20\n");
  expect_contains(load_error(path), {path, "train.steps", "duplicate key"});
}

TEST_F(ConfigFileTest, WrongTypeQuotesTheValue) {
  const std::string path = write(edited("batch_size: 4", "batch_size: abc"));
  expect_contains(load_error(path), {path, "train.batch_size", "expected an integer, got 'abc'"});
}

TEST_F(ConfigFileTest, IntegerRejectsAFloat) {
  const std::string path = write(edited("steps: 10", "steps: 1.5"));
  expect_contains(load_error(path), {path, "train.steps", "expected an integer, got '1.5'"});
}

TEST_F(ConfigFileTest, IntegerRejectsAQuotedNumber) {
  const std::string path = write(edited("steps: 10", "steps: \"10\""));
  expect_contains(load_error(path), {path, "train.steps", "expected an integer", "'10'", "quotes"});
}

TEST_F(ConfigFileTest, IntegerTooLargeForItsTypeIsOutOfRange) {
  const std::string path = write(edited("steps: 10", "steps: 99999999999999999999"));
  expect_contains(load_error(path), {path, "train.steps", "expected an integer >= 1",
                                     "99999999999999999999", "64-bit"});
}

TEST_F(ConfigFileTest, NegativeSeedIsOutOfRange) {
  const std::string path = write(std::string(kValidRun) + "  seed: -1\n");
  expect_contains(load_error(path), {path, "train.seed", "expected an integer >= 0, got -1"});
}

TEST_F(ConfigFileTest, BooleanAcceptsOnlyTrueOrFalse) {
  const std::string good = write(edited("  n_embd: 32", "  n_embd: 32\n  bias: false"));
  EXPECT_FALSE(load_run_config(good, {}).model.options.boolean("bias"));
  const std::string bad = write(edited("  n_embd: 32", "  n_embd: 32\n  bias: yes"), "bad.yaml");
  expect_contains(load_error(bad), {bad, "model.bias", "expected true or false, got 'yes'"});
}

TEST_F(ConfigFileTest, NumberRejectsText) {
  const std::string path = write(edited("lr: 0.1", "lr: fast"));
  expect_contains(load_error(path), {path, "train.lr", "expected a number, got 'fast'"});
}

TEST_F(ConfigFileTest, EnumListsTheChoices) {
  const std::string path = write(edited("optimizer: sgd", "optimizer: adam"));
  expect_contains(load_error(path),
                  {path, "train.optimizer", "expected one of 'adamw', 'sgd', got 'adam'"});
}

TEST_F(ConfigFileTest, PrecisionIsF32OrBf16) {
  const std::string path = write(edited("optimizer: sgd", "optimizer: sgd\n  precision: bf16"));
  const RunConfig c = load_run_config(path, {});
  EXPECT_EQ(c.train.precision, DType::BF16);
  EXPECT_EQ(to_json(c)["train"]["precision"], "bf16");
  EXPECT_NE(describe(c).find("precision bf16 (mixed: bf16 products, f32 norms, loss and "
                             "parameters)"),
            std::string::npos)
      << describe(c);
  EXPECT_EQ(load_run_config(path, {"train.precision=f32"}).train.precision, DType::F32);
  const std::string bad = write(edited("optimizer: sgd", "optimizer: sgd\n  precision: fp16"));
  expect_contains(load_error(bad),
                  {bad, "train.precision", "expected one of 'f32', 'bf16', got 'fp16'"});
}

TEST_F(ConfigFileTest, SectionThatIsNotAMappingIsRejected) {
  const std::string path = write("model: 3\ndata:\n  path: x\ntrain:\n  steps: 1\n");
  expect_contains(
      load_error(path),
      {path, "model", "expected a mapping with keys name, vocab_size, block_size, seq_len",
       "got '3'"});
}

TEST_F(ConfigFileTest, MissingRequiredKeySaysWhatIsExpected) {
  const std::string path = write(edited("  n_head: 2\n", ""));
  expect_contains(load_error(path), {path, "model.n_head", "missing required key",
                                     "expected an integer in [1, 2147483647]"});
}

TEST_F(ConfigFileTest, MissingRequiredSectionIsReported) {
  const std::string path = write(
      "model:\n  block_size: 8\n  n_layer: 1\n  n_head: 1\n  n_embd: 8\n"
      "data:\n  path: x\n");
  expect_contains(load_error(path), {path, "train", "missing required section"});
}

TEST_F(ConfigFileTest, EmptyRequiredStringIsRejected) {
  const std::string path = write(edited("path: corpus.txt", "path: \"\""));
  expect_contains(load_error(path), {path, "data.path", "expected a non-empty string, got ''"});
}

TEST_F(ConfigFileTest, OutOfRangeValueNamesTheRange) {
  struct Case {
    std::string from, to, key, expectation;
  };
  const std::vector<Case> cases = {
      {"batch_size: 4", "batch_size: 0", "train.batch_size",
       "expected an integer in [1, 2147483647], got 0"},
      {"lr: 0.1", "lr: 0", "train.lr", "expected a number > 0, got 0"},
      {"n_layer: 2", "n_layer: -3", "model.n_layer", "expected an integer in [1, 10000], got -3"},
      {"n_embd: 32", "n_embd: 33", "model.n_embd",
       "expected a multiple of model.n_head = 2, got 33"},
      {"n_embd: 32", "n_embd: 32\n  dropout: 1", "model.dropout",
       "expected a number in [0, 1), got 1"},
      {"n_embd: 32", "n_embd: 32\n  vocab_size: 2147483648", "model.vocab_size",
       "expected an integer in [1, 2147483647], got 2147483648"},
      {"path: corpus.txt", "path: corpus.txt\n  val_fraction: 1.0", "data.val_fraction",
       "expected a number in (0, 1), got 1.0"},
      {"lr: 0.1", "lr: 0.1\n  min_lr: 0.2", "train.min_lr", "expected a number in [0, 0.1]"},
      {"steps: 10", "steps: 10\n  warmup_steps: 11", "train.warmup_steps",
       "expected an integer in [0, 10]"},
      {"lr: 0.1", "lr: 0.1\n  beta2: 1", "train.beta2", "expected a number in [0, 1), got 1"},
      {"lr: 0.1", "lr: 0.1\n  eps: 0", "train.eps", "expected a number > 0, got 0"},
      {"lr: 0.1", "lr: 0.1\n  grad_clip: -1", "train.grad_clip", "expected a number >= 0, got -1"},
      {"lr: 0.1", "lr: 0.1\n  eval_every: 0", "train.eval_every",
       "expected an integer >= 1, got 0"},
      {"lr: 0.1", "lr: 0.1\n  eval_batches: 0", "train.eval_batches",
       "expected an integer >= 1, got 0"},
      {"lr: 0.1", "lr: 0.1\n  threads: -1", "train.threads", "expected an integer >= 0, got -1"},
      {"lr: 0.1", "lr: 0.1\n  device: gpu", "train.device",
       "expected cpu, cuda or cuda:N (N a device index >= 0), got gpu"},
      {"lr: 0.1", "lr: 0.1\n  device: cuda:-1", "train.device", "got cuda:-1"},
      {"lr: 0.1", "lr: 0.1\n  device: cuda:99999999999", "train.device", "got cuda:99999999999"},
  };
  for (const Case& c : cases) {
    const std::string path = write(edited(c.from, c.to));
    SCOPED_TRACE(c.key);
    expect_contains(load_error(path), {path, c.key, c.expectation});
  }
}

TEST_F(ConfigFileTest, SizesAboveTheirLimitsNameTheKeyValueAndLimit) {
  struct Case {
    std::string set, key, expectation;
  };
  const std::vector<Case> cases = {
      {"model.block_size=9223372036854775807", "model.block_size",
       "expected an integer in [1, 2147483647], got 9223372036854775807"},
      {"train.batch_size=9223372036854775807", "train.batch_size",
       "expected an integer in [1, 2147483647], got 9223372036854775807"},
      {"model.n_layer=2147483648", "model.n_layer",
       "expected an integer in [1, 10000], got 2147483648"},
      {"model.n_layer=10001", "model.n_layer", "expected an integer in [1, 10000], got 10001"},
      {"model.n_head=2147483648", "model.n_head", "expected an integer in [1, 2147483647]"},
      {"model.n_embd=4294967296", "model.n_embd", "expected an integer in [1, 2147483647]"},
  };
  const std::string path = write(kValidRun);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.set);
    expect_contains(load_error(path, {c.set}), {path + ": " + c.key + ": ", c.expectation,
                                                "(value from --set " + c.set + ")"});
  }
  EXPECT_EQ(load_run_config(path, {"model.n_layer=10000"}).model.options.integer("n_layer"), 10000);
}

TEST_F(ConfigFileTest, TensorsOfMoreThan2To40ElementsAreRefused) {
  struct Case {
    std::vector<std::string> sets;
    std::string key, expectation;
  };
  const std::vector<Case> cases = {
      {{"train.batch_size=2147483647"},
       "model.n_embd",
       "expected an integer with train.batch_size x model.seq_len x 4 x model.n_embd <= 2^40 (the "
       "elements of the MLP's hidden activation; here 2147483647 x 64 x 4 x 32 = 17592186036224), "
       "got 32"},
      {{"model.vocab_size=2147483647", "train.batch_size=16"},
       "model.vocab_size",
       "train.batch_size x model.seq_len x model.vocab_size <= 2^40 (the elements of the logits"},
      {{"model.n_embd=1048576"},
       "model.n_embd",
       "4 x model.n_embd x model.n_embd <= 2^40 (the elements of an MLP weight"},
      {{"model.block_size=2147483647", "model.n_embd=1024"},
       "model.n_embd",
       "model.block_size x model.n_embd <= 2^40 (the elements of the position embedding; here "
       "2147483647 x 1024"},
      {{"model.vocab_size=2147483647", "model.n_embd=1024"},
       "model.n_embd",
       "model.vocab_size x model.n_embd <= 2^40 (the elements of the token embedding"},
  };
  const std::string path = write(kValidRun);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.sets.back());
    expect_contains(load_error(path, {c.sets.begin(), c.sets.end()}),
                    {path + ": " + c.key + ": ", c.expectation});
  }
}

TEST_F(ConfigFileTest, AGpt3SizedRunIsWithinTheLimits) {
  const RunConfig c = load_run_config(
      write(kValidRun),
      {"model.vocab_size=50257", "model.block_size=2048", "model.n_layer=96", "model.n_head=96",
       "model.n_embd=12288", "train.batch_size=1536", "model.seq_len=2048"});
  EXPECT_EQ(c.model.options.integer("n_embd"), 12288);
  EXPECT_EQ(c.train.batch_size, 1536);
}

TEST_F(ConfigFileTest, SeqLenLongerThanBlockSizeIsRejected) {
  const std::string path = write(edited("seq_len: 64", "seq_len: 65"));
  expect_contains(load_error(path),
                  {path, "model.seq_len", "expected an integer in [0, model.block_size = 64]",
                   "positions past block_size", "got 65"});
}

TEST_F(ConfigFileTest, TheMovedKeyTrainSeqLenSaysWhereItWent) {
  const std::string path = write(edited("  steps: 10", "  steps: 10\n  seq_len: 64"));
  expect_contains(load_error(path), {path, "train.seq_len", "moved to model.seq_len"});
  expect_contains(load_error(write(kValidRun, "b.yaml"), {"train.seq_len=8"}),
                  {"train.seq_len", "--set train.seq_len=8", "moved to model.seq_len"});
}

TEST_F(ConfigFileTest, AnUnknownModelNameListsTheRegisteredModels) {
  const std::string path = write(kValidRun);
  expect_contains(load_error(path, {"model.name=gtp"}),
                  {path, "model.name", "expected one of 'bert', 'bert_moe', 'gpt', 'vgg19', 'vit'",
                   "got 'gtp'"});
  expect_contains(load_error(path, {"data.name=imagez"}),
                  {path, "data.name", "expected one of 'bytes', 'images'", "got 'imagez'"});
}

TEST_F(ConfigFileTest, AModelKeyOfAnotherModelIsAnUnknownKeyOfThisOne) {
  const std::string path = write(kValidRun);
  expect_contains(load_error(path, {"model.n_layr=3"}),
                  {path, "model.n_layr", "unknown key", "valid keys of model: name, vocab_size",
                   "did you mean 'n_layer'?", "(value from --set model.n_layr=3)"});
}

TEST_F(ConfigFileTest, YamlSyntaxErrorGivesLineAndColumn) {
  const std::string path = write("model:\n  n_layer: [1, 2\ndata: x\n");
  expect_contains(load_error(path), {path, "YAML syntax error at line 3, column"});
}

TEST_F(ConfigFileTest, ATabInTheIndentationIsNamed) {
  const std::string path = write(edited("  n_layer: 2", "\tn_layer: 2"));
  expect_contains(load_error(path),
                  {path, "YAML syntax error", "line 4 is indented with a tab", "spaces only"});
}

TEST_F(ConfigFileTest, MissingFileIsReported) {
  const std::string path = (dir_ / "absent.yaml").string();
  expect_contains(load_error(path), {path, "cannot read the config file", "No such file"});
}

TEST_F(ConfigFileTest, DirectoryInsteadOfFileIsReported) {
  expect_contains(load_error(dir_.string()), {dir_.string(), "is a directory"});
}

TEST_F(ConfigFileTest, SetWithoutKeyAndValueIsRejected) {
  const std::string path = write(kValidRun);
  for (const std::string bad : {"train.steps", "steps=7", ".steps=7", "train.=7", "=7"})
    expect_contains(load_error(path, {bad}),
                    {path, "--set " + bad + ": expected section.key=value", "got '" + bad + "'"});
}

TEST_F(ConfigFileTest, SetOfUnknownKeyIsRejected) {
  const std::string path = write(kValidRun);
  expect_contains(load_error(path, {"train.stpes=7"}),
                  {path, "train.stpes", "--set train.stpes=7", "unknown key", "valid keys of train",
                   "did you mean 'steps'?"});
  expect_contains(load_error(path, {"optim.lr=1"}),
                  {path, "optim.lr", "unknown section 'optim'", "model, data, train"});
}

TEST_F(ConfigFileTest, SetWithABadValueSaysItCameFromSet) {
  const std::string path = write(kValidRun);
  expect_contains(load_error(path, {"train.steps=many"}),
                  {path, "train.steps", "expected an integer, got 'many'",
                   "value from --set train.steps=many"});
  expect_contains(load_error(path, {"model.dropout=1.5"}),
                  {path, "model.dropout", "expected a number in [0, 1), got 1.5",
                   "value from --set model.dropout=1.5"});
}

TEST_F(ConfigFileTest, AnOverrideFromAnAppOptionNamesThatOption) {
  const std::string path = write(kValidRun);
  const std::string message =
      load_error(path, {ConfigOverride("parallel.strategy=foo", "--strategy foo")});
  expect_contains(message, {path + ": parallel.strategy: expected one of", "got 'foo'",
                            "(value from --strategy foo)"});
  EXPECT_EQ(message.find("--set"), std::string::npos) << message;
  expect_contains(load_error(path, {ConfigOverride("train.stpes=7", "--steps 7")}),
                  {"--steps 7: unknown key"});
}

TEST_F(ConfigFileTest, SetCanProvideAKeyTheFileLacks) {
  const std::string path = write(edited("  n_head: 2\n", ""));
  EXPECT_EQ(load_run_config(path, {"model.n_head=4"}).model.options.integer("n_head"), 4);
}

TEST_F(ConfigFileTest, SetThatBreaksACrossKeyRuleIsRejected) {
  const std::string path = write(kValidRun);
  expect_contains(
      load_error(path, {"model.block_size=32"}),
      {path, "model.seq_len", "expected an integer in [0, model.block_size = 32]", "got 64"});
}

}  // namespace
}  // namespace hap::train

namespace hap::train {
namespace {

TEST(ParallelSection, IsOptionalAndDefaultsToHapPerBlock) {
  RunConfig c = load_run_config(std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml", {});
  EXPECT_EQ(c.parallel.strategy, synth::Strategy::Hap);
  EXPECT_EQ(c.parallel.segments, synth::SegmentMode::PerBlock);
}

TEST(ParallelSection, SetChoosesTheStrategyAndBadValuesNameTheChoices) {
  std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt.yaml";
  RunConfig c = load_run_config(path, {"parallel.strategy=dp-cp", "parallel.segments=single"});
  EXPECT_EQ(c.parallel.strategy, synth::Strategy::DpCp);
  EXPECT_EQ(c.parallel.segments, synth::SegmentMode::Single);
  try {
    load_run_config(path, {"parallel.strategy=zero"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("parallel.strategy: expected one of 'hap', 'dp-ev', 'dp-cp', 'tp', 'dp-ep', "
                     "got 'zero'"),
              std::string::npos)
        << m;
  }
}

TEST(ParallelSection, TheBackendIsAutoNcclOrMpi) {
  const std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  EXPECT_EQ(load_run_config(path, {}).parallel.backend, CommBackend::kAuto);
  EXPECT_EQ(load_run_config(path, {"parallel.backend=nccl"}).parallel.backend, CommBackend::kNccl);
  const RunConfig c = load_run_config(path, {"parallel.backend=mpi"});
  EXPECT_EQ(c.parallel.backend, CommBackend::kMpi);
  EXPECT_EQ(to_json(c)["parallel"]["backend"], "mpi");
  EXPECT_NE(load_error(path, {"parallel.backend=gloo"})
                .find("parallel.backend: expected one of 'auto', 'nccl', 'mpi', got 'gloo'"),
            std::string::npos);
}

TEST(ParallelSection, OverlapOfGradientAllReducesIsOnByDefaultAndReachesTheSynthesizer) {
  const std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  const RunConfig on = load_run_config(path, {});
  EXPECT_TRUE(on.parallel.overlap_grad_comm);
  EXPECT_TRUE(synthesis_options(on).overlap_grad_comm);
  const RunConfig off = load_run_config(path, {"parallel.overlap_grad_comm=false"});
  EXPECT_FALSE(off.parallel.overlap_grad_comm);
  EXPECT_FALSE(synthesis_options(off).overlap_grad_comm);
  EXPECT_EQ(to_json(off)["parallel"]["overlap_grad_comm"], false);
  const std::string m = load_error(path, {"parallel.overlap_grad_comm=maybe"});
  EXPECT_NE(m.find("parallel.overlap_grad_comm"), std::string::npos) << m;
}

// parallel.share_gpus: off by default; with it off, more GPU ranks on a node than GPUs is an
// error naming both counts and the ways out, unless the cluster is emulated on one GPU.
TEST(ParallelSection, RanksShareAGpuOnlyWhenAskedOrEmulated) {
  const std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  EXPECT_FALSE(load_run_config(path, {}).parallel.share_gpus);
  const RunConfig on = load_run_config(path, {"parallel.share_gpus=true"});
  EXPECT_TRUE(on.parallel.share_gpus);
  EXPECT_EQ(to_json(on)["parallel"]["share_gpus"], true);
  EXPECT_NE(load_error(path, {"parallel.share_gpus=2"}).find("parallel.share_gpus"),
            std::string::npos);
  const std::string m = gpu_sharing_error(4, 2, false, false);
  EXPECT_NE(m.find("4 ranks on this node but 2 GPU(s) visible"), std::string::npos) << m;
  EXPECT_NE(m.find("scripts/hap-emulate"), std::string::npos) << m;
  EXPECT_NE(m.find("parallel.share_gpus=true"), std::string::npos) << m;
  EXPECT_EQ(gpu_sharing_error(4, 2, false, true), "");   // asked for
  EXPECT_EQ(gpu_sharing_error(4, 1, true, false), "");   // an emulated mixed GPU cluster
  EXPECT_EQ(gpu_sharing_error(2, 2, false, false), "");  // one GPU each
  EXPECT_EQ(gpu_sharing_error(1, 8, false, false), "");
  EXPECT_EQ(gpu_sharing_error(4, 0, false, false), "");  // no GPU: the device check says why
}

// NCCL never carries the collectives of a GPU cluster emulated on one GPU: its kernels would run
// outside the ranks' green contexts (parallel.backend=nccl is an error there, auto takes MPI).
TEST(ParallelSection, NcclIsRefusedForAGpuClusterEmulatedOnOneGpu) {
  const std::string m = nccl_refusal(true);
  EXPECT_NE(m.find("green context"), std::string::npos) << m;
  EXPECT_NE(m.find("parallel.backend=mpi"), std::string::npos) << m;
  EXPECT_EQ(nccl_refusal(false), "");
}

// parallel.recompute: auto by default, off and all reach the synthesizer, anything else is a
// ConfigError naming the key.
TEST(ParallelSection, RecomputationIsAutoByDefaultAndReachesTheSynthesizer) {
  const std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  EXPECT_EQ(load_run_config(path, {}).parallel.recompute, synth::Recompute::Auto);
  EXPECT_EQ(synthesis_options(load_run_config(path, {"parallel.recompute=all"})).recompute,
            synth::Recompute::All);
  const RunConfig off = load_run_config(path, {"parallel.recompute=off"});
  EXPECT_EQ(synthesis_options(off).recompute, synth::Recompute::Off);
  EXPECT_EQ(to_json(off)["parallel"]["recompute"], "off");
  const std::string m = load_error(path, {"parallel.recompute=sometimes"});
  EXPECT_NE(m.find("parallel.recompute"), std::string::npos) << m;
}

// parallel.zero_storage: auto by default, off, on and all reach the synthesizer, anything else is
// a ConfigError naming the key.
TEST(ParallelSection, ZeroStorageIsAutoByDefaultAndReachesTheSynthesizer) {
  const std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  EXPECT_EQ(load_run_config(path, {}).parallel.zero_storage, synth::ZeroStorage::Auto);
  EXPECT_EQ(synthesis_options(load_run_config(path, {"parallel.zero_storage=on"})).zero_storage,
            synth::ZeroStorage::On);
  const RunConfig off = load_run_config(path, {"parallel.zero_storage=off"});
  EXPECT_EQ(synthesis_options(off).zero_storage, synth::ZeroStorage::Off);
  EXPECT_EQ(to_json(off)["parallel"]["zero_storage"], "off");
  const RunConfig all = load_run_config(path, {"parallel.zero_storage=all"});
  EXPECT_EQ(synthesis_options(all).zero_storage, synth::ZeroStorage::All);
  EXPECT_EQ(to_json(all)["parallel"]["zero_storage"], "all");
  const std::string m = load_error(path, {"parallel.zero_storage=always"});
  EXPECT_NE(m.find("parallel.zero_storage"), std::string::npos) << m;
}

// parallel.devices pins the devices by name (any order, spaces around names allowed); a name the
// cluster lacks, a name given twice or a list with no name is a ConfigError naming the key.
TEST(ParallelSection, PinnedDevicesAreNamesOfTheClustersDevices) {
  const std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  synth::Cluster c;
  c.name = "pair";
  c.add_node("n", {1e9, 1e-6},
             {{"a", "t", 1e9, int64_t{1} << 30, -1},
              {"b", "t", 1e9, int64_t{1} << 30, -1},
              {"c", "t", 1e9, int64_t{1} << 30, -1}});
  const RunConfig none = load_run_config(path, {});
  EXPECT_TRUE(pinned_devices(none.parallel, c).empty());
  EXPECT_TRUE(none.parallel.select_devices);
  EXPECT_TRUE(synthesis_options(none).select_devices);
  const RunConfig two = load_run_config(path, {"parallel.devices=c, a"});
  EXPECT_EQ(pinned_devices(two.parallel, c), (std::vector<int>{0, 2}));
  EXPECT_EQ(to_json(two)["parallel"]["devices"], "c, a");
  EXPECT_FALSE(
      synthesis_options(load_run_config(path, {"parallel.select_devices=false"})).select_devices);
  auto error = [&](const std::string& devices) {
    ParallelConfig p;
    p.devices = devices;
    try {
      pinned_devices(p, c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << devices << " was accepted";
    return std::string();
  };
  expect_contains(error("a,z"), {"parallel.devices", "no device 'z'", "its devices: a, b, c"});
  expect_contains(error("b,b"), {"parallel.devices", "'b' is named twice"});
  expect_contains(error(" , "), {"parallel.devices", "names no device"});
  // A YAML list of names reads as the same names; an empty list names none, an error as " , " is.
  const RunConfig listed = load_run_config(path, {"parallel.devices=[c, a]"});
  EXPECT_EQ(listed.parallel.devices, "c, a");
  EXPECT_EQ(pinned_devices(listed.parallel, c), (std::vector<int>{0, 2}));
  expect_contains(load_error(path, {"parallel.devices=[]"}),
                  {"parallel.devices", "at least one name", "an empty list"});
  expect_contains(load_error(path, {"parallel.devices=[a, [b]]"}),
                  {"parallel.devices[1]", "expected a name"});
  expect_contains(load_error(path, {"parallel.devices=[a, 'b,c']"}),
                  {"parallel.devices[1]", "without a comma", "'b,c'"});
  expect_contains(load_error(path, {"parallel.devices={a: 1}"}),
                  {"parallel.devices", "a list of names"});
}

TEST(ParallelSection, SearchBudgetDefaultsToTwoMillionStatesAndReachesTheSynthesizer) {
  const std::string path = std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml";
  RunConfig c = load_run_config(path, {});
  EXPECT_EQ(c.parallel.search_budget, 2'000'000);
  EXPECT_EQ(synthesis_options(c).max_states, 2'000'000);
  c = load_run_config(path, {"parallel.search_budget=5000000"});
  EXPECT_EQ(c.parallel.search_budget, 5'000'000);
  EXPECT_EQ(synthesis_options(c).max_states, 5'000'000);
  EXPECT_EQ(to_json(c)["parallel"]["search_budget"], 5'000'000);
  // The memory model counts the configured optimizer's state.
  EXPECT_EQ(synthesis_options(c).optimizer_state_slots, 2);
  EXPECT_EQ(synthesis_options(load_run_config(path, {"train.optimizer=sgd", "train.momentum=0"}))
                .optimizer_state_slots,
            0);
  EXPECT_EQ(synthesis_options(load_run_config(path, {"train.optimizer=sgd"})).optimizer_state_slots,
            1);
  try {
    load_run_config(path, {"parallel.search_budget=999"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("parallel.search_budget: expected an integer >= 1000, got 999"),
        std::string::npos)
        << e.what();
  }
}

TEST(ParallelSection, ABudgetErrorNamesTheKeyAndTheOptions) {
  ParallelConfig p;
  p.search_budget = 4000;
  const std::string what =
      "search: expanded more than 4000 states without reaching the loss (raise the search budget)";
  EXPECT_EQ(synthesis_error_message(what, p),
            what +
                "; the budget is parallel.search_budget = 4000 states (--set "
                "parallel.search_budget=N, or hap-plan --search-budget N)");
  EXPECT_EQ(synthesis_error_message("no program fits in memory", p), "no program fits in memory");
}

}  // namespace
}  // namespace hap::train
