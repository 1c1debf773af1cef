// The CUDA backend on a GPU, against the CPU: the caching allocator (statistics, reuse, the cap),
// copies both ways, and every op with a CUDA kernel on random shapes, strided and broadcast
// views and sizes that are not multiples of 32. Each test skips without a visible GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/backend.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/functional.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace hap {
namespace {

using ops::OpKind;
using namespace gpu_test;

TEST(Cuda, CopiesRoundTripEveryDtype) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8}) {
    Tensor x = (rand({37, 5}, 3) * 200.0).to(d);
    Tensor back = x.to(kGpu).to(Device::cpu());
    EXPECT_EQ(back.to_vector(), x.to_vector()) << dtype_name(d);
  }
  EXPECT_NE(cuda::device_description(0).find("sm_"), std::string::npos);
}

TEST(Cuda, TheAllocatorCachesCountsAndHonoursItsCap) {
  HAP_REQUIRE_GPU();
  Allocator& a = allocator_for(DeviceKind::CUDA);
  a.release_cache(0);
  const AllocatorStats before = a.stats(0);
  {
    Tensor t = Tensor::empty({1000, 1000}, TensorOptions{}.with_device(kGpu));
    EXPECT_GE(a.stats(0).allocated_bytes, before.allocated_bytes + 4000000);
  }
  const AllocatorStats freed = a.stats(0);
  EXPECT_EQ(freed.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(freed.cached_bytes, size_t{4000000});
  Tensor again = Tensor::empty({1000, 1000}, TensorOptions{}.with_device(kGpu));  // reused
  EXPECT_EQ(a.stats(0).cached_bytes,
            freed.cached_bytes - (a.stats(0).allocated_bytes - before.allocated_bytes));
  const size_t old_cap = cuda::memory_cap();
  cuda::set_memory_cap(a.stats(0).allocated_bytes + (size_t{1} << 20));
  EXPECT_HAS(
      test_util::error_of([&] { Tensor::empty({1 << 22}, TensorOptions{}.with_device(kGpu)); }),
      "memory cap");
  cuda::set_memory_cap(old_cap);
  EXPECT_HAS(test_util::error_of([&] {
               Tensor::empty({4}, TensorOptions{}.with_device(Device::cuda(cuda::device_count())));
             }),
             "no such device");
}

// Values with fractions, ties of bf16 rounding (1 + 2^-8 + 2^-9 ...) and magnitudes that every
// dtype holds; negative ones only where neither side is u8 (their conversion is undefined).
std::vector<double> conversion_values(bool negatives) {
  std::vector<double> v;
  for (int i = 0; i < 7 * 9; ++i)
    v.push_back(std::ldexp(1.0 + i / 256.0, i % 7) * (negatives && i % 2 ? -1 : 1));
  return v;
}

const std::vector<DType> kEveryDtype = {DType::F32, DType::F64, DType::BF16, DType::I64, DType::U8};

TEST(Cuda, CopiesOfViewsConvertExactlyAsTheHostDoes) {
  HAP_REQUIRE_GPU();
  for (DType from : kEveryDtype) {
    for (DType to : kEveryDtype) {
      SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + dtype_name(to));
      const bool negatives = from != DType::U8 && to != DType::U8;
      const Tensor block =
          Tensor::from_vector(conversion_values(negatives), {7, 9}, f64()).to(from);
      const Tensor view = block.as_strided({9, 7}, {1, 9}, 0);  // transposed
      const Tensor gpu_view = same_view_on_gpu(view);
      expect_equal(gpu_view.to(to), view.to(to), "to(dtype) of a transposed view");
      Tensor dst = Tensor::zeros({7, 9}, TensorOptions{}.with_dtype(to).with_device(kGpu));
      Tensor dst_cpu = Tensor::zeros({7, 9}, TensorOptions{}.with_dtype(to));
      dst.as_strided({9, 7}, {1, 9}, 0).copy_from(gpu_view);
      dst_cpu.as_strided({9, 7}, {1, 9}, 0).copy_from(view);
      expect_equal(dst, dst_cpu, "copy_from into a transposed view");
    }
  }
}

