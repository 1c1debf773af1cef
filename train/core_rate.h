// One CPU core's FLOP/s on this machine, for cluster files that state compute in cores
// (`flops_per_s: 0.8 cores`, train/cluster_config.h) rather than in absolute FLOP/s.
//
// Emulated clusters give each rank a share of a CPU core (scripts/hap-emulate), so their compute
// is a number of cores, and what a core does depends on the CPU model (the same machine kind
// differs by 2x between CPU generations). The rate is what hap-profile measures as `flops_per_s`
// (products' FLOPs over their share of a training step's time) for the default GPT of
// configs/gpt.yaml on 4 examples, on one unthrottled thread, so that hap-profile under a quota q
// confirms q times it.
//
// Where the rate comes from, first that applies:
//   1. HAP_CORE_FLOPS=<FLOP/s> in the environment (scripts/hap-emulate passes the rate it resolved
//      to every rank, so that ranks under CPU quotas never measure it throttled);
//   2. the cache file core-flops.json in $HAP_CACHE_DIR, else $XDG_CACHE_HOME/hap, else
//      $HOME/.cache/hap, under a key naming the CPU, the GEMM path and the vector kernels (what the
//      rate depends on), so one machine plans deterministically from run to run;
//   3. a measurement now (about 2 s), written to that cache (a cache that cannot be written is a
//      warning: the run goes on with the measured rate).
#pragma once
#include <string>

namespace hap::train {

struct CoreRate {
  double flops_per_s = 0;
  std::string source;  // "HAP_CORE_FLOPS", "cached in <file>", "measured (cached in <file>)", ...
};

// Resolved once per process (the first call measures if it must) and then the same.
// Throws ConfigError when HAP_CORE_FLOPS is set but not a number in [1e3, 1e18].
const CoreRate& core_rate();

// What core_rate() does, without the per-process memo (tests). `cache_dir` "" = the default.
CoreRate resolve_core_rate(const std::string& cache_dir = "");

// The cache's key for this machine and build: the CPU, its features, the GEMM path and the
// vector kernels (ops/cpu/blas.h gemm_description), and the calibration's version.
std::string core_rate_key();

// The folder of the cache file, from the environment as above ("" when none is set).
std::string default_cache_dir();

// The measurement itself (one thread, the default GPT on 4 examples, `window_s` of steps). It is
// hap-profile's compute measurement (defined beside it, in train/cluster_profile.cc), so that a
// profile under a quota q confirms q times it.
double measure_core_flops_per_s(double window_s = 1.5);

}  // namespace hap::train
