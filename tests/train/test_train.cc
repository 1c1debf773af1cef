// hap-train end to end: the loss falls, runs are bitwise reproducible, checkpoints resume, and
// bad input exits non-zero with a message.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/cpu_features.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#endif
#include "models/serialize.h"
#include "tests/test_util.h"
#include "train/config.h"
#include "train/from_config.h"
#include "train/trainer.h"

namespace hap::train {
namespace {

namespace fs = std::filesystem;

std::string tiny_config() { return std::string(HAP_SOURCE_DIR) + "/configs/gpt-tiny.yaml"; }

// What hap-train does on one process.
TrainSummary train(const RunConfig& c, const FitOptions& options) {
  auto model = build_model(c);
  Trainer trainer(model, open_dataset(c, *model), c.train);
  return trainer.fit(options);
}

TEST(Train, LossFallsOnTheDefaultCorpus) {
  RunConfig c =
      load_run_config(tiny_config(), {"train.steps=60", "train.lr=3e-3", "train.eval_every=60"});
  TrainSummary s = train(c, {.quiet = true});
  EXPECT_EQ(s.steps_run, 60);
  EXPECT_LT(s.last_loss, s.first_loss - 1.0) << s.first_loss << " -> " << s.last_loss;
  EXPECT_GT(s.last_val_loss, 0);
}

// train.precision: bf16 on the default GPT (configs/gpt.yaml): over 200 steps on the same batches
// its logged losses stay within 2% of f32's, and both fall.
TEST(Train, Bf16MixedPrecisionTracksF32OnTheDefaultGpt) {
  test_util::ScratchDir dir("train_bf16");
  std::map<std::string, std::vector<double>> curves;
  for (const char* precision : {"f32", "bf16"}) {
    const std::string log = dir.path(std::string(precision) + ".jsonl");
    RunConfig c = load_run_config(
        std::string(HAP_SOURCE_DIR) + "/configs/gpt.yaml",
        {"train.steps=200", "train.log_every=10", "train.eval_every=200", "train.eval_batches=2",
         "train.log_file=" + log, std::string("train.precision=") + precision});
    train(c, {.quiet = true});
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["type"] == "train") curves[precision].push_back(j["loss"].get<double>());
    }
  }
  const std::vector<double>&f32 = curves["f32"], &bf16 = curves["bf16"];
  ASSERT_EQ(f32.size(), 20u);
  ASSERT_EQ(bf16.size(), f32.size());
  double worst = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    const double rel = std::abs(bf16[i] - f32[i]) / f32[i];
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 0.02) << "logged point " << i << ": f32 " << f32[i] << ", bf16 " << bf16[i];
  }
  std::printf(
      "bf16 vs f32 over 200 steps: worst relative difference %.4f; loss %.3f -> %.3f "
      "(f32 %.3f -> %.3f)\n",
      worst, bf16.front(), bf16.back(), f32.front(), f32.back());
  EXPECT_LT(bf16.back(), bf16.front() - 1.0);
  EXPECT_NE(bf16, f32) << "the bf16 run must not be the f32 run";
}

TEST(Train, SameConfigAndSeedGiveBitwiseIdenticalRuns) {
  fs::path dir = fs::temp_directory_path() / ("hap_train_det_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::vector<std::string> losses[2];
  for (int run = 0; run < 2; ++run) {
    std::string log = (dir / ("run" + std::to_string(run) + ".jsonl")).string();
    RunConfig c = load_run_config(tiny_config(), {"train.steps=10", "train.log_every=1",
                                                  "model.dropout=0.1", "train.log_file=" + log});
    train(c, {.quiet = true});
    std::ifstream in(log);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line);
      if (j["type"] == "train")
        losses[run].push_back(j["loss"].dump());  // exact text of the double
    }
  }
  ASSERT_EQ(losses[0].size(), 10u);
  EXPECT_EQ(losses[0], losses[1]);
  fs::remove_all(dir);
}

