// The NCCL backend (parallel/nccl.h) against the MPI backend: every collective on CUDA tensors,
// one GPU per rank, even and uneven layouts. These need as many GPUs as ranks (Skipped
// otherwise); without a GPU, making one is a clear error on every rank, none left waiting.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/functional.h"
#include "parallel/nccl.h"
#include "parallel_test_util.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#endif

namespace hap::parallel {
namespace {

using testing::world;

int visible_gpus() {
#ifdef HAP_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

// Why the NCCL tests cannot run here ("" when they can): they need a GPU per rank and NCCL.
std::string one_gpu_per_rank() {
  if (visible_gpus() >= world().size() && nccl_unavailable_reason().empty()) return "";
  return "needs one GPU per rank (" + std::to_string(visible_gpus()) + " visible for " +
         std::to_string(world().size()) + " ranks) and NCCL (" + nccl_unavailable_reason() + ")";
}

// Close to rounding (NCCL sums in its own order), exact for moves.
void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const std::vector<double> a = got.to(Device::cpu()).to_vector(), b = want.to_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * (1 + std::abs(b[i]))) << what << " element " << i;
}

TEST(Nccl, WithoutAGpuMakingOneIsAnErrorOnEveryRank) {
  if (visible_gpus() > 0) GTEST_SKIP() << "a GPU is visible";
  const std::string m =
      test_util::error_of([] { make_nccl_backend(world().backend_ptr(), world().rank()); });
  EXPECT_NE(m.find("NCCL"), std::string::npos) << m;
#ifdef HAP_HAVE_CUDA
  EXPECT_NE(m.find("rank " + std::to_string(world().rank())), std::string::npos) << m;
#endif
}

TEST(Nccl, TwoRanksOnOneGpuAreRefused) {
  if (world().size() < 2 || visible_gpus() < 1 || !nccl_unavailable_reason().empty())
    GTEST_SKIP() << "needs 2 ranks, a GPU and NCCL";
  EXPECT_NE(test_util::error_of([] {
              make_nccl_backend(world().backend_ptr(), 0);
            }).find("needs one GPU per rank"),
            std::string::npos);
}

TEST(Nccl, EveryCollectiveEqualsTheMpiBackends) {
  if (const std::string why = one_gpu_per_rank(); !why.empty()) GTEST_SKIP() << why;
  const int n = world().size(), r = world().rank();
  const Device gpu = Device::cuda(r);
  std::shared_ptr<Backend> nccl = make_nccl_backend(world().backend_ptr(), r);
  Backend& mpi = world().backend();
  EXPECT_EQ(nccl->name(), "nccl");
  EXPECT_TRUE(nccl->supports(gpu));
  auto values = [&](int64_t count, uint64_t salt) {
    return randn({count}, 200 + salt, static_cast<uint64_t>(r));
  };
  {
    const Tensor x = values(1001, 1);
    Tensor want = Tensor::empty({1001});
    mpi.all_reduce(x, want);
    Tensor got = Tensor::zeros({1001}, TensorOptions{}.with_device(gpu));
    nccl->all_reduce(x.to(gpu), got);
    expect_close(got, want, 1e-5, "all_reduce");
  }
  {
    Tensor want = values(77, 2), got = want.to(gpu);
    mpi.broadcast(want, n - 1);
    nccl->broadcast(got, n - 1);
    expect_close(got, want, 0, "broadcast");
  }
  std::vector<int64_t> counts(static_cast<size_t>(n));
  std::iota(counts.begin(), counts.end(), int64_t{3});
  for (const BlockLayout& layout :
       {BlockLayout::packed(std::vector<int64_t>(static_cast<size_t>(n), 5)),
        BlockLayout::packed(counts)}) {
    const bool even = layout.regular();
    SCOPED_TRACE(even ? "even blocks" : "uneven blocks");
    const Tensor mine = values(layout.counts[static_cast<size_t>(r)], 3);
    Tensor want = Tensor::empty({layout.total()});
    mpi.all_gather(mine, want, layout);
    Tensor got = Tensor::zeros({layout.total()}, TensorOptions{}.with_device(gpu));
    nccl->all_gather(mine.to(gpu), got, layout);
    expect_close(got, want, 0, "all_gather");

    const Tensor all = values(layout.total(), 4);
    Tensor want_rs = Tensor::empty({layout.counts[static_cast<size_t>(r)]});
    mpi.reduce_scatter(all, layout, want_rs);
    Tensor got_rs = Tensor::zeros(want_rs.shape(), TensorOptions{}.with_device(gpu));
    nccl->reduce_scatter(all.to(gpu), layout, got_rs);
    expect_close(got_rs, want_rs, 1e-5, "reduce_scatter");
  }
  {  // all_to_all: rank a sends a + b + 1 elements to rank b
    std::vector<int64_t> sc, rc;
    for (int p = 0; p < n; ++p) {
      sc.push_back(r + p + 1);
      rc.push_back(p + r + 1);
    }
    const BlockLayout send = BlockLayout::packed(sc), recv = BlockLayout::packed(rc);
    const Tensor in = values(send.total(), 5);
    Tensor want = Tensor::empty({recv.total()});
    mpi.all_to_all(in, send, want, recv);
    Tensor got = Tensor::zeros({recv.total()}, TensorOptions{}.with_device(gpu));
    nccl->all_to_all(in.to(gpu), send, got, recv);
    expect_close(got, want, 0, "all_to_all");
  }
  // Host tensors go through the host backend.
  Tensor host = Tensor::full({3}, 1.0);
  nccl->all_reduce(host, host);
  EXPECT_EQ(host.to_vector(), std::vector<double>(3, static_cast<double>(n)));
  nccl->barrier();
}

// Started collectives run on the backend's communication stream while the compute stream goes on
// (a product queued behind them here), and give the blocking collectives' results; once
// completed, kernels on the compute stream see their outputs.
TEST(Nccl, StartedCollectivesOnTheCommunicationStreamEqualTheBlockingOnes) {
  if (const std::string why = one_gpu_per_rank(); !why.empty()) GTEST_SKIP() << why;
  const int n = world().size(), r = world().rank();
  const Device gpu = Device::cuda(r);
  std::shared_ptr<Backend> nccl = make_nccl_backend(world().backend_ptr(), r);
  Backend& mpi = world().backend();
  EXPECT_TRUE(nccl->nonblocking_all_reduce());
  const TensorOptions on_gpu = TensorOptions{}.with_device(gpu);
  const Tensor a = randn({512, 512}, 7, static_cast<uint64_t>(r)).to(gpu);
  auto busy = [&] { return matmul(a, a); };  // compute-stream work while a collective is pending
  {
    const Tensor x = randn({100003}, 300, static_cast<uint64_t>(r));
    Tensor want = Tensor::empty({100003});
    mpi.all_reduce(x, want);
    Tensor got = Tensor::zeros({100003}, on_gpu);
    std::unique_ptr<PendingCollective> p = nccl->start_all_reduce(x.to(gpu), got);
    const Tensor product = busy();
    p->wait();
    EXPECT_TRUE(p->test());
    expect_close(got, want, 1e-5, "started all_reduce");
    expect_close(got * 2.0, want * 2.0, 1e-5, "a kernel after it reads its output");
    expect_close(product, matmul(a, a).to(Device::cpu()), 1e-5, "the product queued beside it");
  }
  std::vector<int64_t> counts(static_cast<size_t>(n));
  std::iota(counts.begin(), counts.end(), int64_t{1000});
  for (const BlockLayout& layout :
       {BlockLayout::packed(std::vector<int64_t>(static_cast<size_t>(n), 999)),
        BlockLayout::packed(counts)}) {
    SCOPED_TRACE(layout.regular() ? "even blocks" : "uneven blocks");
    const Tensor all = randn({layout.total()}, 301, static_cast<uint64_t>(r));
    Tensor want_rs = Tensor::empty({layout.counts[static_cast<size_t>(r)]});
    mpi.reduce_scatter(all, layout, want_rs);
    Tensor got_rs = Tensor::zeros(want_rs.shape(), on_gpu);
    std::unique_ptr<PendingCollective> rs = nccl->start_reduce_scatter(all.to(gpu), layout, got_rs);
    busy();
    while (!rs->test()) {
    }
    expect_close(got_rs, want_rs, 1e-5, "started reduce_scatter");

    Tensor want_ag = Tensor::empty({layout.total()});
    mpi.all_gather(want_rs, want_ag, layout);
    Tensor got_ag = Tensor::zeros({layout.total()}, on_gpu);
    std::unique_ptr<PendingCollective> ag = nccl->start_all_gather(got_rs, got_ag, layout);
    busy();
    ag->wait();
    expect_close(got_ag, want_ag, 1e-5, "started all_gather");
  }
  {  // dropped before completing: the compute stream still waits for it
    Tensor got = Tensor::zeros({4096}, on_gpu);
    nccl->start_all_reduce(Tensor::full({4096}, 1.0, on_gpu), got).reset();
    EXPECT_EQ(got.to(Device::cpu()).to_vector(), std::vector<double>(4096, static_cast<double>(n)));
  }
  nccl->barrier();
}

}  // namespace
}  // namespace hap::parallel
