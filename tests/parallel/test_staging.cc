// The staging backend (parallel/staging.h) carries device tensors over the MPI backend: every
// collective on tensors of a stand-in device (host memory behind the CUDA slot, counting its
// copies) gives exactly what the same collective gives on CPU tensors, through host copies, and
// leaves the elements a collective does not write as they were.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "core/allocator.h"
#include "core/rng.h"
#include "parallel/mpi.h"
#include "parallel/staging.h"
#include "parallel_test_util.h"
#include "tests/stand_in_device.h"

namespace hap::parallel {
namespace {

using testing::world;

class Staging : public ::testing::Test {
 protected:
  void SetUp() override { staged_ = std::make_shared<StagingBackend>(MpiBackend::world()); }
  // This rank's values, on the host and on the stand-in device.
  static Tensor values(const Shape& s, uint64_t salt) {
    return randn(s, 100 + salt, static_cast<uint64_t>(world().rank()));
  }
  static Tensor dev(const Tensor& t) { return t.to(kDevice); }
  static void expect_same(const Tensor& device, const Tensor& host, const char* what) {
    ASSERT_EQ(device.device(), kDevice) << what;
    EXPECT_EQ(device.to(Device::cpu()).to_vector(), host.to_vector()) << what;
  }

  static constexpr Device kDevice = Device{DeviceKind::CUDA, 0};
  hap::test_util::StandInDevice device_;  // host memory behind the CUDA slot, counted copies
  hap::test_util::StandInAllocator& allocator_ = device_.allocator;
  std::shared_ptr<StagingBackend> staged_;
};

TEST_F(Staging, SupportsTheHostAndRegisteredDevicesAndSaysWhatItStagesOver) {
  EXPECT_TRUE(staged_->supports(Device::cpu()));
  EXPECT_TRUE(staged_->supports(kDevice));
  EXPECT_EQ(staged_->name(), "mpi staged through the host");
  EXPECT_EQ(staged_->rank(), world().rank());
  EXPECT_EQ(staged_->size(), world().size());
  register_allocator(DeviceKind::CUDA, nullptr);
  EXPECT_FALSE(staged_->supports(kDevice)) << "no backend for the device type";
  register_allocator(DeviceKind::CUDA, &allocator_);
}

TEST_F(Staging, EveryCollectiveOnDeviceTensorsEqualsTheHostCollective) {
  Backend& host = world().backend();
  const int n = world().size(), r = world().rank();
  const int copies_before = hap::test_util::g_stand_in_copies;
  {  // all_reduce, out of place and in place
    const Tensor x = values({37, 3}, 1);
    Tensor want = Tensor::empty(x.shape());
    host.all_reduce(x, want);
    Tensor out = dev(Tensor::zeros(x.shape())), in = dev(x);
    staged_->all_reduce(in, out);
    expect_same(out, want, "all_reduce");
    staged_->all_reduce(in, in);
    expect_same(in, want, "all_reduce in place");
  }
  {  // broadcast from the last rank
    const Tensor x = values({11}, 2);
    Tensor want = x.clone();
    host.broadcast(want, n - 1);
    Tensor t = dev(x);
    staged_->broadcast(t, n - 1);
    expect_same(t, want, "broadcast");
  }
  {  // reduce to rank 0: other ranks' outputs stay as they were
    const Tensor x = values({5, 4}, 3);
    Tensor want = Tensor::full(x.shape(), 7.0);
    host.reduce(x, want, 0);
    Tensor out = dev(Tensor::full(x.shape(), 7.0));
    staged_->reduce(dev(x), out, 0);
    expect_same(out, want, "reduce");
  }
  // Uneven blocks: rank i holds i + 2 elements, packed, and a layout with gaps.
  std::vector<int64_t> counts(static_cast<size_t>(n));
  std::iota(counts.begin(), counts.end(), int64_t{2});
  const BlockLayout packed = BlockLayout::packed(counts);
  BlockLayout gappy_layout = BlockLayout::slots(static_cast<size_t>(n), int64_t{n + 3});
  gappy_layout.counts = counts;
  const BlockLayout& gappy = gappy_layout;
  for (const BlockLayout* layout : {&packed, &gappy}) {
    SCOPED_TRACE(layout == &packed ? "packed blocks" : "blocks with gaps");
    const Tensor mine = values({counts[static_cast<size_t>(r)]}, 4);
    Tensor want = Tensor::full({layout->total()}, -1.0);
    host.all_gather(mine, want, *layout);
    Tensor out = dev(Tensor::full({layout->total()}, -1.0));
    staged_->all_gather(dev(mine), out, *layout);
    expect_same(out, want, "all_gather (untouched elements keep their -1)");

    const Tensor all = values({layout->total()}, 5);
    Tensor want_rs = Tensor::empty({counts[static_cast<size_t>(r)]});
    host.reduce_scatter(all, *layout, want_rs);
    Tensor out_rs = dev(Tensor::zeros({counts[static_cast<size_t>(r)]}));
    staged_->reduce_scatter(dev(all), *layout, out_rs);
    expect_same(out_rs, want_rs, "reduce_scatter");
  }
  {  // all_to_all: rank a sends a + b + 1 elements to rank b; received blocks with gaps between
    std::vector<int64_t> send_counts, recv_counts;
    for (int p = 0; p < n; ++p) {
      send_counts.push_back(r + p + 1);
      recv_counts.push_back(p + r + 1);
    }
    const BlockLayout send = BlockLayout::packed(send_counts);
    BlockLayout recv = BlockLayout::slots(static_cast<size_t>(n), int64_t{2 * n + 1});
    recv.counts = recv_counts;
    const Tensor in = values({send.total()}, 7);
    Tensor want = Tensor::full({recv.total()}, -2.0);
    host.all_to_all(in, send, want, recv);
    Tensor out = dev(Tensor::full({recv.total()}, -2.0));
    staged_->all_to_all(dev(in), send, out, recv);
    expect_same(out, want, "all_to_all (the gaps keep their -2)");
  }
  if (n > 1) {  // a ring of sends and receives
    const Tensor x = values({9}, 6);
    Tensor got = dev(Tensor::zeros({9}));
    if (r % 2 == 0) {
      staged_->send(dev(x), (r + 1) % n);
      staged_->recv(got, (r + n - 1) % n);
    } else {
      staged_->recv(got, (r + n - 1) % n);
      staged_->send(dev(x), (r + 1) % n);
    }
    const Tensor want = randn({9}, 106, static_cast<uint64_t>((r + n - 1) % n));
    expect_same(got, want, "recv");
  }
  EXPECT_GT(hap::test_util::g_stand_in_copies, copies_before)
      << "device tensors went through host copies";
}

// The host buffers of device collectives are pinned host memory (from the pinned host allocator
// a device backend registers; CUDA's: cudaHostAlloc), every one released after; host tensors'
// collectives need none.
TEST_F(Staging, DeviceCollectivesStageThroughPinnedHostBuffers) {
  struct Pinned : hap::test_util::StandInAllocator {
    int blocks = 0;
    void* allocate(size_t nbytes, int index) override {
      ++blocks;
      return StandInAllocator::allocate(nbytes, index);
    }
  } pinned;
  Allocator* const saved = pinned_host_allocator();
  register_pinned_host_allocator(&pinned);
  {
    const Tensor x = values({29, 5}, 7);
    Tensor host_sum = Tensor::empty(x.shape());
    staged_->all_reduce(x, host_sum);
    EXPECT_EQ(pinned.blocks, 0) << "a host collective staged something";
    const Tensor d = dev(x);
    Tensor out = dev(Tensor::zeros(x.shape()));
    staged_->all_reduce(d, out);
    expect_same(out, host_sum, "all_reduce through pinned buffers");
    EXPECT_EQ(pinned.blocks, 2) << "one pinned block in, one out";
    const std::vector<int64_t> counts(static_cast<size_t>(world().size()), 15);
    const Tensor shard = dev(values({15}, 8));
    Tensor gathered = dev(Tensor::zeros({15 * world().size()}));
    staged_->all_gather(shard, gathered, BlockLayout::packed(counts));
    EXPECT_EQ(pinned.blocks, 4) << "one pinned block in, one out";
  }
  EXPECT_EQ(pinned.live, 0u) << "pinned buffers not released";
  // A pinned tensor outside staging: host memory all the same.
  {
    const Tensor p = Tensor::full({4}, 2.5, TensorOptions{}.with_pinned(true));
    EXPECT_TRUE(p.device().is_cpu());
    EXPECT_EQ(p.to_vector(), (std::vector<double>(4, 2.5)));
    EXPECT_EQ(pinned.blocks, 5);
  }
  register_pinned_host_allocator(saved);
  // Without a pinned allocator, pinned tensors are ordinary host memory.
  register_pinned_host_allocator(nullptr);
  EXPECT_EQ(Tensor::full({3}, 1.0, TensorOptions{}.with_pinned(true)).to_vector(),
            (std::vector<double>(3, 1.0)));
  register_pinned_host_allocator(saved);
}

TEST_F(Staging, SplitsStageTooAndARankLeftOutGetsNone) {
  const int r = world().rank();
  std::shared_ptr<Backend> half = staged_->split(r % 2, r);
  ASSERT_NE(half, nullptr);
  EXPECT_NE(half->name().find("staged through the host"), std::string::npos);
  EXPECT_TRUE(half->supports(kDevice));
  Tensor x = dev(Tensor::full({3}, 1.0));
  half->all_reduce(x, x);
  EXPECT_EQ(x.to(Device::cpu()).to_vector(),
            std::vector<double>(3, static_cast<double>(half->size())));
  EXPECT_EQ(staged_->split(r == 0 ? -1 : 0, r) == nullptr, r == 0);
}

}  // namespace
}  // namespace hap::parallel