TEST(Cuda, FillOfAViewConvertsExactlyAsTheHostDoes) {
  HAP_REQUIRE_GPU();
  for (DType from : kEveryDtype) {
    for (double value : {0.0, -3.25, 1.0 + 1.0 / 256 + 1.0 / 512, 77.0}) {
      if (from == DType::U8 && value < 0) continue;
      SCOPED_TRACE(std::string("fill_ ") + dtype_name(from) + " " + std::to_string(value));
      const Tensor block = Tensor::from_vector(conversion_values(false), {7, 9}, f64()).to(from);
      Tensor t = block.to(kGpu), t_cpu = block.clone();
      t.as_strided({3, 9}, {18, 1}, 9).fill_(value);  // rows 1, 3 and 5
      t_cpu.as_strided({3, 9}, {18, 1}, 9).fill_(value);
      expect_equal(t, t_cpu, "fill_ of every other row");
    }
  }
  EXPECT_EQ(Tensor::zeros({3}, TensorOptions{}.with_device(kGpu)).to(Device::cpu()).to_vector(),
            (std::vector<double>{0, 0, 0}));
}

// Out-of-range floats and NaN to integers: saturated, NaN to 0, on both devices.
TEST(Cuda, FloatsToIntegersSaturateAsOnTheHost) {
  HAP_REQUIRE_GPU();
  const std::vector<double> edges = {-1.0, 300.0, std::nan(""), 2.7, -2.7, 1e30, -1e30, 255.5};
  for (DType from : {DType::F32, DType::F64, DType::BF16}) {
    const Tensor x = Tensor::from_vector(edges, {8}, f64()).to(from);
    for (DType to : {DType::U8, DType::I64}) {
      SCOPED_TRACE(std::string("edges ") + dtype_name(from) + " -> " + dtype_name(to));
      expect_equal(x.to(kGpu).to(to), x.to(to), "saturating conversion");
    }
  }
}

// The ops that only restride or move data run on the GPU through the same kernels as on the CPU.
TEST(Cuda, ShapeOpsMoveExactlyTheCpusValues) {
  HAP_REQUIRE_GPU();
  const Tensor x = randn({6, 5, 4}, 31);
  const Tensor xt = x.as_strided({4, 5, 6}, {1, 4, 20}, 0);  // a permuted view
  const Tensor g = same_view_on_gpu(xt);
  auto both = [&](OpKind k, const ops::Attrs& a, const std::string& what) {
    const std::vector<Tensor> want = ops::call(k, {xt}, a), got = ops::call(k, {g}, a);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) expect_equal(got[i], want[i], what);
  };
  both(OpKind::Reshape, ops::ShapeAttrs{{20, 6}}, "reshape of a permuted view (copies)");
  both(OpKind::Permute, ops::PermuteAttrs{{2, 0, 1}}, "permute");
  both(OpKind::Slice, ops::SliceAttrs{1, 1, 4}, "slice");
  both(OpKind::Split, ops::SplitAttrs{2, {1, 3, 2}}, "split");
  both(OpKind::Contiguous, {}, "contiguous");
  both(OpKind::SliceBackward, ops::ScatterAttrs{1, 2, {4, 9, 6}}, "slice_backward");
  const Tensor y = randn({4, 3, 6}, 32);
  expect_equal(ops::call1(OpKind::Concat, {g, y.to(kGpu), g}, ops::DimAttrs{1, false}),
               ops::call1(OpKind::Concat, {xt, y, xt}, ops::DimAttrs{1, false}), "concat");
  const Tensor row = randn({1, 6}, 33);
  expect_equal(ops::call1(OpKind::Expand, {row.to(kGpu)}, ops::ShapeAttrs{{3, 5, 6}}).contiguous(),
               ops::call1(OpKind::Expand, {row}, ops::ShapeAttrs{{3, 5, 6}}).contiguous(),
               "expand, then packed");
}

struct OpCase {
  std::string label;
  OpKind kind;
  std::vector<Tensor> inputs;
  ops::Attrs attrs;
};

