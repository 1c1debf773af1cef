// One parametrised harness over the whole op registry: every sample of tests/ops/op_samples.h
// (every OpKind, random shapes that are not multiples of 32, non-contiguous views) runs on the GPU
// and on the CPU, in f64 and in f32, forward and backward: the outputs (or, for the in-place
// optimizer updates, the updated inputs) agree, and so do the gradients that autograd computes
// of sum(outputs * fixed random weights) with respect to the differentiable inputs. Views stay
// views on the GPU (the same strides over a device copy of their storage). Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/engine.h"
#include "core/cuda/backend.h"
#include "core/rng.h"
#include "ops/dispatch.h"
#include "ops/op.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/ops/op_samples.h"

namespace hap {
namespace {

using namespace gpu_test;
using op_samples::OpSample;
using ops::OpKind;

// Tolerances, |gpu - cpu| <= atol + rtol |cpu|. The kernels compute the same formulas, but the
// reductions (GEMM, softmax, norms, attention, convolution, MoE gates) sum in another order and the
// device's exp/log/tanh differ from the host's in the last bits. f64: one rounding is 1.1e-16; on
// these samples (at most a few hundred terms of magnitude <= ~10) no element differed by more than
// 1e-13 relative + 1e-14 absolute on an H100, so 1e-12 / 1e-13 keeps a 10x margin. f32: one
// rounding is 6e-8; a reordered sum of n terms may differ by ~n ulp of the terms' magnitude. The
// largest differences seen on an H100 with these samples were 1.9e-6 absolute (1.2e-6 relative)
// on conv2d's weight gradient (a sum over N * OH * OW = 2 * 5 * 11 positions) and 1.4e-6 on
// linear's outputs (37 products and a bias), so rtol 1e-5 with atol 1e-6 (at least twice those)
// for the outputs; gradients chain two to four such kernels (the backward rule's products and
// reductions after the forward's), so they get twice that.
struct Tolerance {
  double rtol, atol;
};
Tolerance output_tolerance(DType d) {
  return d == DType::F64 ? Tolerance{1e-12, 1e-13} : Tolerance{1e-5, 1e-6};
}
Tolerance grad_tolerance(DType d) {
  return d == DType::F64 ? Tolerance{1e-12, 1e-13} : Tolerance{2e-5, 2e-6};
}

std::vector<Tensor> on_gpu(const std::vector<Tensor>& in) {
  std::vector<Tensor> out;
  for (const Tensor& x : in) out.push_back(x.defined() ? same_view_on_gpu(x) : Tensor());
  return out;
}

void compare(const Tensor& gpu, const Tensor& cpu, Tolerance tol, const std::string& what) {
  if (is_floating(cpu.dtype())) {
    expect_close(gpu, cpu, tol.rtol, tol.atol, what);
  } else {
    expect_equal(gpu, cpu, what);  // indices, counts, token ids: exact
  }
}

// The gradients of sum_i sum(outputs[i] * w_i) (float outputs; w_i fixed normal weights in the
// outputs' dtype on their device) with respect to the sample's differentiable inputs.
std::vector<Tensor> gradients(const OpSample& s, const std::vector<Tensor>& in, Device device) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < in.size(); ++i)
    if (s.differentiable[i]) {
      Tensor leaf = in[i];  // the same tensor: the op below reads it
      leaf.set_requires_grad(true);
      leaves.push_back(leaf);
    }
  std::vector<Tensor> outs, weights;
  uint64_t seed = 500;
  for (const Tensor& y : ops::call(s.kind, in, s.attrs)) {
    if (!y.defined() || !is_floating(y.dtype())) continue;
    outs.push_back(y);
    weights.push_back(randn(y.shape(), seed++, 0, TensorOptions{}.with_dtype(DType::F64))
                          .to(y.dtype())
                          .to(device));
  }
  return autograd::grad(outs, leaves, weights, false);
}

// One run of a sample: in dtype `d`, its viewable inputs as views or not. Counts what it compared.
void check_run(const OpSample& s, DType d, bool views, size_t& runs, size_t& grads) {
  const OpKind k = s.kind;
  const std::vector<Tensor> cpu_in = op_samples::materialize(s, d, views);
  const std::vector<Tensor> gpu_in = on_gpu(cpu_in);
  for (size_t i = 0; i < cpu_in.size(); ++i) {
    if (cpu_in[i].defined()) {
      ASSERT_EQ(gpu_in[i].strides(), cpu_in[i].strides()) << "input " << i;
    }
  }
  const Tolerance tol = output_tolerance(d);
  const std::vector<Tensor> want = ops::call(k, cpu_in, s.attrs);
  const std::vector<Tensor> got = ops::call(k, gpu_in, s.attrs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    compare(got[i], want[i], tol, "output " + std::to_string(i));
  if (s.in_place) {  // what the update wrote, input by input
    for (size_t i = 0; i < cpu_in.size(); ++i)
      compare(gpu_in[i], cpu_in[i], tol, "updated input " + std::to_string(i));
  }
  ++runs;
  if (s.in_place || ops::op_def(k).backward == nullptr || !op_samples::has_differentiable(s))
    return;
  const std::vector<Tensor> gw = gradients(s, cpu_in, Device::cpu());
  const std::vector<Tensor> gg = gradients(s, gpu_in, kGpu);
  ASSERT_EQ(gg.size(), gw.size());
  for (size_t i = 0; i < gw.size(); ++i) {
    ASSERT_EQ(gg[i].defined(), gw[i].defined()) << "gradient " << i;
    if (gw[i].defined()) {
      compare(gg[i], gw[i], grad_tolerance(d), "gradient " + std::to_string(i));
    }
  }
  ++grads;
}

TEST(CudaRegistry, EveryOpMatchesTheCpuForwardAndBackward) {
  HAP_REQUIRE_GPU();
  size_t kinds = 0, runs = 0, grads = 0;
  for (OpKind k : op_samples::all_kinds()) {
    const std::vector<OpSample> samples = op_samples::op_samples(k);
    ASSERT_FALSE(samples.empty()) << ops::op_name(k) << " has no sample";
    ++kinds;
    for (const OpSample& s : samples) {
      for (DType d : {DType::F64, DType::F32}) {
        if (d == DType::F32 && !s.f32) continue;
        for (bool views : {false, true}) {
          if (views && !op_samples::has_views(s)) continue;
          const std::string what = std::string(ops::op_name(k)) + " [" + s.name + "] " +
                                   dtype_name(d) + (views ? " views" : " contiguous");
          SCOPED_TRACE(what);
          try {
            check_run(s, d, views, runs, grads);
          } catch (const std::exception& e) {
            ADD_FAILURE() << what << " threw: " << e.what();
          }
        }
      }
    }
  }
  EXPECT_EQ(kinds, ops::kNumOps);
  EXPECT_GT(runs, 2 * ops::kNumOps);
  EXPECT_GT(grads, ops::kNumOps);
  std::printf("compared %zu runs (%zu with gradients) over %zu op kinds\n", runs, grads, kinds);
}

}  // namespace
}  // namespace hap
