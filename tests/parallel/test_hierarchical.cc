// The hierarchical collectives (parallel/hierarchical.h): for any grouping of the ranks into nodes
// (contiguous or not, uneven, one node, a node per rank), the all-reduce's every element is the
// sum over nodes, in node order, of each node's rank-order sum, bitwise, on every rank, and so is
// the reduce-scatter's of every block of any layout; the all-gather gives the flat one's bits; the
// started forms give the same bits; the functional collectives take the forms only with node
// groups attached.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ops/functional.h"
#include "parallel/collectives.h"
#include "parallel/hierarchical.h"
#include "parallel_test_util.h"
#include "tests/test_util.h"

namespace hap::parallel {
namespace {

using testing::world;

// Rank r's addend: magnitudes over five decades, so that the order of the sums shows in the bits.
double addend(int r, int64_t i) {
  return std::sin(0.37 * static_cast<double>(i) + 1.3 * r) *
         std::pow(10.0, static_cast<double>((i + r) % 5) - 2.0);
}

// Groupings of n ranks: labels per rank.
std::vector<std::pair<std::string, std::vector<int>>> groupings(int n) {
  std::vector<std::pair<std::string, std::vector<int>>> out;
  std::vector<int> one(n, 7), each(n), halves(n), parity(n), first_alone(n), last_alone(n);
  for (int r = 0; r < n; ++r) {
    each[r] = r;
    halves[r] = r < (n + 1) / 2 ? 0 : 1;
    parity[r] = r % 2;
    first_alone[r] = r == 0 ? 5 : 3;  // labels out of rank order: node 3 comes first
    last_alone[r] = r == n - 1 ? 1 : 0;
  }
  out.push_back({"one node", one});
  out.push_back({"a node per rank", each});
  out.push_back({"two halves", halves});
  out.push_back({"odd and even ranks", parity});
  out.push_back({"rank 0 alone, labelled last", first_alone});
  out.push_back({"the last rank alone", last_alone});
  return out;
}

template <typename T>
std::vector<T> expected_sums(const std::vector<int>& labels, int64_t n) {
  std::map<int, std::vector<int>> nodes;  // by label: ranks in rank order
  for (int r = 0; r < static_cast<int>(labels.size()); ++r) nodes[labels[r]].push_back(r);
  std::vector<T> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    bool first_node = true;
    T total = 0;
    for (const auto& [label, ranks] : nodes) {
      T node_sum = static_cast<T>(addend(ranks[0], i));
      for (size_t k = 1; k < ranks.size(); ++k)
        node_sum = node_sum + static_cast<T>(addend(ranks[k], i));
      total = first_node ? node_sum : total + node_sum;
      first_node = false;
    }
    out[static_cast<size_t>(i)] = total;
  }
  return out;
}

template <typename T>
void check_sums(DType dtype) {
  const int n = world().size();
  for (const auto& [what, labels] : groupings(n)) {
    SCOPED_TRACE(what);
    const auto groups = group_by_node(world(), labels);
    for (int64_t numel :
         {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{7}, int64_t{1000}, int64_t{4099}}) {
      SCOPED_TRACE("numel " + std::to_string(numel));
      std::vector<double> mine(static_cast<size_t>(numel));
      for (int64_t i = 0; i < numel; ++i) mine[static_cast<size_t>(i)] = addend(world().rank(), i);
      const Tensor in = Tensor::from_vector(mine, {numel}, TensorOptions{}.with_dtype(dtype));
      const std::vector<T> want = expected_sums<T>(labels, numel);
      const size_t bytes = static_cast<size_t>(numel) * sizeof(T);
      Tensor out = Tensor::empty({numel}, TensorOptions{}.with_dtype(dtype));
      hierarchical_all_reduce(groups, in, out);
      EXPECT_EQ(std::memcmp(out.raw_data(), want.data(), bytes), 0) << "blocking";
      Tensor started = Tensor::empty({numel}, TensorOptions{}.with_dtype(dtype));
      auto pending = start_hierarchical_all_reduce(groups, in, started);
      while (!pending->test()) {
      }
      EXPECT_EQ(std::memcmp(started.raw_data(), want.data(), bytes), 0) << "started";
      Tensor waited = Tensor::empty({numel}, TensorOptions{}.with_dtype(dtype));
      start_hierarchical_all_reduce(groups, in, waited)->wait();
      EXPECT_EQ(std::memcmp(waited.raw_data(), want.data(), bytes), 0) << "waited";
    }
  }
}

TEST(HierarchicalAllReduce, IsEachNodesRankOrderSumSummedInNodeOrderBitwise) {
  check_sums<float>(DType::F32);
  check_sums<double>(DType::F64);
}

// bf16 sums are accumulated in f32 inside each phase; the result agrees with the exact sum to
// bf16's precision and is bitwise the same on every rank.
TEST(HierarchicalAllReduce, Bf16IsCloseToTheExactSumAndTheSameOnEveryRank) {
  const int n = world().size();
  const int64_t numel = 777;
  for (const auto& [what, labels] : groupings(n)) {
    SCOPED_TRACE(what);
    const auto groups = group_by_node(world(), labels);
    std::vector<double> mine(numel);
    for (int64_t i = 0; i < numel; ++i) mine[static_cast<size_t>(i)] = addend(world().rank(), i);
    const Tensor in = Tensor::from_vector(mine, {numel}, TensorOptions{}.with_dtype(DType::BF16));
    Tensor out = Tensor::empty({numel}, TensorOptions{}.with_dtype(DType::BF16));
    hierarchical_all_reduce(groups, in, out);
    const Tensor got = out.to(DType::F64);
    const double* g = static_cast<const double*>(got.raw_data());
    // Each rank's addends as bf16 holds them.
    std::vector<Tensor> held;
    for (int r = 0; r < n; ++r) {
      std::vector<double> v(static_cast<size_t>(numel));
      for (int64_t i = 0; i < numel; ++i) v[static_cast<size_t>(i)] = addend(r, i);
      held.push_back(
          Tensor::from_vector(v, {numel}, TensorOptions{}.with_dtype(DType::BF16)).to(DType::F64));
    }
    double worst = 0;
    for (int64_t i = 0; i < numel; ++i) {
      double exact = 0, scale = 0;
      for (int r = 0; r < n; ++r) {
        const double a = static_cast<const double*>(held[static_cast<size_t>(r)].raw_data())[i];
        exact += a;
        scale += std::abs(a);
      }
      worst = std::max(worst, std::abs(g[i] - exact) / std::max(scale, 1e-30));
    }
    EXPECT_LE(worst, 2 * 0.00390625) << "relative to the sum of magnitudes (two bf16 roundings)";
    uint64_t h = 1469598103934665603ull;
    const auto* bytes = static_cast<const unsigned char*>(out.raw_data());
    for (int64_t b = 0; b < numel * 2; ++b) h = (h ^ bytes[b]) * 1099511628211ull;
    for (int64_t other : world().allgather(static_cast<int64_t>(h >> 1)))
      EXPECT_EQ(other, static_cast<int64_t>(h >> 1)) << "ranks disagree";
  }
}

// Block layouts over n ranks: uneven packed blocks, some of them empty, all empty, the padded
// methods' slots, and blocks with gaps between them and out of rank order.
std::vector<std::pair<std::string, BlockLayout>> layouts(int n) {
  std::vector<int64_t> uneven(n), some_empty(n), none(n, 0);
  for (int r = 0; r < n; ++r) {
    uneven[r] = 3 + 5 * r + (r % 2 == 0 ? 17 : 0);
    some_empty[r] = r % 2 == 1 ? 0 : 4 + r;
  }
  BlockLayout gaps;
  int64_t at = 2;
  for (int r = n - 1; r >= 0; --r) {  // the last rank's block first
    gaps.counts.insert(gaps.counts.begin(), 6 + r);
    gaps.displs.insert(gaps.displs.begin(), at);
    at += 6 + r + 3;
  }
  return {{"uneven", BlockLayout::packed(uneven)},
          {"some empty", BlockLayout::packed(some_empty)},
          {"all empty", BlockLayout::packed(none)},
          {"slots", BlockLayout::slots(static_cast<size_t>(n), 9)},
          {"gaps, out of rank order", gaps}};
}

template <typename T>
void check_gathers(DType dtype) {
  const int n = world().size(), me = world().rank();
  const TensorOptions options = TensorOptions{}.with_dtype(dtype);
  for (const auto& [what, labels] : groupings(n)) {
    const auto groups = group_by_node(world(), labels);
    for (const auto& [shape, layout] : layouts(n)) {
      SCOPED_TRACE(what + ", " + shape);
      const int64_t total = layout.total();
      const int64_t mine = layout.counts[static_cast<size_t>(me)];
      const size_t bytes = static_cast<size_t>(total) * sizeof(T);
      // The all-gather: the flat one's bits, gaps untouched.
      std::vector<double> block(static_cast<size_t>(mine));
      for (int64_t i = 0; i < mine; ++i) block[static_cast<size_t>(i)] = addend(me, i);
      const Tensor in = Tensor::from_vector(block, {mine}, options);
      const Tensor flat = Tensor::zeros({total}, options);
      world().backend().all_gather(in, flat, layout);
      const Tensor out = Tensor::zeros({total}, options);
      start_hierarchical_all_gather(groups, in, out, layout)->wait();
      EXPECT_EQ(std::memcmp(out.raw_data(), flat.raw_data(), bytes), 0) << "all-gather";
      const Tensor started = Tensor::zeros({total}, options);
      auto pending = start_hierarchical_all_gather(groups, in, started, layout);
      while (!pending->test()) {
      }
      EXPECT_EQ(std::memcmp(started.raw_data(), flat.raw_data(), bytes), 0) << "all-gather, tested";
      // The reduce-scatter: this rank's block of the node-order sum of node sums.
      std::vector<double> whole(static_cast<size_t>(total));
      for (int64_t i = 0; i < total; ++i) whole[static_cast<size_t>(i)] = addend(me, i);
      const Tensor partial = Tensor::from_vector(whole, {total}, options);
      const std::vector<T> sums = expected_sums<T>(labels, total);
      const std::vector<T> want(sums.begin() + layout.displs[static_cast<size_t>(me)],
                                sums.begin() + layout.displs[static_cast<size_t>(me)] + mine);
      const Tensor scattered = Tensor::empty({mine}, options);
      start_hierarchical_reduce_scatter(groups, partial, layout, scattered)->wait();
      EXPECT_EQ(std::memcmp(scattered.raw_data(), want.data(), want.size() * sizeof(T)), 0)
          << "reduce-scatter";
      const Tensor tested = Tensor::empty({mine}, options);
      auto scatter = start_hierarchical_reduce_scatter(groups, partial, layout, tested);
      while (!scatter->test()) {
      }
      EXPECT_EQ(std::memcmp(tested.raw_data(), want.data(), want.size() * sizeof(T)), 0)
          << "reduce-scatter, tested";
    }
  }
}

TEST(HierarchicalGathers, AllGatherIsTheFlatOnesBitsAndReduceScatterSumsEachNodeFirst) {
  check_gathers<float>(DType::F32);
  check_gathers<double>(DType::F64);
}

// The functional all_gather and reduce_scatter (and their bucketed forms) take the hierarchical
// form over the node groups attached to the communicator: the all-gather the grouped one's bits,
// the reduce-scatter the rows of the hierarchical all-reduce, along a leading and an inner dim.
TEST(HierarchicalGathers, TheFunctionalFormsRunOverTheNodeGroups) {
  const int n = world().size(), me = world().rank();
  std::vector<int> labels(n);
  for (int r = 0; r < n; ++r) labels[r] = r % 2;
  const Communicator grouped = world().with_node_groups(group_by_node(world(), labels));
  std::vector<int64_t> lengths(n);
  for (int r = 0; r < n; ++r) lengths[r] = (r * 3 + 2) % 5;  // some zero where n > 1
  int64_t sum = 0;
  for (int64_t len : lengths) sum += len;
  for (int64_t dim : {int64_t{0}, int64_t{1}}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    const Shape local = dim == 0 ? Shape{lengths[me], 3} : Shape{3, lengths[me]};
    std::vector<double> v(static_cast<size_t>(shape_numel(local)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = addend(me, static_cast<int64_t>(i));
    const Tensor x = Tensor::from_vector(v, local);
    const Tensor a = all_gather(grouped, x, dim, lengths, CollectiveMethod::Hierarchical);
    const Tensor b = all_gather(world(), x, dim, lengths, CollectiveMethod::Grouped);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(),
                          static_cast<size_t>(b.numel()) * sizeof(float)),
              0);
    const std::vector<Tensor> many = all_gather_many(
        grouped, {x, x}, {{dim, lengths}, {dim, lengths}}, CollectiveMethod::Hierarchical);
    for (const Tensor& m : many)
      EXPECT_EQ(std::memcmp(m.contiguous().raw_data(), b.contiguous().raw_data(),
                            static_cast<size_t>(b.numel()) * sizeof(float)),
                0);
    const Shape full = dim == 0 ? Shape{sum, 3} : Shape{3, sum};
    std::vector<double> w(static_cast<size_t>(shape_numel(full)));
    for (size_t i = 0; i < w.size(); ++i) w[i] = addend(me, static_cast<int64_t>(i));
    const Tensor partial = Tensor::from_vector(w, full);
    const Tensor reduced = all_reduce(grouped, partial, CollectiveMethod::Hierarchical);
    int64_t start = 0;
    for (int r = 0; r < me; ++r) start += lengths[r];
    const Tensor want = hap::narrow(reduced, dim, start, lengths[me]).contiguous();
    const Tensor got =
        reduce_scatter(grouped, partial, dim, lengths, CollectiveMethod::Hierarchical);
    ASSERT_EQ(got.shape(), want.shape());
    EXPECT_EQ(std::memcmp(got.contiguous().raw_data(), want.raw_data(),
                          static_cast<size_t>(want.numel()) * sizeof(float)),
              0);
  }
}

// all_reduce(comm, x, Hierarchical) runs over the node groups attached to the communicator and
// equals hierarchical_all_reduce; without them, or for an all-to-all, it is refused.
TEST(HierarchicalAllReduce, TheFunctionalFormNeedsNodeGroupsAndAllToAllHasNone) {
  const int n = world().size();
  std::vector<int> labels(n);
  for (int r = 0; r < n; ++r) labels[r] = r < (n + 1) / 2 ? 0 : 1;
  const int64_t numel = 301;
  std::vector<double> mine(numel);
  for (int64_t i = 0; i < numel; ++i) mine[static_cast<size_t>(i)] = addend(world().rank(), i);
  const Tensor x = Tensor::from_vector(mine, {numel});
  EXPECT_HAS(test_util::error_of([&] { all_reduce(world(), x, CollectiveMethod::Hierarchical); }),
             "needs the ranks' nodes");
  const Communicator grouped = world().with_node_groups(group_by_node(world(), labels));
  const Tensor y = all_reduce(grouped, x, CollectiveMethod::Hierarchical);
  const std::vector<float> want = expected_sums<float>(labels, numel);
  EXPECT_EQ(std::memcmp(y.raw_data(), want.data(), want.size() * sizeof(float)), 0);
  const std::vector<int64_t> lengths(n, numel);
  EXPECT_HAS(test_util::error_of(
                 [&] { all_gather(world(), x, 0, lengths, CollectiveMethod::Hierarchical); }),
             "needs the ranks' nodes");
  const Tensor square = Tensor::zeros({n, n});
  const std::vector<int64_t> ones(n, 1);
  EXPECT_HAS(test_util::error_of([&] {
               all_to_all(grouped, square, 0, 1, ones, ones, CollectiveMethod::Hierarchical);
             }),
             "have a hierarchical form");
  EXPECT_HAS(test_util::error_of([&] { group_by_node(world(), std::vector<int>(n + 1, 0)); }),
             "expected one per rank");
}

}  // namespace
}  // namespace hap::parallel
