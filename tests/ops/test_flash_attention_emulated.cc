// The CUDA flash attention kernels (ops/cuda/flash_attention.cuh), their source run on the CPU
// through tests/cuda_emulation.h (threads, barriers and WMMA tiles emulated), against the CPU's
// attention op in f32 on the same bf16 operands. This checks the kernels' tiling, masks, online
// softmax, dropout indices and backward on machines without a GPU; the gpu suite runs the same
// source on a GPU (CudaFlashAttention in tests/gpu/test_cuda_bf16_route.cc).
#define HAP_CUDA_EMULATION
#include "tests/cuda_emulation.h"
// (the emulation first)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/cuda/flash_attention.cuh"
#include "ops/dispatch.h"
#include "tests/flash_attention_cases.h"

namespace hap {
namespace {

namespace flash = ops::cuda::flash;

const flash::bf16* bf(const Tensor& t) {
  EXPECT_EQ(t.dtype(), DType::BF16);
  return static_cast<const flash::bf16*>(t.raw_data());
}
flash::bf16* bf_out(Tensor& t) { return static_cast<flash::bf16*>(t.raw_data()); }

using flash_test::Case;

using flash_test::expect_close;
using flash_test::kAbs;
using flash_test::kRel;
using flash_test::largest;

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const Shape qs = {c.b, c.h, c.t, c.d}, vs = {c.b, c.h, c.t, c.dv};
  const flash_test::Operands in = flash_test::operands(c);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &go = in.go, &glse = in.glse, &keys = in.keys;
  const ops::AttentionAttrs& a = in.attrs;
  auto f32 = [](const Tensor& x) { return x.to(DType::F32); };
  const std::vector<Tensor> want =
      ops::call(ops::OpKind::Attention, {f32(q), f32(k), f32(v), keys}, a);

  flash::Params p;
  p.bh = c.b * c.h;
  p.t = c.t;
  p.heads = c.h;
  p.dh = c.d;
  p.dhv = c.dv;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  p.causal = c.causal;
  p.keys = keys.defined() ? keys.data<uint8_t>() : nullptr;
  if (c.dropout > 0) {
    p.dropout = true;
    p.seed = a.dropout.seed;
    p.stream = a.dropout.stream;
    p.keep = 1.0 - c.dropout;
    p.inv_keep = static_cast<float>(1.0 / p.keep);
    const Shape& l = a.dropout.slice.logical_shape;
    for (int i = 0; i < 4; ++i) p.offset[i] = a.dropout.slice.offset[static_cast<size_t>(i)];
    p.stride[3] = 1;
    for (int i = 2; i >= 0; --i) p.stride[i] = p.stride[i + 1] * l[static_cast<size_t>(i + 1)];
  }
  ASSERT_NE(flash::tile_head(c.d, c.dv), 0);
  Tensor o = Tensor::empty(vs, TensorOptions{}.with_dtype(DType::BF16));
  Tensor lse = Tensor::empty({c.b, c.h, c.t}, TensorOptions{}.with_dtype(DType::F32));
  // A copy of q one element into a larger buffer: a pointer 2 bytes past a 16-byte boundary.
  Tensor shifted = Tensor::zeros({q.numel() + 1}, TensorOptions{}.with_dtype(DType::BF16));
  if (c.misaligned)
    std::memcpy(static_cast<char*>(shifted.raw_data()) + 2, q.raw_data(),
                static_cast<size_t>(q.numel()) * 2);
  p.q = c.misaligned
            ? reinterpret_cast<const flash::bf16*>(static_cast<const char*>(shifted.raw_data()) + 2)
            : bf(q);
  p.k = bf(k);
  p.v = bf(v);
  p.o = bf_out(o);
  p.lse = static_cast<float*>(lse.raw_data());
  flash::forward(p);
  const double out_err = expect_close(o, want[0], kRel, kAbs, "output");
  const double lse_err = expect_close(lse, want[1], 1e-5, 1e-6, "log-sum-exp");
  if (c.nans) {
    int nan_rows = 0;  // not vacuous: the CPU's output has NaN rows
    for (double x : want[1].to(DType::F64).to_vector()) nan_rows += std::isnan(x);
    EXPECT_GE(nan_rows, 2);
    std::printf("%s: largest errors over max |want|: output %.2e, lse %.2e\n", c.name.c_str(),
                out_err, lse_err);
    return;
  }