std::vector<OpCase> elementwise_cases(DType d) {
  auto normal = [&](const Shape& s, uint64_t seed) { return randn(s, seed, 0, f64()).to(d); };
  auto positive = [&](const Shape& s, uint64_t seed) {
    return exp(randn(s, seed, 0, f64()) * 0.5).to(d);
  };
  const Shape s = {7, 33, 5};
  // A transposed view and a broadcast [33, 1] operand.
  Tensor t = normal({5, 33, 7}, 1).as_strided(s, {1, 7, 231}, 0);
  std::vector<OpCase> c;
  for (OpKind k : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div}) {
    c.push_back({"same shapes", k, {normal(s, 2), positive(s, 3)}, {}});
    c.push_back({"broadcast and transposed", k, {t, positive({33, 1}, 4)}, {}});
  }
  c.push_back({"", OpKind::ReluBackward, {normal(s, 5), normal(s, 6)}, {}});
  for (OpKind k : {OpKind::Neg, OpKind::Exp, OpKind::Tanh, OpKind::Relu, OpKind::Sigmoid})
    c.push_back({"transposed", k, {t}, {}});
  for (OpKind k : {OpKind::Log, OpKind::Sqrt, OpKind::Rsqrt})
    c.push_back({"", k, {positive(s, 7)}, {}});
  c.push_back({"", OpKind::AddScalar, {t}, ops::ScalarAttrs{1.5}});
  c.push_back({"", OpKind::MulScalar, {t}, ops::ScalarAttrs{-2.0}});
  c.push_back({"", OpKind::PowScalar, {positive(s, 8)}, ops::ScalarAttrs{1.7}});
  c.push_back({"transposed", OpKind::Contiguous, {t}, {}});
  c.push_back({"to f32", OpKind::Cast, {t}, ops::CastAttrs{DType::F32}});
  c.push_back({"to f64", OpKind::Cast, {t}, ops::CastAttrs{DType::F64}});
  return c;
}

TEST(Cuda, ElementwiseOpsMatchTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // f64: the same formulas, rounding aside; f32: exp/log/tanh/pow of the device's math library
    // differ from glibc's by a few ulp.
    const double rtol = d == DType::F64 ? 1e-12 : 1e-5, atol = d == DType::F64 ? 1e-12 : 1e-6;
    for (const OpCase& c : elementwise_cases(d)) {
      SCOPED_TRACE(std::string(ops::op_name(c.kind)) + " " + c.label + " " + dtype_name(d));
      std::vector<Tensor> gpu_in;
      for (const Tensor& x : c.inputs) {
        if (x.is_contiguous()) {
          gpu_in.push_back(x.to(kGpu));
          continue;
        }
        // The transposed view: the same strides over a device copy of its storage order.
        const Shape& sh = x.shape();
        Tensor storage_order = x.as_strided({sh[2], sh[1], sh[0]}, {231, 7, 1}, 0).contiguous();
        gpu_in.push_back(storage_order.to(kGpu).as_strided(sh, x.strides(), 0));
      }
      const Tensor want = ops::call1(c.kind, c.inputs, c.attrs);
      const Tensor got = ops::call1(c.kind, gpu_in, c.attrs);
      expect_close(got, want, rtol, atol, ops::op_name(c.kind));
    }
  }
}

