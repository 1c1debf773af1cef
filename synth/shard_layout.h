// Shard lengths of a program: how many elements of each sharded dimension every device holds.
// One place for the cost model's final prices (recost), the plan report and the executor, so
// that what is priced is what runs.
//
// Shards must agree wherever they meet: all Sharded operands of one computation split the same
// logical range, and a dimension merged by a reshape ([B, T] -> [B * T], heads x head size) is
// split in whole granules of the inner size. Each (tensor, dim) gets a granule; a computation's
// sharded operands share one (their least common multiple), and a reshape scales it by the
// merged size; iterated to a fixed point over the program's chosen signatures. The lengths are
// then the largest-remainder rounding (core/split.h) of a segment's ratios over whole granules.
#pragma once
#include <cstdint>
#include <vector>

#include "synth/graph.h"
#include "synth/program.h"

namespace hap::synth {

class ShardLayout {
 public:
  ShardLayout(const Graph& graph, const std::vector<Instruction>& instructions,
              std::vector<std::vector<double>> ratios);

  // The granule of tensor t's dimension `dim`: shards hold whole multiples of it.
  int64_t granule(int tensor, int64_t dim) const;
  // Every device's length of tensor t's dimension `dim` under segment `segment`'s ratios.
  std::vector<int64_t> lengths(int tensor, int64_t dim, int segment) const;
  // What each device really gets of that dimension: its length over the dimension's (the ratios
  // rounded to whole granules).
  std::vector<double> shares(int tensor, int64_t dim, int segment) const;
  // The same under other ratios (the granules are the program's whatever its ratios).
  std::vector<int64_t> lengths(int tensor, int64_t dim, const std::vector<double>& ratios) const;
  std::vector<double> shares(int tensor, int64_t dim, const std::vector<double>& ratios) const;

 private:
  const Graph& graph_;
  std::vector<std::vector<double>> ratios_;
  std::vector<std::vector<int64_t>> granule_;  // [tensor][dim]
};

}  // namespace hap::synth