// The log's records carry MFU (the step's FLOPs over the measured peak) and the time left, and
// scripts/hap-plot draws them; a log it cannot use is refused with exit 1.
TEST(Train, LogsMfuAndTimeLeftAndHapPlotDrawsTheLog) {
  fs::path dir = fs::temp_directory_path() / ("hap_train_mfu_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string log = (dir / "run.jsonl").string();
  RunConfig c = load_run_config(tiny_config(), {"train.steps=6", "train.log_every=2",
                                                "train.eval_every=3", "train.log_file=" + log});
  train(c, {.quiet = true});
  std::ifstream in(log);
  std::string line;
  double flops = 0, peak = 0;
  std::vector<double> left;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["type"] == "config") {
      flops = j["flops_per_step"];
      peak = j["peak_flops_per_s"];
    }
    if (j["type"] != "train") continue;
    const double ms = j["ms_per_step"], mfu = j["mfu"];
    EXPECT_NEAR(mfu, flops / (ms / 1e3) / peak, 1e-9 * mfu);
    EXPECT_GT(mfu, 0);
    EXPECT_LT(mfu, 1.5) << "more than the measured peak";
    left.push_back(j["time_left_s"]);
  }
  EXPECT_GT(flops, 0);
  EXPECT_GT(peak, 1e8);
  ASSERT_EQ(left.size(), 3u);
  EXPECT_GT(left[0], left[1]);
  EXPECT_EQ(left[2], 0.0);
  const std::string plot = std::string(HAP_SOURCE_DIR) + "/scripts/hap-plot ";
  const std::string png = (dir / "run.png").string();
  ASSERT_EQ(std::system((plot + log + " --out " + png + " > /dev/null").c_str()), 0);
  std::ifstream image(png, std::ios::binary);
  char magic[4] = {};
  image.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  std::ofstream(dir / "empty.jsonl") << "{\"type\": \"config\"}\n";
  const int rc = std::system((plot + (dir / "empty.jsonl").string() + " 2> /dev/null").c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << rc;
  fs::remove_all(dir);
}

// train.checkpoint_every: checkpoints in train.checkpoint_dir, the newest train.keep_checkpoints
// kept, one more where the run stops; resuming from the newest continues the run exactly, and a
// killed write's leftover goes at the next start.
TEST(Train, PeriodicCheckpointsKeepTheNewestAndTheNewestResumesTheRun) {
  const fs::path dir =
      fs::temp_directory_path() / ("hap_train_periodic_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string ck = (dir / "ck").string();
  RunConfig c = load_run_config(tiny_config(), {"train.steps=8", "train.warmup_steps=2"});
  const TrainSummary straight = train(c, {.quiet = true});
  c = load_run_config(tiny_config(),
                      {"train.steps=8", "train.warmup_steps=2", "train.checkpoint_every=2",
                       "train.checkpoint_dir=" + ck, "train.keep_checkpoints=2"});
  EXPECT_EQ(newest_checkpoint(ck), "");
  train(c, {.stop_after = 5, .quiet = true});
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ck)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  EXPECT_EQ(listing(),
            (std::vector<std::string>{"step_00000004.safetensors", "step_00000005.safetensors"}));
  EXPECT_EQ(newest_checkpoint(ck), checkpoint_file(ck, 5));
  std::ofstream(fs::path(ck) / "step_00000006.safetensors.tmp.4242") << "half a write";
  const TrainSummary resumed = train(c, {.resume_path = newest_checkpoint(ck), .quiet = true});
  EXPECT_EQ(resumed.steps_run, 3);
  EXPECT_EQ(resumed.last_loss, straight.last_loss);  // bitwise
  EXPECT_EQ(listing(),
            (std::vector<std::string>{"step_00000006.safetensors", "step_00000008.safetensors"}));
  EXPECT_HAS(
      test_util::error_of([&] { load_run_config(tiny_config(), {"train.checkpoint_every=2"}); }),
      "train.checkpoint_every: expected an integer in [0, 0] (set train.checkpoint_dir");
  fs::remove_all(dir);
}

// What a process that installed the stop signals does with two SIGTERMs `gap_ms` apart (in a
// forked child: the second may end it): "alive, asked to stop by 15", or "killed by 15".
std::string after_two_sigterms(int gap_ms) {
  const pid_t child = ::fork();
  if (child == 0) {
    install_stop_signals();
    std::raise(SIGTERM);
    if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
    std::raise(SIGTERM);
    std::_Exit(stop_signal() == SIGTERM ? 0 : 1);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child) return "no child";
  if (WIFSIGNALED(status)) return "killed by " + std::to_string(WTERMSIG(status));
  return WEXITSTATUS(status) == 0 ? "alive, asked to stop by 15" : "alive, not asked to stop";
}

// The same stop request delivered twice at once (`timeout` signals its child and the child's
// process group) asks once: the run still finishes its step and writes its checkpoint. A second
// request a while after the first ends the process at once.
TEST(Train, ARepeatedStopSignalEndsTheProcessOnlyWhenItComesLater) {
  EXPECT_EQ(after_two_sigterms(0), "alive, asked to stop by 15");
  EXPECT_EQ(after_two_sigterms(static_cast<int>(kStopRepeatWindowNs / 1'000'000) + 200),
            "killed by 15");
}