TEST(Cuda, SumAndMeanOverAnyDimsMatchTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    const double rtol = d == DType::F64 ? 1e-12 : 1e-6, atol = d == DType::F64 ? 1e-12 : 1e-6;
    // [7, 33, 5] as a transposed view of a [5, 33, 7] block; and a long contiguous vector.
    const Tensor block = randn({5, 33, 7}, 9, 0, f64()).to(d);
    const Tensor x = block.as_strided({7, 33, 5}, {1, 7, 231}, 0);
    const Tensor x_gpu = block.to(kGpu).as_strided({7, 33, 5}, {1, 7, 231}, 0);
    const Tensor v = randn({100003}, 10, 0, f64()).to(d);
    for (OpKind k : {OpKind::Sum, OpKind::Mean}) {
      for (const ops::ReduceAttrs& a :
           {ops::ReduceAttrs{{}, false}, ops::ReduceAttrs{{1}, false},
            ops::ReduceAttrs{{0, 2}, true}, ops::ReduceAttrs{{-1}, true},
            ops::ReduceAttrs{{0, 1, 2}, false}}) {
        SCOPED_TRACE(std::string(ops::op_name(k)) + " dims " + shape_str(a.dims) + " " +
                     dtype_name(d));
        expect_close(ops::call1(k, {x_gpu}, a), ops::call1(k, {x}, a), rtol, atol, "[7, 33, 5]");
      }
      expect_close(ops::call1(k, {v.to(kGpu)}, ops::ReduceAttrs{}),
                   ops::call1(k, {v}, ops::ReduceAttrs{}), rtol, atol, "100003 elements");
    }
  }
}

TEST(Cuda, MatmulAndLinearMatchTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // f32: cuBLAS sums the 19 products in another order (no TF32).
    const double rtol = d == DType::F64 ? 1e-12 : 1e-5, atol = d == DType::F64 ? 1e-12 : 1e-5;
    auto normal = [&](const Shape& s, uint64_t seed) { return randn(s, seed, 0, f64()).to(d); };
    const Tensor bt = normal({23, 19}, 5);
    const Tensor b_transposed = bt.as_strided({19, 23}, {1, 19}, 0);  // [19, 23] view
    const std::vector<std::pair<std::string, std::vector<Tensor>>> matmuls = {
        {"2-D", {normal({37, 19}, 1), normal({19, 23}, 2)}},
        {"3-D by 2-D", {normal({3, 37, 19}, 3), normal({19, 23}, 4)}},
        {"by a transposed view", {normal({37, 19}, 6), b_transposed}},
        {"batched", {normal({3, 37, 19}, 7), normal({3, 19, 23}, 8)}},
        {"broadcast batch", {normal({1, 37, 19}, 9), normal({2, 3, 19, 23}, 10)}},
        {"empty inner dim", {normal({4, 0}, 11), normal({0, 5}, 12)}}};
    for (const auto& [label, in] : matmuls) {
      SCOPED_TRACE("matmul " + label + " " + dtype_name(d));
      expect_close(ops::call1(OpKind::MatMul, {same_view_on_gpu(in[0]), same_view_on_gpu(in[1])}),
                   ops::call1(OpKind::MatMul, in), rtol, atol, "matmul");
    }
    const Tensor w = normal({23, 19}, 13), bias = normal({23}, 14);
    const Tensor w_view = normal({19, 23}, 15).as_strided({23, 19}, {1, 23}, 0);
    const std::vector<std::pair<std::string, std::vector<Tensor>>> linears = {
        {"with bias", {normal({37, 19}, 16), w, bias}},
        {"3-D without bias", {normal({2, 37, 19}, 17), w, Tensor()}},
        {"a transposed weight view", {normal({5, 19}, 18), w_view, bias}}};
    for (const auto& [label, in] : linears) {
      SCOPED_TRACE("linear " + label + " " + dtype_name(d));
      std::vector<Tensor> gpu;
      for (const Tensor& t : in) gpu.push_back(t.defined() ? same_view_on_gpu(t) : Tensor());
      expect_close(ops::call1(OpKind::Linear, gpu), ops::call1(OpKind::Linear, in), rtol, atol,
                   "linear");
    }
  }
}

