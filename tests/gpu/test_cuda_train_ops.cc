// The CUDA kernels of the ops a training step needs beyond arithmetic, against the CPU: random
// ops (dropout and mask_tokens draw the CPU's numbers exactly, on the whole tensor and on a
// shard's slice), embedding and its deterministic backward (bitwise the CPU's), masked_fill,
// train_eval_select, attention with its backward, the fused optimizer updates and the sum of
// squares. Each test skips without a visible GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using ops::OpKind;
using namespace gpu_test;

Tensor ids_tensor(const std::vector<int64_t>& v, const Shape& s) {
  return Tensor::from_vector(v, s);
}

TEST(CudaTrainOps, DropoutAndMaskTokensDrawTheCpusNumbers) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor block = randn({9, 37, 5}, 1, 0, f64()).to(d);
    const Tensor x = block.as_strided({5, 37, 9}, {1, 5, 185}, 0);  // a transposed view
    const Tensor xg = same_view_on_gpu(x);
    ops::RandomAttrs a{0.3, 77, 5, {}};
    // The product mask * x * scale is computed in the same order: equal bit for bit.
    expect_equal(ops::call1(OpKind::Dropout, {xg}, a), ops::call1(OpKind::Dropout, {x}, a),
                 "whole tensor");
    // A shard: rows 11..29 of the logical [5, 50, 9] tensor.
    a.slice = LogicalSlice{{5, 50, 9}, {0, 11, 0}};
    const Tensor part = randn({5, 19, 9}, 2, 0, f64()).to(d);
    expect_equal(ops::call1(OpKind::Dropout, {part.to(kGpu)}, a),
                 ops::call1(OpKind::Dropout, {part}, a), "a shard's slice");
  }
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 7 * 41; ++i) ids.push_back((i * 13) % 100);
  const Tensor t = ids_tensor(ids, {7, 41});
  for (bool targets : {false, true}) {
    ops::MaskTokensAttrs m;
    m.p = 0.25;
    m.mask_id = 99;
    m.vocab = 100;
    m.targets = targets;
    m.seed = 3;
    m.stream = 8;
    expect_equal(ops::call1(OpKind::MaskTokens, {t.to(kGpu)}, m),
                 ops::call1(OpKind::MaskTokens, {t}, m), targets ? "targets" : "inputs");
  }
}

TEST(CudaTrainOps, EmbeddingAndItsBackwardEqualTheCpuBitForBit) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor w = randn({53, 19}, 3, 0, f64()).to(d);
    std::vector<int64_t> v;
    for (int64_t i = 0; i < 6 * 33; ++i) v.push_back((i * i + 7) % 53);  // many repeats
    const Tensor ids = ids_tensor(v, {6, 33});
    expect_equal(ops::call1(OpKind::Embedding, {w.to(kGpu), ids.to(kGpu)}),
                 ops::call1(OpKind::Embedding, {w, ids}), "lookup");
    // A vocabulary shard holding rows [20, 40): other ids give zeros.
    const Tensor ws = w.as_strided({20, 19}, {19, 1}, 20 * 19).contiguous();
    const ops::SliceAttrs shard{0, 20, 40};
    expect_equal(ops::call1(OpKind::Embedding, {ws.to(kGpu), ids.to(kGpu)}, shard),
                 ops::call1(OpKind::Embedding, {ws, ids}, shard), "a vocabulary shard");
    const Tensor g = randn({6, 33, 19}, 4, 0, f64()).to(d);
    for (const ops::ScatterAttrs& a :
         {ops::ScatterAttrs{0, 0, {53, 19}}, ops::ScatterAttrs{0, 20, {20, 19}}}) {
      expect_equal(ops::call1(OpKind::EmbeddingBackward, {g.to(kGpu), ids.to(kGpu)}, a),
                   ops::call1(OpKind::EmbeddingBackward, {g, ids}, a),
                   "backward from row " + std::to_string(a.start));
    }
  }
  const Tensor w = randn({5, 3}, 5).to(kGpu);
  EXPECT_HAS(test_util::error_of([&] {
               ops::call1(OpKind::Embedding, {w, ids_tensor({1, 5}, {2}).to(kGpu)});
             }),
             "embedding: id 5 at position 1 is out of range for a vocabulary of 5 rows");
}

