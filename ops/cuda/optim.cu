// CUDA kernels of the optimizer ops (ops/defs/optim.cc): the SGD and AdamW updates of every
// parameter in one launch (a table of the tensors, each cut into chunks; a block finds its
// tensor by binary search over the chunk counts), and the sum of squares behind global-norm
// clipping (per tensor, fixed-size partial sums in double; the partials then added in a fixed
// order by one block, so the result is the same on every run).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/backend.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

constexpr int64_t kChunk = 4096;  // elements a block updates at a time

// One parameter's update: its tensors and the scalars the host computes in double, as the CPU.
template <typename T>
struct Update {
  T* p;
  const T* g;
  T* s1;  // AdamW m, SGD momentum buffer (null without momentum)
  T* s2;  // AdamW v
  int64_t n;
  int64_t first_chunk;  // chunks before this tensor's
  T a, b, c;            // AdamW: decay, step_size, sqrt(bias_correction2); SGD: lr, wd, -
  bool first_step;      // SGD: the buffer starts as the gradient
};

template <typename T>
__device__ int find_tensor(const Update<T>* u, int count, int64_t chunk) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (u[mid].first_chunk <= chunk)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// torch.optim.AdamW, element by element as ops/defs/optim.cc adamw_kernel (the gradient times
// `scale`).
template <typename T>
__global__ void adamw_kernel(const Update<T>* table, int count, int64_t chunks, T b1,
                             T one_minus_b1, T b2, T one_minus_b2, T eps, T scale) {
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const Update<T>& u = table[find_tensor(table, count, chunk)];
    const int64_t begin = (chunk - u.first_chunk) * kChunk;
    const int64_t end = begin + kChunk < u.n ? begin + kChunk : u.n;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const T gi = u.g[i] * scale;
      const T mi = u.s1[i] * b1 + gi * one_minus_b1;
      const T vi = u.s2[i] * b2 + gi * gi * one_minus_b2;
      u.s1[i] = mi;
      u.s2[i] = vi;
      const T denom = sqrt(vi) / u.c + eps;
      u.p[i] = u.p[i] * u.a - u.b * (mi / denom);
    }
  }
}

// torch.optim.SGD with dampening 0, as ops/defs/optim.cc sgd_kernel.
template <typename T>
__global__ void sgd_kernel(const Update<T>* table, int count, int64_t chunks, T momentum,
                           bool nesterov, T scale) {
  for (int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const Update<T>& u = table[find_tensor(table, count, chunk)];
    const int64_t begin = (chunk - u.first_chunk) * kChunk;
    const int64_t end = begin + kChunk < u.n ? begin + kChunk : u.n;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      T d = u.g[i] * scale;
      if (u.b != T(0)) d += u.b * u.p[i];
      if (u.s1) {
        const T buf = u.first_step ? d : momentum * u.s1[i] + d;
        u.s1[i] = buf;
        d = nesterov ? d + momentum * buf : buf;
      }
      u.p[i] -= u.a * d;
    }
  }
}

template <typename T>
T* writable(const Tensor& t, const char* op) {
  HAP_CHECK(t.is_contiguous(), op, ": ", t.str(), " must be contiguous (it is updated in place)");
  return ptr<T>(t);
}

// Builds the table on the host, copies it to the device, and launches `launch(table, count,
// chunks)`; `fill(update, k)` sets parameter k's tensors and scalars. Non-contiguous gradients
// are packed first (kept alive in `keep`).
template <typename T, typename Fill, typename Launch>
void multi_tensor(const KernelContext& c, size_t params, const char* op, Fill fill, Launch launch) {
  std::vector<Update<T>> table(params);
  std::vector<Tensor> keep;
  int64_t chunks = 0;
  for (size_t k = 0; k < params; ++k) {
    Update<T>& u = table[k];
    u = Update<T>{};
    fill(u, k, keep);
    u.first_chunk = chunks;
    chunks += (u.n + kChunk - 1) / kChunk;
  }
  if (chunks == 0) return;
  const Device dev = c.inputs[0].device();
  const size_t bytes = table.size() * sizeof(Update<T>);
  Tensor t_dev = Tensor::empty({static_cast<int64_t>(bytes)},
                               TensorOptions{}.with_dtype(DType::U8).with_device(dev));
  copy_bytes(t_dev.raw_data(), dev, table.data(), Device::cpu(), bytes);
  ::hap::cuda::set_device(dev.index);
  const int blocks = static_cast<int>(std::min<int64_t>(chunks, 65536));
  launch(static_cast<const Update<T>*>(t_dev.raw_data()), static_cast<int>(params), chunks, blocks);
  check_launch(op);
  // The table must outlive the kernel: it is freed in stream order by the caching allocator.
}

