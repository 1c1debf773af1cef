// The safetensors format (models/safetensors.h): the layout any reader expects, round trips of
// every dtype with metadata, files of other writers, each kind of bad file, checksums that catch
// every damaging byte flip; checkpoints in it, and the .hapt checkpoints of earlier versions.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model_test_util.h"
#include "models/gpt.h"
#include "models/optim.h"
#include "models/safetensors.h"
#include "models/serialize.h"

namespace hap {
namespace {

using hap::test_util::read_bytes;
using hap::test_util::ScratchDir;
using hap::test_util::write_bytes;
using hap::testing::error_of;
using hap::testing::same_values;

NamedTensors sample_tensors() {
  NamedTensors t;
  t.emplace_back("w", randn({3, 5}, 1));
  t.emplace_back("bf16", randn({7}, 2).to(DType::BF16));
  t.emplace_back("f64", randn({2, 2}, 3, 0, TensorOptions{}.with_dtype(DType::F64)));
  t.emplace_back("i64", Tensor::from_vector(std::vector<int64_t>{-5, 0, 1LL << 40}, {3}));
  t.emplace_back("u8", Tensor::from_vector(std::vector<double>{0, 7, 255}, {3},
                                           TensorOptions{}.with_dtype(DType::U8)));
  t.emplace_back("scalar", Tensor::scalar(2.5));
  t.emplace_back("empty", Tensor::zeros({0, 4}));
  const Tensor m = Tensor::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  t.emplace_back("transposed", m.as_strided({3, 2}, {1, 3}, 0));
  return t;
}

void expect_same(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.dtype(), b[i].second.dtype()) << a[i].first;
    EXPECT_TRUE(same_values(a[i].second, b[i].second)) << a[i].first;
  }
}

// A file as another framework writes it: the given header text, then `data`.
std::vector<char> plain_file(std::string header, const std::vector<char>& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += header;
  out.append(data.begin(), data.end());
  return {out.begin(), out.end()};
}

TEST(Safetensors, RoundTripsEveryDtypeWithMetadataInTheFormatsLayout) {
  ScratchDir dir("safetensors");
  const NamedTensors saved = sample_tensors();
  save_safetensors(dir.path("a.safetensors"), saved, {{"step", "12"}, {"note", "h\xc3\xa9"}});
  TensorMetadata meta;
  expect_same(load_safetensors(dir.path("a.safetensors"), &meta), saved);
  EXPECT_EQ(meta, (TensorMetadata{{"step", "12"}, {"note", "h\xc3\xa9"}}));

  // 8-byte little-endian header size, a JSON object padded to 8 bytes, then the data back to back.
  const std::vector<char> b = read_bytes(dir.path("a.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(b[8], '{');
  size_t data_bytes = 0;
  for (const auto& [name, t] : saved) data_bytes += t.nbytes();
  EXPECT_EQ(b.size(), 8 + n + data_bytes);
  const std::string header(b.begin() + 8, b.begin() + 8 + static_cast<int64_t>(n));
  EXPECT_HAS(header, R"("w":{"dtype":"F32","shape":[3,5],"data_offsets":[0,60]})");
  EXPECT_HAS(header, R"("bf16":{"dtype":"BF16","shape":[7],"data_offsets":[60,74]})");
  EXPECT_HAS(header, R"("hap.crc32.w":")");
  EXPECT_TRUE(looks_like_safetensors(dir.path("a.safetensors")));
  // No temporary left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.dir())) files += e.exists();
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, ReadsFilesOfOtherWritersWithoutChecksums) {
  ScratchDir dir("safetensors");
  std::vector<char> data(9);
  const float v[2] = {1.5f, -2.0f};
  std::memcpy(data.data() + 1, v, 8);
  data[0] = 42;
  // Keys in another order, the u8 first in the data, no __metadata__.
  write_bytes(dir.path("other.safetensors"),
              plain_file(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[1,9]},)"
                         R"("a":{"dtype":"U8","shape":[],"data_offsets":[0,1]}})",
                         data));
  TensorMetadata meta = {{"stale", "x"}};
  NamedTensors t = load_safetensors(dir.path("other.safetensors"), &meta);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].first, "a");  // in data order
  EXPECT_EQ(t[0].second.item(), 42);
  EXPECT_EQ(t[1].second.to_vector(), (std::vector<double>{1.5, -2.0}));
  EXPECT_TRUE(meta.empty());
}

