// CUDA kernels of sum and mean over any dims of a strided input: one block per output element,
// each thread accumulating a strided share of the reduced elements in double (as the CPU kernel
// does), then a tree in shared memory. The order is fixed by the launch, so runs are
// bitwise-reproducible; it differs from the CPU's, so results agree to rounding.
#include <algorithm>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

template <typename T>
__global__ void sum_kernel(T* out, const T* x, Indexer kept, Indexer reduced, int64_t n_out,
                           int64_t n_reduced, T scale) {
  __shared__ double part[kThreads];
  for (int64_t o = blockIdx.x; o < n_out; o += gridDim.x) {
    const T* base = x + offset_of(kept, o);
    double acc = 0;
    for (int64_t r = threadIdx.x; r < n_reduced; r += blockDim.x)
      acc += static_cast<double>(base[offset_of(reduced, r)]);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) out[o] = static_cast<T>(part[0]) * scale;
    __syncthreads();  // part[] is reused for the next output
  }
}

// The input's sizes and strides over the kept dims (in order) and over the reduced ones.
void split_dims(const Tensor& x, const std::vector<int64_t>& reduced, Indexer* kept, Indexer* red) {
  HAP_CHECK(x.dim() <= kMaxDims, "sum on cuda: at most ", kMaxDims, " dimensions, got ", x.str());
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool r = std::find(reduced.begin(), reduced.end(), d) != reduced.end();
    Indexer* ix = r ? red : kept;
    ix->sizes[ix->ndim] = x.size(d);
    ix->strides[ix->ndim] = x.strides()[static_cast<size_t>(d)];
    ++ix->ndim;
  }
}

std::vector<Tensor> reduce(const KernelContext& c, bool mean) {
  const Tensor& x = c.inputs[0];
  const ReduceAttrs& a = attr<ReduceAttrs>(c.attrs);
  std::vector<int64_t> dims;
  for (int64_t d : a.dims) dims.push_back(d < 0 ? d + x.dim() : d);
  if (a.dims.empty())
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
  Indexer kept, red;
  split_dims(x, dims, &kept, &red);
  int64_t n_reduced = 1, n_out = 1;
  for (int d = 0; d < red.ndim; ++d) n_reduced *= red.sizes[d];
  for (int d = 0; d < kept.ndim; ++d) n_out *= kept.sizes[d];
  HAP_CHECK(!mean || n_reduced > 0, "mean over ", shape_str(x.shape()), " reduces an empty dim");
  Tensor out = c.alloc(0);
  if (n_out == 0) return {out};
  const double scale = mean ? 1.0 / static_cast<double>(n_reduced) : 1.0;
  const int blocks = static_cast<int>(std::min<int64_t>(n_out, 65536));
  on_float(out, mean ? "mean" : "sum", [&](auto tag) {
    using T = decltype(tag);
    sum_kernel<<<blocks, kThreads>>>(ptr<T>(out), ptr<T>(x), kept, red, n_out, n_reduced,
                                     static_cast<T>(scale));
  });
  return {out};
}

}  // namespace

void register_reduce(OpTable& t) {
  t[static_cast<size_t>(OpKind::Sum)].cuda = [](const KernelContext& c) {
    return reduce(c, false);
  };
  t[static_cast<size_t>(OpKind::Mean)].cuda = [](const KernelContext& c) {
    return reduce(c, true);
  };
}

}  // namespace hap::ops::cuda