  // The backward from the same o and lse on both sides (the kernels' own output, widened for the
  // CPU), so that it is checked alone.
  const std::vector<Tensor> gwant =
      ops::call(ops::OpKind::AttentionBackward,
                {f32(q), f32(k), f32(v), f32(o), lse, f32(go), glse, keys}, a);
  Tensor gq = Tensor::empty(qs, TensorOptions{}.with_dtype(DType::BF16));
  Tensor gk = Tensor::empty(qs, TensorOptions{}.with_dtype(DType::BF16));
  Tensor gv = Tensor::empty(vs, TensorOptions{}.with_dtype(DType::BF16));
  Tensor delta = Tensor::empty({c.b * c.h * c.t}, TensorOptions{}.with_dtype(DType::F32));
  p.go = bf(go);
  p.delta = static_cast<const float*>(delta.raw_data());
  p.gq = bf_out(gq);
  p.gk = bf_out(gk);
  p.gv = bf_out(gv);
  flash::backward(p, bf(o), static_cast<const float*>(glse.raw_data()),
                  static_cast<float*>(delta.raw_data()));
  const double dq_err = expect_close(gq, gwant[0], kRel, kAbs, "dq");
  const double dk_err = expect_close(gk, gwant[1], kRel, kAbs, "dk");
  const double dv_err = expect_close(gv, gwant[2], kRel, kAbs, "dv");
  std::printf(
      "%s: largest errors over max |want|: output %.2e, lse %.2e, dq %.2e, dk %.2e, dv %.2e\n",
      c.name.c_str(), out_err, lse_err, dq_err, dk_err, dv_err);
  // Not vacuous: the outputs and gradients are not all zero.
  EXPECT_GT(largest(o.to(DType::F32)), 0.1);
  EXPECT_GT(largest(gq.to(DType::F32)), 1e-3);
  EXPECT_GT(largest(gk.to(DType::F32)), 1e-3);
  EXPECT_GT(largest(gv.to(DType::F32)), 1e-3);
}

TEST(FlashAttentionEmulated, CausalOneTileMatchesTheCpu) {
  run_case({"causal, T=37, d=16", 2, 3, 37, 16, 16});
}

TEST(FlashAttentionEmulated, SeveralTilesWithAPartialOneMatchTheCpu) {
  run_case({"causal, T=150, d=64", 1, 2, 150, 64, 64});
  run_case({"not causal, T=150, d=64", 1, 2, 150, 64, 64, false});
}

TEST(FlashAttentionEmulated, HeadSizesThatAreNotTileWidthsArePadded) {
  run_case({"causal, T=70, d=8", 1, 2, 70, 8, 8});
  run_case({"not causal, T=70, d=40, dv=24", 1, 2, 70, 40, 24, false});
  run_case({"causal, T=70, d=12 (rows loaded element by element)", 1, 2, 70, 12, 12});
}

// The two widest tiles (96 and 128 columns): their padded rows and the most shared memory.
TEST(FlashAttentionEmulated, TheWidestTilesMatchTheCpu) {
  run_case({"causal, T=70, d=128", 1, 1, 70, 128, 128});
  run_case({"not causal, T=40, d=80, dv=96", 1, 1, 40, 80, 96, false});
}

// Operands that do not start 16-byte aligned (a view one element into its buffer) are loaded
// element by element.
TEST(FlashAttentionEmulated, UnalignedOperandsMatchTheCpu) {
  run_case({"causal, T=70, d=16, q one element in", 1, 2, 70, 16, 16, true, false, 0, true});
}

// A key padding mask, with rows that have no key to attend to (batch 1's first five, causal):
// zeros and a log-sum-exp of -inf, as on the CPU.
TEST(FlashAttentionEmulated, KeyMaskAndRowsWithNoKeyMatchTheCpu) {
  run_case({"causal, key mask", 2, 2, 80, 16, 16, true, true});
  run_case({"not causal, key mask", 2, 1, 80, 16, 16, false, true});
}

// The maximum skips NaN scores and a NaN score makes its row NaN, as on the CPU: a row of NaN
// scores, and a key whose scores are NaN in every row that may attend to it.
TEST(FlashAttentionEmulated, NanScoresMakeTheirRowsNanAsOnTheCpu) {
  Case c{"causal, NaN in q and k", 1, 2, 70, 16, 16};
  c.nans = true;
  run_case(c);
  c.causal = false;
  c.name = "not causal, NaN in q and k";
  run_case(c);
}

// Dropout draws the CPU's mask at the element's logical index (a slice of a larger tensor here).
TEST(FlashAttentionEmulated, DropoutDrawsTheCpusMask) {
  run_case({"causal, dropout 0.2", 1, 2, 70, 16, 16, true, false, 0.2});
  run_case({"not causal, key mask, dropout 0.3", 2, 1, 40, 32, 32, false, true, 0.3});
}

// The emulation holds kernels to WMMA's rules, as a GPU would (there: undefined results): a
// fragment 32-byte aligned, its leading dimension a multiple of 16 bytes, inside the block's
// shared memory, which may not exceed sm_80's limit.
__global__ void load_fragment_at(size_t offset, unsigned ldm) {
  HAP_DYNAMIC_SHARED(smem);
  flash::FragA a;
  nvcuda::wmma::load_matrix_sync(a, reinterpret_cast<const flash::bf16*>(smem + offset), ldm);
}

TEST(FlashAttentionEmulated, TheEmulationRefusesWhatWmmaForbids) {
  const size_t bytes = 16 * 24 * 2;  // 16 rows of 24 bf16
  auto load = [&](size_t offset, unsigned ldm, size_t shared) {
    cuda_emulation::launch(load_fragment_at, dim3(1), dim3(32), shared, offset, ldm);
  };
  EXPECT_NO_THROW(load(0, 24, bytes));
  EXPECT_NO_THROW(load(32, 16, bytes));
  auto refused = [&](size_t offset, unsigned ldm, size_t shared, const std::string& what) {
    try {
      load(offset, ldm, shared);
      ADD_FAILURE() << "no error for offset " << offset << ", ldm " << ldm;
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(16, 16, bytes, "not 32-byte aligned");
  refused(0, 12, bytes, "not a multiple of 16 bytes");
  refused(64, 24, bytes, "of shared memory");
  EXPECT_THROW(load(0, 24, cuda_emulation::kMaxSharedBytes + 1), std::invalid_argument);
}

TEST(FlashAttentionEmulated, HeadSizesBeyondTheTilesAreNotTaken) {
  EXPECT_EQ(flash::tile_head(129, 64), 0);
  EXPECT_EQ(flash::tile_head(64, 0), 0);
  EXPECT_EQ(flash::tile_head(64, 64), 64);
  EXPECT_EQ(flash::tile_head(72, 16), 96);
  EXPECT_EQ(flash::tile_head(1, 1), 16);
  EXPECT_EQ(flash::tile_head(128, 100), 128);
}

}  // namespace
}  // namespace hap