// A stop request (SIGTERM, SIGINT, SIGUSR1) ends the loop after the current step with a
// checkpoint; resuming from it continues the run exactly.
TEST(Train, AStopRequestEndsTheStepWithACheckpointThatResumesTheRun) {
  const fs::path dir = fs::temp_directory_path() / ("hap_train_stop_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  RunConfig c = load_run_config(tiny_config(), {"train.steps=6", "train.warmup_steps=1",
                                                "train.checkpoint_dir=" + (dir / "ck").string()});
  const TrainSummary straight = train(c, {.quiet = true});
  fs::remove_all(dir);
  request_stop(SIGUSR1);
  try {
    train(c, {.quiet = true});
    ADD_FAILURE() << "no StopRequested";
  } catch (const StopRequested& e) {
    EXPECT_EQ(e.signo(), SIGUSR1);
    EXPECT_EQ(e.exit_code(), 128 + SIGUSR1);
    EXPECT_HAS(e.what(), "after step 1; checkpoint " + checkpoint_file((dir / "ck").string(), 1));
  }
  request_stop(0);
  const TrainSummary resumed =
      train(c, {.resume_path = newest_checkpoint((dir / "ck").string()), .quiet = true});
  EXPECT_EQ(resumed.steps_run, 5);
  EXPECT_EQ(resumed.last_loss, straight.last_loss);
  fs::remove_all(dir);
}

TEST(Train, StoppingAndResumingFromACheckpointGivesTheSameRun) {
  fs::path dir = fs::temp_directory_path() / ("hap_train_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string ckpt = (dir / "half.hapt").string();
  RunConfig c = load_run_config(tiny_config(),
                                {"train.steps=8", "train.warmup_steps=2", "model.dropout=0.1"});
  TrainSummary straight = train(c, {.quiet = true});
  TrainSummary first = train(c, {.checkpoint_path = ckpt, .stop_after = 4, .quiet = true});
  EXPECT_EQ(first.steps_run, 4);
  TrainSummary second = train(c, {.resume_path = ckpt, .quiet = true});
  EXPECT_EQ(second.steps_run, 4);
  EXPECT_EQ(second.last_loss, straight.last_loss);  // bitwise: same data, masks, optimizer state
  // With a log, the resumed run appends to the stopped run's records.
  const std::string log = (dir / "run.jsonl").string();
  c.train.log_file = log;
  c.train.log_every = 1;
  train(c, {.checkpoint_path = ckpt, .stop_after = 4, .quiet = true});
  train(c, {.resume_path = ckpt, .quiet = true});
  std::ifstream in(log);
  std::vector<int64_t> steps;
  int configs = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "train") steps.push_back(j["step"]);
    if (j["type"] == "config") ++configs;
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(configs, 2);
  fs::remove_all(dir);
}