template <typename T>
void adamw(const KernelContext& c) {
  const OptimizerAttrs& a = attr<OptimizerAttrs>(c.attrs);
  multi_tensor<T>(
      c, a.lr.size(), "adamw_update",
      [&](Update<T>& u, size_t k, std::vector<Tensor>& keep) {
        const double lr = a.lr[k], t = static_cast<double>(a.step[k]);
        const double bias_correction1 = 1.0 - std::pow(a.beta1, t);
        const double bias_correction2 = 1.0 - std::pow(a.beta2, t);
        u.p = writable<T>(c.inputs[4 * k], "adamw_update");
        keep.push_back(dense(c.inputs[4 * k + 1]));
        u.g = ptr<T>(keep.back());
        u.s1 = writable<T>(c.inputs[4 * k + 2], "adamw_update");
        u.s2 = writable<T>(c.inputs[4 * k + 3], "adamw_update");
        u.n = c.inputs[4 * k].numel();
        u.a = static_cast<T>(1.0 - lr * a.weight_decay[k]);
        u.b = static_cast<T>(lr / bias_correction1);
        u.c = static_cast<T>(std::sqrt(bias_correction2));
      },
      [&](const Update<T>* table, int count, int64_t chunks, int blocks) {
        adamw_kernel<<<blocks, kThreads>>>(table, count, chunks, static_cast<T>(a.beta1),
                                           static_cast<T>(1.0 - a.beta1), static_cast<T>(a.beta2),
                                           static_cast<T>(1.0 - a.beta2), static_cast<T>(a.eps),
                                           static_cast<T>(a.grad_scale));
      });
}

template <typename T>
void sgd(const KernelContext& c) {
  const OptimizerAttrs& a = attr<OptimizerAttrs>(c.attrs);
  const size_t group = a.momentum != 0 ? 3 : 2;
  multi_tensor<T>(
      c, a.lr.size(), "sgd_update",
      [&](Update<T>& u, size_t k, std::vector<Tensor>& keep) {
        u.p = writable<T>(c.inputs[group * k], "sgd_update");
        keep.push_back(dense(c.inputs[group * k + 1]));
        u.g = ptr<T>(keep.back());
        u.s1 = group == 3 ? writable<T>(c.inputs[group * k + 2], "sgd_update") : nullptr;
        u.n = c.inputs[group * k].numel();
        u.a = static_cast<T>(a.lr[k]);
        u.b = static_cast<T>(a.weight_decay[k]);
        u.first_step = a.step[k] == 0;
      },
      [&](const Update<T>* table, int count, int64_t chunks, int blocks) {
        sgd_kernel<<<blocks, kThreads>>>(table, count, chunks, static_cast<T>(a.momentum),
                                         a.nesterov, static_cast<T>(a.grad_scale));
      });
}

// ---- sum of squares ----
constexpr int kPartials = 256;  // blocks (and partial sums) per tensor

template <typename T>
__global__ void squares_kernel(double* partial, const T* x, Indexer ix, int64_t n) {
  __shared__ double part[kThreads];
  double acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const double v = static_cast<double>(x[offset_of(ix, i)]);
    acc += v * v;
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = part[0];
}

// Each tensor's kPartials sums added in a fixed tree, the tensors' totals in input order.
__global__ void add_partials_kernel(double* out, const double* partial, int tensors) {
  __shared__ double part[kPartials];
  double total = 0;
  for (int t = 0; t < tensors; ++t) {
    part[threadIdx.x] = partial[t * kPartials + threadIdx.x];
    __syncthreads();
    for (int s = kPartials / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
      __syncthreads();
    }
    total += part[0];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = total;
}

std::vector<Tensor> sum_of_squares(const KernelContext& c) {
  Tensor out = c.alloc(0);
  const int tensors = static_cast<int>(c.inputs.size());
  Tensor partial = Tensor::zeros({static_cast<int64_t>(tensors) * kPartials},
                                 TensorOptions{}.with_dtype(DType::F64).with_device(out.device()));
  ::hap::cuda::set_device(out.device().index);
  for (int t = 0; t < tensors; ++t) {
    const Tensor& x = c.inputs[static_cast<size_t>(t)];
    const int64_t n = x.numel();
    if (n == 0) continue;
    const Indexer ix = indexer(x, x.shape(), "sum_of_squares");
    double* dst = ptr<double>(partial) + static_cast<int64_t>(t) * kPartials;
    if (x.dtype() == DType::F32) {
      squares_kernel<<<kPartials, kThreads>>>(dst, ptr<float>(x), ix, n);
    } else {
      HAP_CHECK(x.dtype() == DType::F64, "sum_of_squares on cuda: dtype ", dtype_name(x.dtype()),
                " has no CUDA kernel yet (f32 and f64 have)");
      squares_kernel<<<kPartials, kThreads>>>(dst, ptr<double>(x), ix, n);
    }
    check_launch("sum_of_squares");
  }
  add_partials_kernel<<<1, kPartials>>>(ptr<double>(out), ptr<double>(partial), tensors);
  check_launch("sum_of_squares");
  return {out};
}

}  // namespace

void register_optim(OpTable& t) {
  t[static_cast<size_t>(OpKind::AdamWUpdate)].cuda = [](const KernelContext& c) {
    ::hap::cuda::set_device(c.inputs[0].device().index);
    if (c.inputs[0].dtype() == DType::F64)
      adamw<double>(c);
    else
      adamw<float>(c);
    return std::vector<Tensor>{};
  };
  t[static_cast<size_t>(OpKind::SgdUpdate)].cuda = [](const KernelContext& c) {
    ::hap::cuda::set_device(c.inputs[0].device().index);
    if (c.inputs[0].dtype() == DType::F64)
      sgd<double>(c);
    else
      sgd<float>(c);
    return std::vector<Tensor>{};
  };
  t[static_cast<size_t>(OpKind::SumOfSquares)].cuda = sum_of_squares;
}

}  // namespace hap::ops::cuda
