// Profiling helpers: the link fit recovers the latency and bandwidth that generated the times
// (with the cost model's own terms), timed collectives are real samples, collectives give the
// same results when ranks wait by sleeping, the GEMM rate is 2 n^3 over the median time, and a
// rank's usable memory is the node's available memory split between its ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include "parallel/profile.h"
#include "parallel_test_util.h"
#include "synth/cost_model.h"

namespace hap::parallel {
namespace {

using testing::world;

// Samples priced exactly as the cost model prices them, over a link of (lat, bw).
std::vector<CollectiveSample> synthetic(double lat, double bw, double noise, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> jitter(1 - noise, 1 + noise);
  std::vector<CollectiveSample> out;
  for (synth::InstrKind k : {synth::InstrKind::AllReduce, synth::InstrKind::AllGather,
                             synth::InstrKind::ReduceScatter, synth::InstrKind::AllToAll})
    for (CollectiveMethod m : {CollectiveMethod::Padded, CollectiveMethod::Grouped})
      for (double bytes : {4096.0, 65536.0, 1048576.0, 4194304.0})
        for (double share : {0.25, 0.5}) {
          CollectiveSample s;
          s.kind = k;
          s.method = m;
          s.group_size = 4;
          s.bytes = bytes;
          s.max_share = share;
          const CollectiveMethod sm = k == synth::InstrKind::AllReduce ? CollectiveMethod::None : m;
          const synth::CollectiveTerms t = synth::collective_terms(k, sm, 4, bytes, share);
          s.seconds = (t.latency_terms * lat + t.byte_terms / bw) * jitter(rng);
          out.push_back(s);
        }
  return out;
}

TEST(LinkFit, RecoversTheLinkThatGeneratedTheTimes) {
  const LinkFit exact = fit_link(synthetic(7e-5, 3e9, 0.0, 1));
  EXPECT_NEAR(exact.latency_s, 7e-5, 1e-12);
  EXPECT_NEAR(exact.bandwidth_bytes_per_s, 3e9, 1e-3);
  EXPECT_LT(exact.rms_relative_error, 1e-9);
  const LinkFit noisy = fit_link(synthetic(7e-5, 3e9, 0.1, 2));
  EXPECT_NEAR(noisy.latency_s, 7e-5, 1.5e-5);
  EXPECT_NEAR(noisy.bandwidth_bytes_per_s, 3e9, 0.5e9);
  EXPECT_GT(noisy.rms_relative_error, 0.01);
  EXPECT_LT(noisy.rms_relative_error, 0.1);
}

TEST(LinkFit, PureLatencyAndPureBandwidthStayNonNegative) {
  const LinkFit lat_only = fit_link(synthetic(1e-4, 1e30, 0.0, 3));
  EXPECT_NEAR(lat_only.latency_s, 1e-4, 1e-9);
  EXPECT_GT(lat_only.bandwidth_bytes_per_s, 1e12);
  const LinkFit bw_only = fit_link(synthetic(0.0, 2e9, 0.0, 4));
  EXPECT_GE(bw_only.latency_s, 0.0);
  EXPECT_NEAR(bw_only.bandwidth_bytes_per_s, 2e9, 1e3);
}

TEST(LinkFit, NeedsTwoSamples) {
  std::vector<CollectiveSample> one = synthetic(1e-5, 1e9, 0, 5);
  one.resize(1);
  EXPECT_THROW(fit_link(one), Error);
}

// Half of a tensor on rank 0, the rest shared evenly by the others (one rank: all of it).
std::vector<double> half_on_rank_0(int n) {
  std::vector<double> ratios(n, 1.0 / n);
  if (n > 1) {
    ratios.assign(n, 0.5 / (n - 1));
    ratios[0] = 0.5;
  }
  return ratios;
}

TEST(Profile, TimedCollectivesAreSamplesOfTheGroup) {
  const int n = world().size();
  const std::vector<double> ratios = half_on_rank_0(n);
  for (synth::InstrKind k : {synth::InstrKind::AllReduce, synth::InstrKind::AllGather,
                             synth::InstrKind::ReduceScatter, synth::InstrKind::AllToAll}) {
    const CollectiveSample s =
        time_collective(world(), k, CollectiveMethod::Padded, 65536, ratios, 2, 0.001);
    EXPECT_EQ(s.group_size, n);
    EXPECT_EQ(s.bytes, 65536.0);  // 64 rows of 256 floats
    EXPECT_GT(s.seconds, 0.0);
    EXPECT_NEAR(s.max_share, n > 1 ? 0.5 : 1.0, 1e-12);
    EXPECT_EQ(s.uneven, n > 2);
    // Every rank reports the same slowest-rank time.
    EXPECT_EQ(world().allreduce(s.seconds, ReduceOp::Max),
              world().allreduce(s.seconds, ReduceOp::Min));
  }
}

// Several collectives timed in rounds: one sample per collective, in order, each as
// time_collective describes it, the rounds reported as they end.
TEST(Profile, InterleavedCollectivesGiveOneSampleEachInOrder) {
  const int n = world().size();
  const std::vector<double> skewed = half_on_rank_0(n);
  const std::vector<double> even(n, 1.0 / n);
  const std::vector<CollectiveSpec> specs = {
      {synth::InstrKind::AllGather, CollectiveMethod::Grouped, 4096, skewed},
      {synth::InstrKind::AllReduce, CollectiveMethod::Grouped, 65536, even},
      {synth::InstrKind::AllToAll, CollectiveMethod::Padded, 65536, skewed}};
  std::vector<int> rounds;
  const std::vector<CollectiveSample> got = time_collectives(
      world(), specs, 3, 0.001, Device::cpu(), [&](int r) { rounds.push_back(r); });
  EXPECT_EQ(rounds, (std::vector<int>{0, 1, 2}));
  ASSERT_EQ(got.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const CollectiveSample one = time_collective(world(), specs[i].kind, specs[i].method,
                                                 specs[i].bytes, specs[i].ratios, 1, 0.001);
    EXPECT_EQ(got[i].kind, specs[i].kind) << i;
    EXPECT_EQ(got[i].method, specs[i].method) << i;
    EXPECT_EQ(got[i].bytes, one.bytes) << i;
    EXPECT_EQ(got[i].max_share, one.max_share) << i;
    EXPECT_EQ(got[i].uneven, one.uneven) << i;
    EXPECT_EQ(got[i].group_size, n) << i;
    EXPECT_GT(got[i].seconds, 0.0) << i;
    EXPECT_EQ(world().allreduce(got[i].seconds, ReduceOp::Max),
              world().allreduce(got[i].seconds, ReduceOp::Min));
  }
  EXPECT_THROW(time_collectives(world(), specs, 0), Error);
}

// A rank that computes longer before the call (here rank 0, 150 ms more) arrives late; the sample
// counts from its arrival, so the others' wait for it is not priced as the collective's (it is
// compute, which the cost model prices per device).
TEST(Profile, TimedCollectivesCountFromTheLastRanksArrival) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP() << "needs several ranks";
  const std::vector<double> ratios(n, 1.0 / n);
  const double late_s = 0.15;
  const CollectiveSample s =
      time_collective(world(), synth::InstrKind::AllReduce, CollectiveMethod::Grouped, 4096, ratios,
                      3, world().rank() == 0 ? 0.001 + late_s : 0.001);
  EXPECT_GT(s.seconds, 0.0);
  // Counted from each rank's own arrival, every sample would include the 150 ms wait.
  EXPECT_LT(s.seconds, late_s / 2);
  EXPECT_EQ(world().allreduce(s.seconds, ReduceOp::Max),
            world().allreduce(s.seconds, ReduceOp::Min));
}

// The share of an all-reduce that passes beside compute: the three medians it is made of, every
// rank reporting the same, and the share the cost model's pricing gives them.
TEST(Profile, OverlapIsTheCollectivesPaceBesideCompute) {
  const OverlapSample s = time_overlap(world(), 262144, 2);
  EXPECT_EQ(s.bytes, 262144.0);
  EXPECT_GT(s.collective_s, 0.0);
  EXPECT_GT(s.compute_s, 0.0);
  EXPECT_GT(s.together_s, 0.0);
  EXPECT_NEAR(s.overlap,
              std::clamp((s.collective_s + s.compute_s - s.together_s) / s.compute_s, 0.0, 1.0),
              1e-12);
  for (double v : {s.collective_s, s.compute_s, s.together_s, s.overlap})
    EXPECT_EQ(world().allreduce(v, ReduceOp::Max), world().allreduce(v, ReduceOp::Min));
  EXPECT_HAS(testing::error_of([] { time_overlap(world(), 262144, 0); }), "expected reps >= 1");
}

TEST(ProfileCompute, GemmRateIsTwoNCubedOverTheMedianTime) {
  const GemmRate g = profile_gemm(64, 3);
  EXPECT_EQ(g.n, 64);
  ASSERT_GT(g.median_s, 0.0);
  EXPECT_DOUBLE_EQ(g.flops_per_s, 2.0 * 64 * 64 * 64 / g.median_s);
  EXPECT_HAS(testing::error_of([] { profile_gemm(0, 1); }), "expected n >= 1");
}

// What the node can give each of its ranks: MemAvailable split between them, capped by this
// process's memory cgroup limit where one is set.
TEST(ProfileMemory, UsableMemoryIsTheNodesAvailableMemorySplitBetweenItsRanks) {
  auto mem_available = [] {
    std::ifstream meminfo("/proc/meminfo");
    std::string key, unit;
    double kb = 0;
    while (meminfo >> key >> kb) {
      std::getline(meminfo, unit);
      if (key == "MemAvailable:") return kb * 1024.0;
    }
    return 0.0;
  };
  double limit = std::numeric_limits<double>::infinity();
  for (const char* file :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(file);
    double v = 0;
    if (f >> v && v > 0) limit = std::min(limit, v);
  }
  for (int ranks : {1, 3}) {
    const double before = mem_available();
    const double usable = static_cast<double>(usable_memory_bytes(ranks));
    const double after = mem_available();
    ASSERT_GT(before, 0.0);
    // MemAvailable moves a little between the reads.
    const double lo = std::min(std::min(before, after) / ranks, limit),
                 hi = std::min(std::max(before, after) / ranks, limit);
    EXPECT_GE(usable, 0.98 * lo) << ranks << " ranks";
    EXPECT_LE(usable, 1.02 * hi) << ranks << " ranks";
  }
  EXPECT_HAS(testing::error_of([] { usable_memory_bytes(0); }), "ranks_on_node >= 1");
}

TEST(WaitPolicy, SleepingRanksGetTheSameSums) {
  const int n = world().size(), me = world().rank();
  Tensor x = Tensor::full({5, 3}, static_cast<double>(me + 1));
  const Tensor spun = all_reduce(world(), x);
  set_wait_policy(WaitPolicy::Sleep);
  const Tensor slept = all_reduce(world(), x);
  world().barrier();
  set_wait_policy(WaitPolicy::Spin);
  EXPECT_TRUE(testing::same_values(spun, slept));
  EXPECT_EQ(slept.to_vector()[0], n * (n + 1) / 2.0);
}

}  // namespace
}  // namespace hap::parallel
