// Communicator: rank/size, splits, broadcast of plans, deterministic scalar reductions, the
// backend interface as the only path of the collectives, the MPI error check, and the DType ->
// MPI datatype table.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "ops/functional.h"
#include "parallel/autograd_collectives.h"
#include "parallel/communicator.h"
#include "parallel/mpi.h"
#include "parallel_test_util.h"

namespace hap::parallel {
namespace {

using testing::world;

TEST(Communicator, ReportsTheSameRankAndSizeAsMpi) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world().rank(), rank);
  EXPECT_EQ(world().size(), size);
  EXPECT_TRUE(MpiSession::active());
}

TEST(Communicator, BroadcastStringDeliversTheRootsPlanToEveryRank) {
  const int root = world().size() - 1;
  std::string plan = world().rank() == root ? std::string("segment 0: ratios [0.5, 0.3, 0.2]\n") +
                                                  std::string(1000, 'x')
                                            : std::string("stale");
  std::string got = world().broadcast_string(plan, root);
  EXPECT_EQ(got.size(), 1034u);
  EXPECT_EQ(got.substr(0, 11), "segment 0: ");
  std::vector<uint8_t> empty;
  world().broadcast_bytes(empty, 0);
  EXPECT_TRUE(empty.empty());
}

TEST(Communicator, AllreduceOfDoublesIsTheRankOrderSumBitwiseOnEveryRank) {
  // Values whose sum depends on the order: 1e16 + 1 + ... loses the ones unless added first.
  const int n = world().size();
  double mine = world().rank() == 0 ? 1e16 : 1.0 + 1e-3 * world().rank();
  double expected = 1e16;
  for (int r = 1; r < n; ++r) expected = expected + (1.0 + 1e-3 * r);
  double got = world().allreduce(mine);
  EXPECT_EQ(got, expected);
  std::vector<double> everyones = world().allgather(got);
  for (double v : everyones) EXPECT_EQ(std::memcmp(&v, &got, sizeof v), 0);

  EXPECT_EQ(world().allreduce(static_cast<double>(world().rank()), ReduceOp::Max), n - 1.0);
  EXPECT_EQ(world().allreduce(static_cast<int64_t>(world().rank() + 5), ReduceOp::Min), 5);
  EXPECT_EQ(world().allreduce(int64_t{2}), 2 * n);
}

TEST(Communicator, SplitByColourGroupsRanksInKeyOrder) {
  const int me = world().rank();
  Communicator parity = world().split(me % 2, -me);  // reversed order inside each group
  ASSERT_TRUE(parity.valid());
  const int n = world().size();
  const int group_size = (n + (me % 2 == 0 ? 1 : 0)) / 2;
  EXPECT_EQ(parity.size(), group_size);
  EXPECT_EQ(parity.rank(), group_size - 1 - me / 2);
  // Collectives on the sub-communicator stay inside the group.
  EXPECT_EQ(parity.allreduce(int64_t{1}), group_size);

  Communicator only_zero = world().split(me == 0 ? 0 : -1);
  EXPECT_EQ(only_zero.valid(), me == 0);
  if (only_zero.valid()) {
    EXPECT_EQ(only_zero.size(), 1);
  }

  Communicator node = world().split_by_node();  // one machine: the node is the world
  EXPECT_EQ(node.size(), n);
  EXPECT_EQ(node.rank(), me);
  node.barrier();
}

// Waiting for an operation outside MPI (NCCL's, polled with its asynchronous errors): done
// when it says so, its own errors propagate, and the collective timeout bounds the wait with a
// CollectiveTimeout naming the call, the rank and the step, under either wait policy.
TEST(Communicator, WaitUntilPollsToDoneRethrowsAndTimesOut) {
  const double saved = collective_timeout();
  const WaitPolicy saved_policy = wait_policy();
  int polls = 0;
  wait_until([&] { return ++polls == 50; }, "test op");
  EXPECT_EQ(polls, 50);
  polls = 0;
  try {
    wait_until(
        [&] {
          HAP_CHECK(++polls < 3, "the peer failed");
          return false;
        },
        "test op");
    ADD_FAILURE() << "an error from the poll did not propagate";
  } catch (const CollectiveTimeout&) {
    ADD_FAILURE() << "an error from the poll became a timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the peer failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(polls, 3);
  for (const WaitPolicy policy : {WaitPolicy::Spin, WaitPolicy::Sleep}) {
    set_wait_policy(policy);
    set_collective_timeout(0.05);
    set_current_step(7);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      wait_until([] { return false; }, "NCCL all_reduce");
      ADD_FAILURE() << "a wait that never completes returned";
    } catch (const CollectiveTimeout& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("NCCL all_reduce on rank " + std::to_string(world().rank()) +
                       " did not complete within parallel.collective_timeout_s = 0.05 s at step 7"),
                std::string::npos)
          << m;
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, 0.05);
    EXPECT_LT(waited, 5.0);
  }
  set_current_step(-1);
  set_collective_timeout(saved);
  set_wait_policy(saved_policy);
}

TEST(Communicator, InvalidCommunicatorSaysSo) {
  Communicator none;
  EXPECT_FALSE(none.valid());
  EXPECT_HAS(testing::error_of([&] { (void)none.rank(); }), "invalid Communicator");
}

