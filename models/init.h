// Deterministic parameter initialisation. A parameter's values are drawn from the counter-based
// generator with (seed = the model seed, stream = FNV-1a 64 of the parameter's full dotted name),
// so they depend only on the seed and the name: not on construction order, and a shard that
// holds a slice of the parameter draws exactly that slice of the single-device values.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "core/rng.h"
#include "core/tensor.h"

namespace hap::nn {

// How one parameter is (re)initialised.
struct ParamInit {
  enum class Kind : uint8_t { Keep, Constant, Normal, Uniform };
  Kind kind = Kind::Keep;
  double a = 0;  // Constant: the value; Normal: the mean; Uniform: the lower bound
  double b = 0;  // Normal: the standard deviation; Uniform: the upper bound

  static ParamInit keep() { return {}; }  // leave the values as they are
  static ParamInit constant(double value) { return {Kind::Constant, value, 0}; }
  static ParamInit zeros() { return constant(0.0); }
  static ParamInit ones() { return constant(1.0); }
  static ParamInit normal(double mean, double std) { return {Kind::Normal, mean, std}; }
  static ParamInit uniform(double lo, double hi) { return {Kind::Uniform, lo, hi}; }

  std::string str() const;  // "normal(0, 0.02)"
  bool operator==(const ParamInit& o) const { return kind == o.kind && a == o.a && b == o.b; }
};

// FNV-1a, 64-bit.
uint64_t fnv1a64(std::string_view bytes);

// The generator stream of the parameter called `full_name` (e.g. "blocks.0.attn.qkv.weight").
inline uint64_t param_stream(std::string_view full_name) { return fnv1a64(full_name); }

// Draws `rule` into `local` (all of the parameter, or the part of it that `slice` says), without
// recording autograd history.
void init_parameter(const Tensor& local, const ParamInit& rule, uint64_t seed,
                    std::string_view full_name, const LogicalSlice& slice = {});

}  // namespace hap::nn