TEST(CudaTrainOps, MaskedFillAndTrainEvalSelectMatchTheCpu) {
  HAP_REQUIRE_GPU();
  const Tensor x = randn({4, 7, 9}, 6);
  std::vector<int64_t> bits;
  for (int i = 0; i < 7 * 9; ++i) bits.push_back(i % 3 == 0);
  const Tensor mask = ids_tensor(bits, {7, 9}).to(DType::U8);  // broadcast over dim 0
  expect_equal(ops::call1(OpKind::MaskedFill, {x.to(kGpu), mask.to(kGpu)}, ops::ScalarAttrs{-1e9}),
               ops::call1(OpKind::MaskedFill, {x, mask}, ops::ScalarAttrs{-1e9}), "masked_fill");
  const Tensor y = randn({4, 7, 9}, 7);
  expect_equal(ops::call1(OpKind::TrainEvalSelect, {x.to(kGpu), y.to(kGpu)}),
               ops::call1(OpKind::TrainEvalSelect, {x, y}), "train_eval_select");
}

TEST(CudaTrainOps, AttentionAndItsBackwardMatchTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // The scores are summed by cuBLAS in another order and the CPU's exp is a polynomial
    // (exp_fast, ~1 ulp): f32 agrees to ~1e-5 relative after two GEMMs and a softmax.
    const double rtol = d == DType::F64 ? 1e-10 : 2e-4, atol = d == DType::F64 ? 1e-10 : 2e-5;
    const int64_t b = 2, h = 3, t = 37, dh = 11, dv = 13;
    auto normal = [&](const Shape& s, uint64_t seed) { return randn(s, seed, 0, f64()).to(d); };
    // q as heads permuted from [B, T, H, D] (a strided view), k and v contiguous.
    const Tensor q_btd = normal({b, t, h, dh}, 10);
    const Tensor q = q_btd.as_strided({b, h, t, dh}, {t * h * dh, dh, h * dh, 1}, 0);
    const Tensor k = normal({b, h, t, dh}, 11), v = normal({b, h, t, dv}, 12);
    std::vector<int64_t> keep;
    for (int64_t i = 0; i < b * t; ++i) keep.push_back(i % 5 != 2);
    const Tensor keys = ids_tensor(keep, {b, t}).to(DType::U8);
    const Tensor go = normal({b, h, t, dv}, 13), glse = normal({b, h, t}, 14);
    for (bool causal : {true, false}) {
      for (double p : {0.0, 0.2}) {
        for (bool masked : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(d)) + (causal ? " causal" : " full") + " dropout " +
                       std::to_string(p) + (masked ? " key mask" : ""));
          ops::AttentionAttrs a;
          a.causal = causal;
          a.dropout = ops::RandomAttrs{p, 9, 4, {}};
          const Tensor km = masked ? keys : Tensor();
          const Tensor km_g = masked ? keys.to(kGpu) : Tensor();
          const std::vector<Tensor> want = ops::call(OpKind::Attention, {q, k, v, km}, a);
          const std::vector<Tensor> got =
              ops::call(OpKind::Attention, {same_view_on_gpu(q), k.to(kGpu), v.to(kGpu), km_g}, a);
          expect_close(got[0], want[0], rtol, atol, "out");
          expect_close(got[1], want[1], rtol, atol, "lse");
          const std::vector<Tensor> gw =
              ops::call(OpKind::AttentionBackward, {q, k, v, want[0], want[1], go, glse, km}, a);
          const std::vector<Tensor> gg =
              ops::call(OpKind::AttentionBackward,
                        {same_view_on_gpu(q), k.to(kGpu), v.to(kGpu), want[0].to(kGpu),
                         want[1].to(kGpu), go.to(kGpu), glse.to(kGpu), km_g},
                        a);
          expect_close(gg[0], gw[0], rtol, atol, "dq");
          expect_close(gg[1], gw[1], rtol, atol, "dk");
          expect_close(gg[2], gw[2], rtol, atol, "dv");
        }
      }
    }
  }
}