TEST(Safetensors, RefusesEachKindOfBadFileNamingWhatIsWrong) {
  ScratchDir dir("safetensors");
  const std::vector<char> four(4, 0);
  auto error_for = [&](const std::vector<char>& bytes) {
    write_bytes(dir.path("bad.safetensors"), bytes);
    return error_of([&] { load_safetensors(dir.path("bad.safetensors")); });
  };
  auto entry = [](const std::string& fields) { return R"({"t":{)" + fields + "}}"; };
  const std::string ok_fields = R"("dtype":"F32","shape":[1],"data_offsets":[0,4])";
  write_bytes(dir.path("ok.safetensors"), plain_file(entry(ok_fields), four));
  EXPECT_EQ(load_safetensors(dir.path("ok.safetensors")).size(), 1u);  // the baseline is valid
  EXPECT_HAS(error_for({'x', 'y'}), "too few for a safetensors file");
  std::vector<char> huge(16, 0);
  huge[7] = 1;
  EXPECT_HAS(error_for(huge), "is not a safetensors file: its header size is");
  EXPECT_HAS(error_for(plain_file("[1, 2]", four)), "does not start with '{'");
  EXPECT_HAS(error_for(plain_file(R"({"t": {"dtype": "F32",)", four)), "is not valid JSON");
  EXPECT_HAS(error_for(plain_file(R"({"t":{"shape":[[[[1]]]]}})", four)), "nests deeper");
  EXPECT_HAS(
      error_for(plain_file(entry(R"("dtype":"F16","shape":[1],"data_offsets":[0,2])"), {0, 0})),
      "has dtype \"F16\"; HAP reads F32, BF16, F64, I64 and U8");
  EXPECT_HAS(
      error_for(plain_file(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,4])"), four)),
      "is [2] F32 (8 bytes) but its data_offsets span 4 bytes");
  EXPECT_HAS(
      error_for(plain_file(entry(R"("dtype":"F32","shape":[-1],"data_offsets":[0,4])"), four)),
      "has size -1 in its shape");
  EXPECT_HAS(
      error_for(plain_file(entry(R"("dtype":"F32","shape":[1],"data_offsets":[4,0])"), four)),
      "begin after end");
  EXPECT_HAS(error_for(plain_file(entry(ok_fields + R"(,"extra":1)"), four)),
             "has unknown field 'extra'");
  EXPECT_HAS(error_for(plain_file(entry(R"("dtype":"F32","shape":[1])"), four)),
             "lacks one of dtype, shape and data_offsets");
  EXPECT_HAS(
      error_for(plain_file(
          entry(R"("dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,4])"), four)),
      "(too many bytes)");
  EXPECT_HAS(error_for(plain_file(entry(ok_fields), std::vector<char>(6, 0))),
             "(unexpected bytes at the end)");
  EXPECT_HAS(error_for(plain_file(entry(ok_fields), {0, 0})), "(the file is truncated)");
  EXPECT_HAS(error_for(plain_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("u":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                  std::vector<char>(12, 0))),
             "tensor 'u' starts at data offset 8, expected 4");
  EXPECT_HAS(error_for(plain_file(R"({"__metadata__":{"k":1}})", {})),
             "__metadata__ entry 'k' is 1, expected a string");
  EXPECT_HAS(
      error_for(plain_file(
          R"({"__metadata__":{"hap.crc32.t":"00000000"},)" + entry(ok_fields).substr(1), four)),
      "without hap.header_crc32: the header is damaged");
  EXPECT_HAS(error_of([&] { load_safetensors(dir.path("missing.safetensors")); }),
             "does not exist");
  EXPECT_HAS(error_of([&] { load_safetensors("/dev/zero"); }), "not a regular file");

  // Writing: reserved names and keys.
  const Tensor x = Tensor::zeros({1});
  EXPECT_HAS(error_of([&] {
               save_safetensors(dir.path("w"), {{"__metadata__", x}});
             }),
             "is not allowed");
  EXPECT_HAS(error_of([&] {
               save_safetensors(dir.path("w"), {{"a", x}, {"a", x}});
             }),
             "appears twice");
  EXPECT_HAS(error_of([&] {
               save_safetensors(dir.path("w"), {{"a", x}}, {{"hap.crc32.a", "0"}});
             }),
             "reserved for HAP's checksums");
}

nn::GPTConfig tiny_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  c.seed = 3;
  return c;
}

