// CUDA kernels of matmul and linear: cuBLAS strided-batched GEMMs (f32 with f32 compute, TF32
// off, except inside an op given bf16 inputs that computes in f32: ops::in_bf16_route; f64; bf16
// operands with f32 accumulation on the tensor cores, one rounding at the end), operands made
// contiguous first where they are not (a broadcast batch operand is expanded), a's batch folded
// into the rows when b has none. Linear's bias is written into the output first and the GEMM adds
// to it (beta = 1), as the CPU kernel does: bias + x W^T is rounded once.
#include <cublas_api.h>

#include "core/cuda/backend.h"
#include "core/cuda/cublas.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"
#include "ops/dispatch.h"

namespace hap::ops::cuda {
namespace {

cudaDataType data_type(DType d, const char* op) {
  if (d == DType::F32) return CUDA_R_32F;
  if (d == DType::F64) return CUDA_R_64F;
  if (d == DType::BF16) return CUDA_R_16BF;
  HAP_CHECK(false, "op ", op, " on cuda: dtype ", dtype_name(d),
            " has no GEMM (f32, f64 and bf16 have)");
  return CUDA_R_32F;
}

}  // namespace

// cuBLAS is column-major: it computes C^T = op(B)^T op(A)^T on the same memory.
void gemm(const Tensor& c, const Tensor& a, bool a_trans, const Tensor& b, bool b_trans,
          int64_t batch, int64_t m, int64_t n, int64_t k, const char* op, double alpha,
          double beta) {
  const cudaDataType type = data_type(c.dtype(), op);
  if (batch == 0 || m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: C = beta C (cuBLAS refuses the zero leading dimensions)
    HAP_CHECK(beta == 0 || beta == 1, "gemm for ", op, ": an empty inner dimension with beta ",
              beta);
    if (beta == 0) {
      ::hap::cuda::set_device(c.device().index);
      HAP_CUDA_CHECK(cudaMemsetAsync(c.raw_data(), 0, c.nbytes()));  // +0.0 in every float
    }
    return;
  }
  const int device = c.device().index;
  cublasHandle_t h = ::hap::cuda::cublas_handle(device);
  ::hap::cuda::set_device(device);
  const float alpha32 = static_cast<float>(alpha), beta32 = static_cast<float>(beta);
  const double alpha64 = alpha, beta64 = beta;
  const bool f64 = c.dtype() == DType::F64;
  // Inside an op given bf16 inputs (ops::in_bf16_route), f32 products may use TF32.
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F
          : (c.dtype() == DType::F32 && in_bf16_route() ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                        : CUBLAS_COMPUTE_32F);
  HAP_CUBLAS_CHECK(::hap::cuda::cublas().gemm_strided_batched(
      h, b_trans ? CUBLAS_OP_T : CUBLAS_OP_N, a_trans ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
      f64 ? static_cast<const void*>(&alpha64) : &alpha32, b.raw_data(), type, b_trans ? k : n,
      static_cast<long long>(k * n), a.raw_data(), type, a_trans ? m : k,
      static_cast<long long>(m * k), f64 ? static_cast<const void*>(&beta64) : &beta32,
      c.raw_data(), type, n, static_cast<long long>(m * n), batch, compute, CUBLAS_GEMM_DEFAULT));
}

namespace {

// True when the last two dims of a 2-D view are a transposed contiguous matrix.
bool transposed_2d(const Tensor& t) {
  return t.dim() == 2 && t.strides()[0] == 1 && t.strides()[1] == t.size(0);
}

// `t` broadcast to `shape` (its own trailing dims kept), as a contiguous tensor.
Tensor expanded(const Tensor& t, const Shape& shape) {
  if (t.shape() == shape) return dense(t);
  const Indexer ix = indexer(t, shape, "matmul");
  Strides strides(ix.strides, ix.strides + ix.ndim);
  return t.as_strided(shape, strides, t.offset()).clone();
}

void zero(const Tensor& t) {
  if (t.numel() == 0) return;
  ::hap::cuda::set_device(t.device().index);
  HAP_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes()));  // +0.0 in f32 and f64
}

std::vector<Tensor> matmul(const KernelContext& c) {
  const Tensor &a = c.inputs[0], &b = c.inputs[1];
  Tensor out = c.alloc(0);
  const int64_t m = out.size(out.dim() - 2), n = out.size(out.dim() - 1), k = a.size(a.dim() - 1);
  if (out.numel() == 0) return {out};
  if (k == 0) {
    zero(out);
    return {out};
  }
  if (b.dim() == 2) {  // one GEMM over all of a's rows
    const bool bt = transposed_2d(b) && !b.is_contiguous();
    gemm(out, dense(a), false, bt ? b : dense(b), bt, 1, a.numel() / k, n, k, "matmul");
    return {out};
  }
  Shape batch(out.shape().begin(), out.shape().end() - 2);
  int64_t count = 1;
  for (int64_t s : batch) count *= s;
  Shape ashape = batch, bshape = batch;
  ashape.insert(ashape.end(), {m, k});
  bshape.insert(bshape.end(), {k, n});
  gemm(out, expanded(a, ashape), false, expanded(b, bshape), false, count, m, n, k, "matmul");
  return {out};
}

// out[r, j] = bias[j]: the bias's bits in every row (any element size).
template <typename Bits>
__global__ void bias_rows_kernel(Bits* out, const Bits* bias, int64_t bias_stride, int64_t rows,
                                 int64_t n) {
  HAP_GRID_STRIDE_LOOP(i, rows * n) { out[i] = bias[(i % n) * bias_stride]; }
}

void fill_bias_rows(const Tensor& out, const Tensor& bias, int64_t rows, int64_t n) {
  ::hap::cuda::set_device(out.device().index);
  auto launch = [&](auto bits) {
    using Bits = decltype(bits);
    bias_rows_kernel<<<blocks_for(rows * n), kThreads>>>(static_cast<Bits*>(out.raw_data()),
                                                         static_cast<const Bits*>(bias.raw_data()),
                                                         bias.strides()[0], rows, n);
  };
  if (dtype_size(out.dtype()) == 2)
    launch(uint16_t{});
  else if (dtype_size(out.dtype()) == 4)
    launch(uint32_t{});
  else
    launch(uint64_t{});
  check_launch("linear");
}

std::vector<Tensor> linear(const KernelContext& c) {
  const Tensor &x = c.inputs[0], &w = c.inputs[1], &bias = c.inputs[2];
  Tensor out = c.alloc(0);
  const int64_t in = w.size(1), n = w.size(0);
  if (out.numel() == 0) return {out};
  const int64_t rows = out.numel() / n;
  const double beta = bias.defined() ? 1.0 : 0.0;
  if (bias.defined()) fill_bias_rows(out, bias, rows, n);
  if (in == 0) {
    if (!bias.defined()) zero(out);
  } else if (transposed_2d(w) && !w.is_contiguous()) {  // a view of a stored [in, out]
    gemm(out, dense(x), false, w, false, 1, rows, n, in, "linear", 1.0, beta);
  } else {
    gemm(out, dense(x), false, dense(w), true, 1, rows, n, in, "linear", 1.0, beta);
  }
  return {out};
}

}  // namespace

void register_matmul(OpTable& t) {
  for (OpKind k : {OpKind::MatMul, OpKind::Linear}) {
    t[static_cast<size_t>(k)].cuda = k == OpKind::MatMul ? matmul : linear;
    t[static_cast<size_t>(k)].cuda_bf16 = true;  // bf16 operands on the tensor cores
  }
}

}  // namespace hap::ops::cuda