// The (batch, head) pairs run in chunks whose score buffers fit the scratch budget
// (HAP_ATTENTION_SCRATCH_BYTES): with room for 4 of the 6 pairs (chunks of 4 and 2) and for
// less than one (chunks of 1), the results match the CPU as in one chunk. A budget that is not a
// positive number of bytes is an error naming the variable.
TEST(CudaTrainOps, AttentionInChunksOfPairsMatchesTheCpu) {
  HAP_REQUIRE_GPU();
  const int64_t b = 2, h = 3, t = 29, dh = 8, dv = 5;
  const Tensor q = randn({b, h, t, dh}, 20), k = randn({b, h, t, dh}, 21);
  const Tensor v = randn({b, h, t, dv}, 22), go = randn({b, h, t, dv}, 23);
  const Tensor glse = randn({b, h, t}, 24);
  ops::AttentionAttrs a;
  a.dropout = ops::RandomAttrs{0.1, 5, 2, {}};
  const std::vector<Tensor> want = ops::call(OpKind::Attention, {q, k, v, Tensor()}, a);
  const std::vector<Tensor> gw =
      ops::call(OpKind::AttentionBackward, {q, k, v, want[0], want[1], go, glse, Tensor()}, a);
  const char* var = "HAP_ATTENTION_SCRATCH_BYTES";
  for (const double pairs : {4.5, 0.5}) {
    SCOPED_TRACE("room for " + std::to_string(pairs) + " pairs");
    ::setenv(var, std::to_string(static_cast<int64_t>(pairs * t * t * 4)).c_str(), 1);
    const std::vector<Tensor> got =
        ops::call(OpKind::Attention, {q.to(kGpu), k.to(kGpu), v.to(kGpu), Tensor()}, a);
    const std::vector<Tensor> gg =
        ops::call(OpKind::AttentionBackward,
                  {q.to(kGpu), k.to(kGpu), v.to(kGpu), want[0].to(kGpu), want[1].to(kGpu),
                   go.to(kGpu), glse.to(kGpu), Tensor()},
                  a);
    ::unsetenv(var);
    expect_close(got[0], want[0], 2e-4, 2e-5, "out");
    expect_close(got[1], want[1], 2e-4, 2e-5, "lse");
    expect_close(gg[0], gw[0], 2e-4, 2e-5, "dq");
    expect_close(gg[1], gw[1], 2e-4, 2e-5, "dk");
    expect_close(gg[2], gw[2], 2e-4, 2e-5, "dv");
  }
  ::setenv(var, "lots", 1);
  try {
    ops::call(OpKind::Attention, {q.to(kGpu), k.to(kGpu), v.to(kGpu), Tensor()}, a);
    ADD_FAILURE() << "a scratch budget of 'lots' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
  }
  ::unsetenv(var);
}

// Values of head size 0 (allowed): the log-sum-exp as the CPU's, empty outputs, and the gradients
// of q and k that the log-sum-exp's gradient alone gives (the GEMMs over an empty dimension write
// zeros instead of failing in cuBLAS).
TEST(CudaTrainOps, AttentionWithEmptyValuesMatchesTheCpu) {
  HAP_REQUIRE_GPU();
  const Tensor q = randn({2, 3, 9, 5}, 50), k = randn({2, 3, 9, 5}, 51);
  const Tensor v = Tensor::empty({2, 3, 9, 0}), go = Tensor::empty({2, 3, 9, 0});
  const Tensor glse = randn({2, 3, 9}, 52);
  ops::AttentionAttrs a;
  const std::vector<Tensor> want = ops::call(OpKind::Attention, {q, k, v, Tensor()}, a);
  const std::vector<Tensor> got =
      ops::call(OpKind::Attention, {q.to(kGpu), k.to(kGpu), v.to(kGpu), Tensor()}, a);
  expect_close(got[1], want[1], 1e-5, 1e-6, "lse");
  EXPECT_EQ(got[0].shape(), want[0].shape());
  const std::vector<Tensor> gw =
      ops::call(OpKind::AttentionBackward, {q, k, v, want[0], want[1], go, glse, Tensor()}, a);
  const std::vector<Tensor> gg = ops::call(OpKind::AttentionBackward,
                                           {q.to(kGpu), k.to(kGpu), v.to(kGpu), want[0].to(kGpu),
                                            want[1].to(kGpu), go.to(kGpu), glse.to(kGpu), Tensor()},
                                           a);
  expect_close(gg[0], gw[0], 1e-4, 1e-5, "dq");
  expect_close(gg[1], gw[1], 1e-4, 1e-5, "dk");
}