// Every one of 200 random byte flips either fails the load or leaves everything read unchanged
// (a flip in the header's padding to another space character): never a silent change.
TEST(Safetensors, EveryDamagingByteFlipIsDetected) {
  ScratchDir dir("safetensors");
  nn::GPT model(tiny_gpt());
  optim::AdamW opt(model.parameters(), optim::AdamWOptions{});
  Tensor idx = Tensor::from_vector(std::vector<int64_t>{1, 2, 3, 4}, {1, 4});
  model.loss(idx, idx).backward();
  opt.step();
  const std::string good = dir.path("good.safetensors");
  save_checkpoint(good, model, &opt, 7);
  const Checkpoint reference = read_checkpoint(good);
  const std::vector<char> bytes = read_bytes(good);

  Tensor draws = rand({2, 200}, 99);
  const std::vector<double> r = draws.to_vector();
  int detected = 0, harmless = 0;
  for (int i = 0; i < 200; ++i) {
    std::vector<char> flipped = bytes;
    const size_t at = static_cast<size_t>(r[i] * static_cast<double>(bytes.size()));
    flipped[at] = static_cast<char>(flipped[at] ^ (1 + static_cast<int>(r[200 + i] * 255)));
    const std::string bad = dir.path("flipped.safetensors");
    write_bytes(bad, flipped);
    Checkpoint c;
    try {
      c = read_checkpoint(bad);
    } catch (const Error&) {
      ++detected;
      continue;
    }
    ++harmless;
    EXPECT_EQ(c.step, reference.step) << "flip at byte " << at;
    EXPECT_EQ(c.random_seed, reference.random_seed) << "flip at byte " << at;
    EXPECT_EQ(c.metadata, reference.metadata) << "flip at byte " << at;
    expect_same(c.tensors, reference.tensors);
  }
  RecordProperty("detected", detected);
  RecordProperty("harmless", harmless);
  EXPECT_EQ(detected + harmless, 200);
  EXPECT_GE(detected, 190) << "most flips damage something";
}

TEST(Safetensors, CheckpointsCarryTheirMetadataAndResume) {
  ScratchDir dir("safetensors");
  nn::GPT model(tiny_gpt());
  optim::AdamW opt(model.parameters(), optim::AdamWOptions{});
  save_checkpoint(dir.path("c.safetensors"), model, &opt, 5);
  TensorMetadata meta;
  load_safetensors(dir.path("c.safetensors"), &meta);
  EXPECT_EQ(meta.at("format"), kCheckpointFormat);
  EXPECT_EQ(meta.at("step"), "5");
  EXPECT_EQ(meta.at("model"), "GPT");
  EXPECT_EQ(meta.at("model_digest"), model_digest(model.named_parameters()));
  EXPECT_EQ(meta.at("optimizer"), "AdamW");
  EXPECT_EQ(meta.at("optimizer_slots"), "exp_avg,exp_avg_sq");

  // A safetensors file that is not a checkpoint is named as such.
  save_safetensors(dir.path("plain.safetensors"), {{"w", Tensor::zeros({2})}});
  EXPECT_HAS(error_of([&] { read_checkpoint(dir.path("plain.safetensors")); }),
             "is a safetensors file but not a HAP checkpoint");
  save_safetensors(dir.path("badstep.safetensors"), {{"w", Tensor::zeros({2})}},
                   {{"format", kCheckpointFormat}, {"step", "12x"}});
  EXPECT_HAS(error_of([&] { read_checkpoint(dir.path("badstep.safetensors")); }),
             "metadata 'step' is '12x', expected an integer");
}

// Checkpoints of HAP's first format (.hapt, counters as i64 tensors) still resume.
TEST(Safetensors, HaptCheckpointsOfEarlierVersionsStayReadable) {
  ScratchDir dir("safetensors");
  nn::GPT model(tiny_gpt());
  NamedTensors old;
  for (const auto& [name, t] : model.named_parameters()) old.emplace_back("model." + name, t);
  auto i64 = [](int64_t v) { return Tensor::from_vector(std::vector<int64_t>{v}, {}); };
  old.emplace_back("meta.step", i64(9));
  old.emplace_back("meta.random_seed", i64(3));
  old.emplace_back("meta.random_step", i64(9));
  save_tensors(dir.path("old.hapt"), old);
  nn::GPTConfig other = tiny_gpt();
  other.seed = 77;
  nn::GPT fresh(other);
  EXPECT_EQ(load_checkpoint(dir.path("old.hapt"), fresh, nullptr), 9);
  for (const auto& [name, t] : model.named_parameters())
    EXPECT_TRUE(same_values(t, fresh.parameter(name))) << name;
  // Counters are read exactly (not through a double), up to the largest i64.
  old[old.size() - 3].second = i64(std::numeric_limits<int64_t>::max());
  save_tensors(dir.path("max.hapt"), old);
  EXPECT_EQ(read_checkpoint(dir.path("max.hapt")).step, std::numeric_limits<int64_t>::max());
  old.pop_back();
  save_tensors(dir.path("partial.hapt"), old);
  EXPECT_HAS(error_of([&] { read_checkpoint(dir.path("partial.hapt")); }),
             "lacks meta.step, meta.random_seed or meta.random_step");
}

}  // namespace
}  // namespace hap
