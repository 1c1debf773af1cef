// Communicator: rank/size, splits, broadcast of plans, deterministic scalar reductions, the
// MPI error check, and the DType -> MPI datatype table.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "parallel/communicator.h"
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

TEST(Communicator, InvalidCommunicatorSaysSo) {
  Communicator none;
  EXPECT_FALSE(none.valid());
  EXPECT_HAS(testing::error_of([&] { (void)none.rank(); }), "invalid Communicator");
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