// A model with running statistics (VGG-BN): its checkpoint holds them, and a resumed run
// evaluates exactly as the uninterrupted one (the evaluation normalises by them).
TEST(Train, RunningStatisticsAreCheckpointedAndResumed) {
  fs::path dir = fs::temp_directory_path() / ("hap_train_bn_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string ckpt = (dir / "half.safetensors").string();
  const std::string vgg = std::string(HAP_SOURCE_DIR) + "/configs/vgg19.yaml";
  const std::vector<std::string> small = {
      "model.depth=11",       "model.width=4",   "model.hidden=16",        "model.batch_norm=true",
      "train.batch_size=8",   "train.steps=6",   "train.warmup_steps=2",   "train.eval_every=6",
      "train.eval_batches=1", "train.log_file=", "data.synthetic_size=256"};
  const RunConfig c = load_run_config(vgg, {small.begin(), small.end()});
  const TrainSummary straight = train(c, {.quiet = true});
  train(c, {.checkpoint_path = ckpt, .stop_after = 3, .quiet = true});
  const Checkpoint saved = read_checkpoint(ckpt);
  int stats = 0;
  for (const auto& [name, t] : saved.tensors) {
    if (name.find(".running_") == std::string::npos) continue;
    ++stats;
    EXPECT_EQ(name.rfind("model.features.", 0), 0u) << name;
  }
  EXPECT_EQ(stats, 2 * 8);  // mean and variance of 8 BatchNorm layers
  const TrainSummary resumed = train(c, {.resume_path = ckpt, .quiet = true});
  EXPECT_EQ(resumed.last_loss, straight.last_loss);
  ASSERT_GT(straight.last_val_loss, 0);
  EXPECT_EQ(resumed.last_val_loss, straight.last_val_loss);
  fs::remove_all(dir);
}

int run_binary(const std::string& args, std::string* err, const std::string& prefix = "") {
  std::string errfile =
      (fs::temp_directory_path() / ("hap_train_err_" + std::to_string(::getpid()))).string();
  int rc = std::system(
      (prefix + std::string(HAP_TRAIN_BIN) + " " + args + " > /dev/null 2> " + errfile).c_str());
  std::ifstream in(errfile);
  err->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  fs::remove(errfile);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// A --save path that cannot be written stops the run before its first step (the steps would be
// lost), naming the path and the reason.
TEST(TrainBinary, AnUnwritableSavePathIsRefusedBeforeTraining) {
  std::string err;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(run_binary(
                "--config " + tiny_config() + " --set train.steps=100000 --save /dev/null/run.hapt",
                &err),
            2);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_NE(err.find("--save '/dev/null/run.hapt': cannot write"), std::string::npos) << err;
}

// The run says which CPU GEMM path it runs (HAP_CPU_GEMM forces one); a path that is not one
// stops the run before training, exit code 1, naming what was asked and what exists.
TEST(TrainBinary, TheRunNamesItsCpuGemmPathAndRefusesAnUnknownOne) {
  std::string err;
  EXPECT_EQ(run_binary("--config " + tiny_config(), &err, "HAP_CPU_GEMM=mkl "), 1);
  EXPECT_NE(err.find("HAP_CPU_GEMM='mkl' is not a CPU GEMM path: expected auto, onednn, "
                     "openblas or reference"),
            std::string::npos)
      << err;
  test_util::ScratchDir dir("train_gemm_path");
  const std::string out = dir.path("out.txt");
  const int rc = std::system(("HAP_CPU_GEMM=reference " + std::string(HAP_TRAIN_BIN) +
                              " --config " + tiny_config() +
                              " --set train.steps=1 --set train.warmup_steps=0 --set "
                              "train.log_file= > " +
                              out + " 2>&1")
                                 .c_str());
  ASSERT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << rc;
  std::ifstream in(out);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_NE(text.find("hap-train: cpu: " + cpu_features().summary()), std::string::npos) << text;
  EXPECT_NE(text.find(", gemm: reference, "), std::string::npos) << text;
}

// train.device=cuda where no GPU is visible (or the build has no CUDA backend) stops before
// training with exit code 1, naming the device and why; ranks refuse a GPU device plainly.
TEST(TrainBinary, ACudaDeviceWithoutAGpuIsAClearErrorBeforeTraining) {
#ifdef HAP_HAVE_CUDA
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu train on it";
#endif
  std::string err;
  EXPECT_EQ(run_binary("--config " + tiny_config() + " --set train.device=cuda:0", &err), 1);
  EXPECT_NE(err.find("train.device: "), std::string::npos) << err;
#ifdef HAP_HAVE_CUDA
  EXPECT_NE(err.find("cuda:0: no CUDA device is visible to this process"), std::string::npos)
      << err;
  EXPECT_NE(err.find("use the CPU (train.device: cpu)"), std::string::npos) << err;
#else
  EXPECT_NE(err.find("no allocator for cuda"), std::string::npos) << err;
#endif
}

// --trace writes a Chrome trace / Perfetto JSON of the chosen steps: one track (process) named
// after the rank, each step with its phases inside, every op kernel inside the phases with its
// module, times in microseconds.
TEST(Train, TraceWritesATimelineOfTheChosenSteps) {
  test_util::ScratchDir dir("train_trace");
  const std::string path = dir.path("trace.json");
  RunConfig c = load_run_config(tiny_config(), {"train.steps=5", "train.warmup_steps=1"});
  train(c, {.quiet = true, .trace_path = path, .trace_first = 1, .trace_last = 2});
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::vector<std::string> steps;
  std::map<std::string, int> phases;
  int ops = 0, with_module = 0;
  double step_begin = 0, step_end = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") {
      if (e.at("name") == "process_name") {
        EXPECT_EQ(e.at("args").at("name"), "one process");
      }
      continue;
    }
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_EQ(e.at("pid"), 0);
    EXPECT_GE(e.at("dur").get<double>(), 0);
    const std::string cat = e.at("cat");
    if (cat == "step") {
      steps.push_back(e.at("name"));
      step_begin = steps.size() == 1 ? e.at("ts").get<double>() : step_begin;
      step_end = e.at("ts").get<double>() + e.at("dur").get<double>();
    } else if (cat == "phase") {
      ++phases[e.at("name")];
    } else if (cat == "op") {
      ++ops;
      with_module += e.contains("args") && e.at("args").at("detail") == "blocks.0.attn";
    }
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"step 2", "step 3"}));
  EXPECT_EQ(phases, (std::map<std::string, int>{
                        {"forward", 2}, {"backward", 2}, {"grad_norm", 2}, {"update", 2}}));
  EXPECT_GT(ops, 50);
  EXPECT_GT(with_module, 0) << "ops name the module they ran in";
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") {
      EXPECT_GE(e.at("ts").get<double>(), step_begin - 1);
      EXPECT_LE(e.at("ts").get<double>() + e.at("dur").get<double>(), step_end + 1);
    }
  }
}