// bf16 operands on both devices, f32 accumulation and one rounding to bf16 at the end on both
// (the GPU's tensor cores, the CPU's bf16 GEMM), the sums in other orders: the f32 results differ
// by ~1e-6 relative, so the bf16 results are equal or one bf16 ulp (2^-8 relative) apart.
TEST(Cuda, Bf16MatmulAndLinearMatchTheCpusBf16Kernels) {
  HAP_REQUIRE_GPU();
  const double rtol = 1.0 / 128, atol = 1e-6;  // two ulps of bf16
  auto normal = [&](const Shape& s, uint64_t seed) {
    return randn(s, seed, 0, f64()).to(DType::BF16);
  };
  const std::vector<std::pair<std::string, std::vector<Tensor>>> matmuls = {
      {"2-D", {normal({37, 19}, 1), normal({19, 23}, 2)}},
      {"batched", {normal({3, 37, 19}, 7), normal({3, 19, 23}, 8)}},
      {"by a transposed view",
       {normal({37, 19}, 6), normal({23, 19}, 5).as_strided({19, 23}, {1, 19}, 0)}}};
  for (const auto& [label, in] : matmuls) {
    SCOPED_TRACE("matmul " + label);
    const Tensor got =
        ops::call1(OpKind::MatMul, {same_view_on_gpu(in[0]), same_view_on_gpu(in[1])});
    EXPECT_EQ(got.dtype(), DType::BF16);
    expect_close(got, ops::call1(OpKind::MatMul, in), rtol, atol, "bf16 matmul");
  }
  const std::vector<Tensor> lin = {normal({2, 37, 19}, 16), normal({23, 19}, 13), normal({23}, 14)};
  std::vector<Tensor> gpu;
  for (const Tensor& t : lin) gpu.push_back(t.to(kGpu));
  expect_close(ops::call1(OpKind::Linear, gpu), ops::call1(OpKind::Linear, lin), rtol, atol,
               "bf16 linear with bias");
  // Under autocast, f32 operands are lowered to bf16 and the product stays bf16, on both.
  ops::AutocastGuard mixed(DType::BF16);
  const Tensor x = randn({37, 19}, 30, 0), w = randn({23, 19}, 31, 0);
  const Tensor y = ops::call1(OpKind::Linear, {x.to(kGpu), w.to(kGpu), Tensor()});
  EXPECT_EQ(y.dtype(), DType::BF16);
  expect_close(y, ops::call1(OpKind::Linear, {x, w, Tensor()}), rtol, atol, "autocast linear");
}

TEST(Cuda, SoftmaxAndLogSoftmaxWithTheirBackwardMatchTheCpu) {
  HAP_REQUIRE_GPU();
  for (DType d : {DType::F32, DType::F64}) {
    // f32: the CPU's exp is a polynomial (exp_fast), the GPU's its own library's.
    const double rtol = d == DType::F64 ? 1e-12 : 1e-5, atol = d == DType::F64 ? 1e-12 : 1e-6;
    const Tensor block = (randn({5, 33, 7}, 21, 0, f64()) * 3.0).to(d);
    const Tensor x = block.as_strided({7, 33, 5}, {1, 7, 231}, 0);  // transposed view
    const Tensor x_gpu = block.to(kGpu).as_strided({7, 33, 5}, {1, 7, 231}, 0);
    const Tensor g = randn({7, 33, 5}, 22, 0, f64()).to(d);
    const Tensor wide = randn({3, 1000}, 23, 0, f64()).to(d);  // rows longer than a block
    for (const bool log : {false, true}) {
      const OpKind fwd = log ? OpKind::LogSoftmax : OpKind::Softmax;
      const OpKind bwd = log ? OpKind::LogSoftmaxBackward : OpKind::SoftmaxBackward;
      for (int64_t dim : {0, 1, -1}) {
        SCOPED_TRACE(std::string(ops::op_name(fwd)) + " dim " + std::to_string(dim) + " " +
                     dtype_name(d));
        const ops::DimAttrs a{dim, false};
        const Tensor y = ops::call1(fwd, {x}, a), y_gpu = ops::call1(fwd, {x_gpu}, a);
        expect_close(y_gpu, y, rtol, atol, "forward");
        expect_close(ops::call1(bwd, {g.to(kGpu), y.to(kGpu)}, a), ops::call1(bwd, {g, y}, a), rtol,
                     atol, "backward");
      }
      expect_close(ops::call1(fwd, {wide.to(kGpu)}, ops::DimAttrs{-1, false}),
                   ops::call1(fwd, {wide}, ops::DimAttrs{-1, false}), rtol, atol, "1000 wide");
    }
  }
}

}  // namespace
}  // namespace hap