// A backend that forwards to the world's MPI backend and counts what it carries: collectives
// and the communicator's helpers built on a Communicator over it go through the interface only.
class CountingBackend : public Backend {
 public:
  explicit CountingBackend(std::shared_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::map<std::string, int> calls;
  std::string name() const override { return "counting"; }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool supports(const Device& d) const override { return inner_->supports(d); }
  std::shared_ptr<Backend> split(int colour, int key) override {
    return inner_->split(colour, key);
  }
  std::shared_ptr<Backend> split_by_node() override { return inner_->split_by_node(); }
  void barrier() override { ++calls["barrier"], inner_->barrier(); }
  void abort(int code) override { inner_->abort(code); }
  void send(const Tensor& t, int peer) override { ++calls["send"], inner_->send(t, peer); }
  void recv(const Tensor& t, int peer) override { ++calls["recv"], inner_->recv(t, peer); }
  void broadcast(const Tensor& t, int root) override {
    ++calls["broadcast"], inner_->broadcast(t, root);
  }
  void reduce(const Tensor& in, const Tensor& out, int root) override {
    ++calls["reduce"], inner_->reduce(in, out, root);
  }
  void all_gather(const Tensor& in, const Tensor& out, const BlockLayout& l) override {
    ++calls["all_gather"], inner_->all_gather(in, out, l);
  }
  void reduce_scatter(const Tensor& in, const BlockLayout& l, const Tensor& out) override {
    ++calls["reduce_scatter"], inner_->reduce_scatter(in, l, out);
  }
  void all_reduce(const Tensor& in, const Tensor& out) override {
    ++calls["all_reduce"], inner_->all_reduce(in, out);
  }
  void all_to_all(const Tensor& in, const BlockLayout& s, const Tensor& out,
                  const BlockLayout& r) override {
    ++calls["all_to_all"], inner_->all_to_all(in, s, out, r);
  }

 private:
  std::shared_ptr<Backend> inner_;
};

TEST(Backend, CollectivesAndTheirAdjointsGoThroughTheInterfaceOnly) {
  auto counting = std::make_shared<CountingBackend>(MpiBackend::world());
  const Communicator comm(counting);
  const int n = comm.size(), me = comm.rank();
  const std::vector<int64_t> lengths =
      shard_lengths(7, testing::ratios_for(n, testing::Split::Uneven));
  Tensor full = testing::logical_tensor({7, 3}, DType::F64, 5);
  Tensor mine = ShardSpec(0, lengths).slice_of(full, me).clone();
  for (CollectiveMethod m : testing::both_methods()) {
    EXPECT_TRUE(testing::same_values(all_gather(comm, mine, 0, lengths, m), full));
    EXPECT_TRUE(testing::close_values(
        reduce_scatter(comm, full, 0, lengths, m),
        ShardSpec(0, lengths).slice_of(full * static_cast<double>(n), me).clone(), 1e-15));
  }
  EXPECT_TRUE(testing::close_values(all_reduce(comm, full), full * static_cast<double>(n), 1e-15));
  Tensor x = mine.clone().set_requires_grad(true);
  hap::sum(functional::all_gather(comm, x, 0, lengths, CollectiveMethod::Grouped)).backward();
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(static_cast<size_t>(x.numel()), n));
  EXPECT_EQ(comm.allreduce(1.5), 1.5 * n);
  EXPECT_EQ(comm.broadcast_string(me == 0 ? "plan" : "", 0), "plan");
  comm.barrier();
  for (const char* c : {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"})
    EXPECT_GT(counting->calls[c], 0) << c;
}

int fails_with(int code) { return code; }

TEST(MpiCheck, NamesTheCallAndMpisErrorString) {
  try {
    HAP_MPI_CHECK(fails_with(MPI_ERR_TRUNCATE));
    ADD_FAILURE() << "no exception";
  } catch (const MpiError& e) {
    std::string m = e.what();
    EXPECT_HAS(m, "MPI error in fails_with(MPI_ERR_TRUNCATE)");
    EXPECT_HAS(m, "test_communicator.cc");
    EXPECT_HAS(m, "truncated");  // OpenMPI: "MPI_ERR_TRUNCATE: message truncated"
  }
  // A real failing call: errors return (MPI_ERRORS_RETURN) instead of aborting the job.
  try {
    int bad_root = world().size() + 7;
    int v = 0;
    HAP_MPI_CHECK(MPI_Bcast(&v, 1, MPI_INT, bad_root, mpi_handle(world())));
    ADD_FAILURE() << "no exception";
  } catch (const MpiError& e) {
    EXPECT_HAS(e.what(), "MPI_Bcast");
    EXPECT_HAS(e.what(), "root");
  }
}

TEST(MpiDatatype, MapsEveryDtypeAndCarriesBf16AsItsBits) {
  EXPECT_EQ(mpi_datatype(DType::F32), MPI_FLOAT);
  EXPECT_EQ(mpi_datatype(DType::F64), MPI_DOUBLE);
  EXPECT_EQ(mpi_datatype(DType::BF16), MPI_UINT16_T);
  EXPECT_EQ(mpi_datatype(DType::I64), MPI_INT64_T);
  EXPECT_EQ(mpi_datatype(DType::U8), MPI_UINT8_T);
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8}) {
    int size = 0;
    MPI_Type_size(mpi_datatype(t), &size);
    EXPECT_EQ(static_cast<size_t>(size), dtype_size(t)) << dtype_name(t);
  }
}

}  // namespace
}  // namespace hap::parallel