TEST(TrainBinary, BadTraceOptionsExitWithCode2) {
  std::string err;
  EXPECT_EQ(run_binary("--config " + tiny_config() +
                           " --set train.steps=5 --trace /tmp/x.json --trace-steps 4-2",
                       &err),
            2);
  EXPECT_HAS(err,
             "--trace-steps '4-2': expected N or FIRST-LAST with 1 <= FIRST <= LAST <= "
             "train.steps (5)");
  EXPECT_EQ(run_binary("--config " + tiny_config() + " --set train.steps=5 --trace-steps 2", &err),
            2);
  EXPECT_HAS(err, "--trace-steps needs --trace FILE");
  EXPECT_EQ(run_binary("--config " + tiny_config() + " --trace /dev/null/t.json", &err), 2);
  EXPECT_HAS(err, "--trace '/dev/null/t.json': cannot write");
}

TEST(TrainBinary, BadConfigValueExitsWithCode2AndNamesTheKey) {
  std::string err;
  EXPECT_EQ(run_binary("--config " + tiny_config() + " --set train.batch_size=0", &err), 2);
  EXPECT_NE(err.find("train.batch_size"), std::string::npos) << err;
  EXPECT_NE(err.find("got 0"), std::string::npos) << err;
}

TEST(TrainBinary, MissingCorpusExitsWithCode1AndNamesThePath) {
  std::string err;
  EXPECT_EQ(run_binary("--config " + tiny_config() + " --set data.path=/no/such/corpus", &err), 1);
  EXPECT_NE(err.find("/no/such/corpus"), std::string::npos) << err;
}

TEST(TrainBinary, ALogFileUnderARegularFileIsAClearError) {
  const std::string file =
      (fs::temp_directory_path() / ("hap_not_a_dir_" + std::to_string(::getpid()))).string();
  std::ofstream(file) << "x";
  std::string err;
  EXPECT_EQ(run_binary("--config " + tiny_config() + " --set train.log_file=" + file + "/run.jsonl",
                       &err),
            1);
  EXPECT_NE(err.find("train.log_file: cannot write '" + file + "/run.jsonl'"), std::string::npos)
      << err;
  EXPECT_NE(err.find("'" + file + "' is not a directory"), std::string::npos) << err;
  EXPECT_EQ(err.find("internal error"), std::string::npos) << err;
  fs::remove(file);
}

TEST(TrainBinary, DivergingRunStopsAndNamesTheStep) {
  std::string err;
  EXPECT_EQ(run_binary("--config " + tiny_config() +
                           " --set train.lr=1e30 --set train.min_lr=1e30 --set train.grad_clip=0 "
                           "--set train.warmup_steps=0",
                       &err),
            1);
  EXPECT_NE(err.find("training diverged"), std::string::npos) << err;
  EXPECT_NE(err.find("at step"), std::string::npos) << err;
}

// hap-train under a real SIGTERM: exits 143 soon after, naming the step and the checkpoint.
TEST(TrainBinary, SigtermFinishesTheStepWritesACheckpointAndExits143) {
  const fs::path dir = fs::temp_directory_path() / ("hap_train_sig_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string err;
  const int rc = run_binary("--config " + tiny_config() +
                                " --set train.steps=10000000 --set train.warmup_steps=0 "
                                "--set train.checkpoint_dir=" +
                                (dir / "ck").string(),
                            &err, "timeout --preserve-status -s TERM 4 ");
  EXPECT_EQ(rc, 143) << err;
  EXPECT_HAS(err, "stopped by signal 15");
  const std::string newest = newest_checkpoint((dir / "ck").string());
  ASSERT_FALSE(newest.empty()) << err;
  EXPECT_HAS(err, "checkpoint " + newest);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hap::train