TEST(CudaTrainOps, FusedOptimizerUpdatesAndSumOfSquaresMatchTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(d));
    // The same formulas; the GPU may contract a*b+c into one FMA, so f32 agrees to a few ulp.
    const double rtol = d == DType::F64 ? 1e-13 : 1e-6, atol = d == DType::F64 ? 1e-15 : 1e-7;
    // Three parameters, one bigger than a chunk (4096) and not a multiple of it, one empty.
    const std::vector<Shape> shapes = {{37, 5}, {9001}, {0, 3}};
    std::vector<Tensor> cpu_in, gpu_in;
    uint64_t seed = 20;
    for (const Shape& s : shapes) {
      const Tensor pv = randn(s, seed++, 0, f64()).to(d), g = randn(s, seed++, 0, f64()).to(d);
      const Tensor m = randn(s, seed++, 0, f64()).to(d) * 0.1;
      const Tensor vv = (randn(s, seed++, 0, f64()) * 0.1).to(d);
      const Tensor v2 = ops::call1(OpKind::Mul, {vv, vv});  // second moments are >= 0
      for (const Tensor& x : {pv, g, m, v2}) {
        cpu_in.push_back(x.clone());
        gpu_in.push_back(x.to(kGpu));
      }
    }
    ops::OptimizerAttrs a;
    a.lr = {1e-2, 3e-3, 1e-3};
    a.weight_decay = {0.1, 0.0, 0.1};
    a.step = {1, 7, 3};
    a.grad_scale = 0.37;  // clipping's coefficient, folded into the update
    ops::call(OpKind::AdamWUpdate, cpu_in, a);
    ops::call(OpKind::AdamWUpdate, gpu_in, a);
    for (size_t i = 0; i < cpu_in.size(); ++i)
      expect_close(gpu_in[i], cpu_in[i], rtol, atol, "adamw input " + std::to_string(i));
    // SGD with momentum and nesterov: (parameter, gradient, buffer) per parameter.
    std::vector<Tensor> sc, sg;
    for (size_t k = 0; k < shapes.size(); ++k)
      for (size_t j : {size_t{0}, size_t{1}, size_t{2}}) {
        sc.push_back(cpu_in[4 * k + j].clone());
        sg.push_back(cpu_in[4 * k + j].to(kGpu));
      }
    ops::OptimizerAttrs s;
    s.lr = {0.1, 0.05, 0.1};
    s.weight_decay = {1e-4, 0.0, 0.0};
    s.step = {0, 3, 1};
    s.momentum = 0.9;
    s.nesterov = true;
    s.grad_scale = 0.61;
    ops::call(OpKind::SgdUpdate, sc, s);
    ops::call(OpKind::SgdUpdate, sg, s);
    for (size_t i = 0; i < sc.size(); ++i)
      expect_close(sg[i], sc[i], rtol, atol, "sgd input " + std::to_string(i));
    // Sum of squares in double over a transposed view and the parameters, the same values on
    // both devices (the updated f32 parameters above differ by an ulp or so: FMA contraction).
    // Both add doubles in a different order; over ~10^4 terms that is far below 1e-12.
    const Tensor view = randn({7, 300}, 40, 0, f64()).to(d).as_strided({300, 7}, {1, 300}, 0);
    std::vector<Tensor> sq_c = {view, cpu_in[0], cpu_in[4], cpu_in[8]};
    std::vector<Tensor> sq_g = {same_view_on_gpu(view), cpu_in[0].to(kGpu), cpu_in[4].to(kGpu),
                                cpu_in[8].to(kGpu)};
    expect_close(ops::call1(OpKind::SumOfSquares, sq_g), ops::call1(OpKind::SumOfSquares, sq_c),
                 1e-12, 0, "sum_of_squares");
  }
}

}  // namespace
}  // namespace hap
