// Writes the binary seed corpora of the fuzz targets (the YAML seeds are written by hand):
//   fuzz_write_seeds DIR
// writes DIR/<target>/<seed> for the plan, safetensors, .hapt, checkpoint, token shard, CIFAR and
// text corpus targets. The plans are synthesized for fuzz/plan_model.h, so the seeds must be
// written again when tracing or the fingerprints change (the smoke tests' --expect-read notices).
// Every seed is small (a few KB) and the same on every run.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz/plan_model.h"
#include "models/safetensors.h"
#include "models/serialize.h"
#include "synth/synthesizer.h"
#include "train/image_data.h"
#include "train/plan_io.h"
#include "train/token_data.h"

namespace {

namespace fs = std::filesystem;
using hap::DType;
using hap::Tensor;
using hap::TensorOptions;

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) throw std::runtime_error("cannot write " + path.string());
}

// A tensor of `shape` whose elements count up from `first` (in the dtype's own rounding).
Tensor counting(const hap::Shape& shape, DType dtype, double first) {
  std::vector<double> values(static_cast<std::size_t>(hap::shape_numel(shape)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = first + static_cast<double>(i);
  return Tensor::from_vector(values, shape, TensorOptions{}.with_dtype(DType::F64)).to(dtype);
}

// Tensors of every dtype the formats hold, a scalar and an empty tensor among them.
hap::NamedTensors mixed_tensors() {
  return {{"w", counting({2, 3}, DType::F32, -1.5)},
          {"b", counting({4}, DType::BF16, 0.25)},
          {"scale", Tensor::scalar(0.125, TensorOptions{}.with_dtype(DType::F64))},
          {"ids", counting({3}, DType::I64, 7)},
          {"mask", counting({2, 2}, DType::U8, 1)},
          {"none", Tensor::empty({0, 5}, TensorOptions{}.with_dtype(DType::F32))}};
}

void write_plans(const fs::path& dir) {
  const hap::synth::CostModel& cm = hap::fuzz::plan_cost_model();
  struct Variant {
    const char* file;
    hap::synth::Strategy strategy;
    hap::synth::SegmentMode segments;
  };
  for (const Variant& v :
       {Variant{"hap.json", hap::synth::Strategy::Hap, hap::synth::SegmentMode::PerBlock},
        Variant{"hap-single.json", hap::synth::Strategy::Hap, hap::synth::SegmentMode::Single},
        Variant{"dp-ev.json", hap::synth::Strategy::DpEv, hap::synth::SegmentMode::PerBlock},
        Variant{"dp-cp.json", hap::synth::Strategy::DpCp, hap::synth::SegmentMode::PerBlock},
        Variant{"tp.json", hap::synth::Strategy::Tp, hap::synth::SegmentMode::PerBlock}}) {
    hap::synth::SynthesisOptions o;
    o.strategy = v.strategy;
    o.segments = v.segments;
    hap::synth::DistributedProgram p =
        hap::synth::synthesize(hap::fuzz::plan_graph(), hap::fuzz::plan_cluster(), o);
    p.synthesis_s = 0;  // a timing: the seed is the same on every run without it
    hap::train::save_plan((dir / v.file).string(), cm, p);
    hap::train::load_plan((dir / v.file).string(), cm);  // the seed must read
  }
}

void write_checkpoints(const fs::path& dir) {
  hap::Checkpoint c;
  c.tensors = {{"model.w", counting({2, 3}, DType::F32, 0.5)},
               {"optim.m.w", counting({2, 3}, DType::F32, 0)},
               {"optim.step.w", Tensor::scalar(3, TensorOptions{}.with_dtype(DType::I64))}};
  c.step = 3;
  c.random_seed = 1337;
  c.random_step = 12;
  c.metadata = {{"model", "fuzz"}, {"optimizer", "adamw"}};
  hap::write_checkpoint((dir / "v2.safetensors").string(), c);
  // HAP's first checkpoint format: .hapt with the counters as i64 scalars.
  auto i64 = [](double v) { return Tensor::scalar(v, TensorOptions{}.with_dtype(DType::I64)); };
  hap::save_tensors((dir / "v1.hapt").string(), {{"model.w", counting({2, 3}, DType::F32, 0.5)},
                                                 {"meta.step", i64(3)},
                                                 {"meta.random_seed", i64(1337)},
                                                 {"meta.random_step", i64(12)}});
}

// A safetensors file as another tool writes it: no HAP checksums, read unverified.
std::string unverified_safetensors() {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  const float a[2] = {1.0f, -2.0f};
  out += header;
  out.append(reinterpret_cast<const char*>(a), sizeof a);
  out += std::string("\x01\x02\x03", 3);
  return out;
}

// `records` CIFAR-10 records with labels 0, 1, ... and a pixel ramp.
std::string cifar_records(int records) {
  std::string out;
  for (int r = 0; r < records; ++r) {
    out += static_cast<char>(r % 10);
    for (std::int64_t i = 0; i < hap::train::kCifarImageBytes; ++i) {
      out += static_cast<char>((i + 37 * r) % 256);
    }
  }
  return out;
}

void write_all(const fs::path& root) {
  auto dir = [&](const std::string& target) {
    const fs::path d = root / target;
    fs::create_directories(d);
    return d;
  };
  write_plans(dir("fuzz_plan"));

  const fs::path st = dir("fuzz_safetensors");
  hap::save_safetensors((st / "mixed.safetensors").string(), mixed_tensors(),
                        {{"note", "fuzz seed"}});
  hap::save_safetensors((st / "empty.safetensors").string(), {});
  write_bytes(st / "unverified.safetensors", unverified_safetensors());

  const fs::path hapt = dir("fuzz_hapt");
  hap::save_tensors((hapt / "mixed.hapt").string(), mixed_tensors());
  hap::save_tensors((hapt / "empty.hapt").string(), {});

  write_checkpoints(dir("fuzz_checkpoint"));

  const fs::path tokens = dir("fuzz_token_shard");
  std::vector<std::uint16_t> ids;
  for (std::uint16_t i = 0; i < 48; ++i) ids.push_back(static_cast<std::uint16_t>(i * 1361 + 5));
  hap::train::write_token_shard((tokens / "48.bin").string(), ids);
  hap::train::write_token_shard((tokens / "2.bin").string(), {50256, 0});
  hap::train::write_token_shard((tokens / "0.bin").string(), {});

  const fs::path cifar = dir("fuzz_cifar");
  write_bytes(cifar / "1.bin", cifar_records(1));
  write_bytes(cifar / "2.bin", cifar_records(2));

  // The first two bytes are the target's seq_len (1 + b0 % 64) and validation fraction (b1 / 256).
  const fs::path text = dir("fuzz_text_corpus");
  const std::string prose =
      "A language model learns the next byte of its corpus. Every byte is a token here;\n"
      "the last part of the file is held out for validation.\n";
  write_bytes(text / "seq8-val25.txt", std::string("\x07\x40", 2) + prose);
  write_bytes(text / "seq1-val50.txt", std::string("\x00\x80", 2) + "abcdefgh");
  write_bytes(text / "seq64-val10.txt", std::string("\x3f\x1a", 2) + prose + prose + prose);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR (writes DIR/<target>/<seed>)\n", argv[0]);
    return 2;
  }
  try {
    write_all(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
