// CUDA kernels of the embedding lookup and its backward. The ids are checked on the host (one
// copy of the ids, as the CPU checks them, with the same error). The backward is deterministic
// and equal to the CPU's bit for bit: the ids are bucketed by row on the host (a stable counting
// sort, as ops/defs/nn.cc does), and each thread writes one element of one weight row, adding its
// gradient rows in id order. No atomics.
#include <cstdint>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// The ids on the host (contiguous).
Tensor host_ids(const Tensor& ids) { return ids.to(Device::cpu()).contiguous(); }

template <typename T>
__global__ void embedding_kernel(T* y, const T* w, const int64_t* ids, int64_t count, int64_t v,
                                 int64_t n, int64_t start) {
  HAP_GRID_STRIDE_LOOP(e, count * n) {
    const int64_t i = e / n, j = e % n;
    const int64_t r = ids[i] - start;
    y[e] = r >= 0 && r < v ? w[r * n + j] : T(0);
  }
}

std::vector<Tensor> embedding(const KernelContext& c) {
  Tensor out = c.alloc(0);
  const Tensor w = dense(c.inputs[0]), ids = dense(c.inputs[1]);
  const int64_t v = w.size(0), n = w.size(1), count = ids.numel();
  // The same range rule and error as the CPU kernel (checked when the output is empty too).
  int64_t start = 0;
  if (const auto* s = std::get_if<SliceAttrs>(&c.attrs)) {
    HAP_CHECK(s->dim == 0 && s->start >= 0 && s->end - s->start == v,
              "embedding: vocabulary shard rows [", s->start, ", ", s->end, ") of dim ", s->dim,
              " do not match a weight shard of ", v, " rows");
    start = s->start;
  } else {
    const Tensor h = host_ids(ids);
    const int64_t* p = h.data<int64_t>();
    for (int64_t i = 0; i < count; ++i)
      HAP_CHECK(p[i] >= 0 && p[i] < v, "embedding: id ", p[i], " at position ", i,
                " is out of range for a vocabulary of ", v, " rows (expected 0 <= id < ", v, ")");
  }
  if (out.numel() == 0) return {out};
  on_float(out, "embedding", [&](auto tag) {
    using T = decltype(tag);
    embedding_kernel<<<blocks_for(count * n), kThreads>>>(ptr<T>(out), ptr<T>(w), ptr<int64_t>(ids),
                                                          count, v, n, start);
  });
  return {out};
}

// Row r of the weight's gradient: zero, or the gradient rows order[first[r]..first[r+1]) added
// in that order (the CPU's sequence of additions).
template <typename T>
__global__ void embedding_backward_kernel(T* y, const T* g, const int64_t* first,
                                          const int64_t* order, int64_t v, int64_t n) {
  HAP_GRID_STRIDE_LOOP(e, v * n) {
    const int64_t r = e / n, j = e % n;
    const int64_t b = first[r], end = first[r + 1];
    T acc = T(0);
    if (b < end) {
      acc = g[order[b] * n + j];
      for (int64_t k = b + 1; k < end; ++k) acc += g[order[k] * n + j];
    }
    y[e] = acc;
  }
}

std::vector<Tensor> embedding_backward(const KernelContext& c) {
  const ScatterAttrs& a = attr<ScatterAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  const int64_t v = a.shape[0], n = a.shape[1];
  if (out.numel() == 0) return {out};
  const Tensor g = dense(c.inputs[0]);
  const Tensor h = host_ids(c.inputs[1]);
  const int64_t count = h.numel();
  const int64_t* pi = h.data<int64_t>();
  // Buckets by row: first[r] .. first[r + 1] index `order`, the positions with id start + r.
  Tensor first = Tensor::zeros({v + 1}, TensorOptions{}.with_dtype(DType::I64));
  Tensor order = Tensor::empty({count}, TensorOptions{}.with_dtype(DType::I64));
  int64_t* pf = first.data<int64_t>();
  int64_t* po = order.data<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = pi[i] - a.start;
    if (r >= 0 && r < v) ++pf[r + 1];
  }
  for (int64_t r = 0; r < v; ++r) pf[r + 1] += pf[r];
  std::vector<int64_t> next(pf, pf + v);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t r = pi[i] - a.start;
    if (r >= 0 && r < v) po[next[static_cast<size_t>(r)]++] = i;
  }
  const Tensor first_d = first.to(out.device()), order_d = order.to(out.device());
  on_float(out, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    embedding_backward_kernel<<<blocks_for(v * n), kThreads>>>(
        ptr<T>(out), ptr<T>(g), ptr<int64_t>(first_d), ptr<int64_t>(order_d), v, n);
  });
  return {out};
}

}  // namespace

void register_embedding(OpTable& t) {
  t[static_cast<size_t>(OpKind::Embedding)].cuda = embedding;
  t[static_cast<size_t>(OpKind::EmbeddingBackward)].cuda = embedding_backward;
}

}  // namespace hap::ops::cuda
