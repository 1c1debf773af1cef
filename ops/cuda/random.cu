// CUDA kernels of the ops that draw random numbers: dropout and the masked-LM corruption of token
// ids. Each element draws the Philox words of its logical index (core/philox.h, compiled for the
// device), so a GPU draws bit-for-bit the CPU's masks, on the whole tensor or on any shard of it.
#include <cstdint>

#include "core/cuda/backend.h"
#include "core/philox.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// Maps a local element's flat index to its flat index in the logical tensor (core/rng.h
// LogicalSlice): the local tensor is the box at `offset` of a logical tensor with `strides`.
struct LogicalMap {
  bool whole = true;
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t offset[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

__device__ __forceinline__ uint64_t logical_index(const LogicalMap& m, int64_t i) {
  if (m.whole) return static_cast<uint64_t>(i);
  int64_t logical = 0;
  for (int d = m.ndim - 1; d >= 0; --d) {
    const int64_t c = i % m.sizes[d];
    i /= m.sizes[d];
    logical += (c + m.offset[d]) * m.strides[d];
  }
  return static_cast<uint64_t>(logical);
}

// The same checks as the host's random fills (core/rng.cc).
LogicalMap logical_map(const Shape& shape, const LogicalSlice& slice, const char* op) {
  LogicalMap m;
  if (slice.logical_shape.empty() && slice.offset.empty()) return m;
  HAP_CHECK(slice.logical_shape.size() == shape.size() && slice.offset.size() == shape.size(), op,
            ": slice of rank ", slice.logical_shape.size(), " for a tensor of rank ", shape.size());
  HAP_CHECK(shape.size() <= kMaxDims, op, " on cuda: at most ", kMaxDims, " dimensions, got ",
            shape_str(shape));
  const Strides st = contiguous_strides(slice.logical_shape);
  m.whole = false;
  m.ndim = static_cast<int>(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    HAP_CHECK(slice.offset[d] >= 0 && slice.offset[d] + shape[d] <= slice.logical_shape[d], op,
              ": local shape ", shape_str(shape), " at offset ", slice.offset[d], " in dim ", d,
              " does not fit the logical shape ", shape_str(slice.logical_shape));
    m.sizes[d] = shape[d];
    m.offset[d] = slice.offset[d];
    m.strides[d] = st[d];
  }
  return m;
}

// y = (mask * x) * scale with mask = 1 where the uniform draw is below keep, as the CPU computes.
// T is the storage type; bf16 computes in f32 (widen, narrow), as the f32 route would.
template <typename T>
__global__ void dropout_kernel(T* y, const T* x, Indexer ix, int64_t n, LogicalMap map,
                               uint64_t seed, uint64_t stream, double keep,
                               typename ComputeOf<T>::type scale) {
  using C = typename ComputeOf<T>::type;
  HAP_GRID_STRIDE_LOOP(i, n) {
    const double u = static_cast<double>(philox_uniform(seed, stream, logical_index(map, i)));
    const C mask = u < keep ? C(1) : C(0);
    y[i] = narrow<T>(mask * widen(x[offset_of(ix, i)]) * scale);
  }
}

std::vector<Tensor> dropout(const KernelContext& c) {
  const RandomAttrs& a = attr<RandomAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  const int64_t n = out.numel();
  const LogicalMap map = logical_map(out.shape(), a.slice, "dropout");  // checked when empty too
  if (n == 0) return {out};
  const Indexer ix = indexer(c.inputs[0], out.shape(), "dropout");
  const double keep = 1.0 - a.p, scale = 1.0 / (1.0 - a.p);
  on_float_or_bf16(out, "dropout", [&](auto tag) {
    using T = decltype(tag);
    using C = typename ComputeOf<T>::type;
    dropout_kernel<<<blocks_for(n), kThreads>>>(ptr<T>(out), ptr<T>(c.inputs[0]), ix, n, map,
                                                a.seed, a.stream, keep, static_cast<C>(scale));
  });
  return {out};
}

// The attributes a kernel takes (the slice, a host vector, travels as the LogicalMap).
struct MaskTokensArgs {
  double p;
  int64_t mask_id, vocab, ignore_index;
  bool targets;
  uint64_t seed, stream;
};

// ops/defs/nn.cc masked_token, word for word.
__global__ void mask_tokens_kernel(int64_t* out, const int64_t* ids, Indexer ix, int64_t n,
                                   LogicalMap map, MaskTokensArgs a) {
  constexpr double kWord = 1.0 / 4294967296.0;
  HAP_GRID_STRIDE_LOOP(i, n) {
    const uint64_t logical = logical_index(map, i);
    uint32_t w0 = static_cast<uint32_t>(logical), w1 = static_cast<uint32_t>(logical >> 32);
    uint32_t w2 = static_cast<uint32_t>(a.stream), w3 = static_cast<uint32_t>(a.stream >> 32);
    philox4x32_rounds(w0, w1, w2, w3, static_cast<uint32_t>(a.seed),
                      static_cast<uint32_t>(a.seed >> 32));
    const int64_t id = ids[offset_of(ix, i)];
    const bool chosen = static_cast<double>(w0) * kWord < a.p;
    int64_t r = id;
    if (a.targets) {
      r = chosen ? id : a.ignore_index;
    } else if (chosen) {
      const double u = static_cast<double>(w1) * kWord;
      if (u < 0.8)
        r = a.mask_id;
      else if (u < 0.9)
        r = static_cast<int64_t>(static_cast<uint64_t>(w2) % static_cast<uint64_t>(a.vocab));
    }
    out[i] = r;
  }
}

std::vector<Tensor> mask_tokens(const KernelContext& c) {
  const MaskTokensAttrs& a = attr<MaskTokensAttrs>(c.attrs);
  Tensor out = c.alloc(0);
  const int64_t n = out.numel();
  const LogicalMap map = logical_map(out.shape(), a.slice, "mask_tokens");  // checked when empty
  if (n == 0) return {out};
  const Indexer ix = indexer(c.inputs[0], out.shape(), "mask_tokens");
  ::hap::cuda::set_device(out.device().index);
  const MaskTokensArgs args{a.p, a.mask_id, a.vocab, a.ignore_index, a.targets, a.seed, a.stream};
  mask_tokens_kernel<<<blocks_for(n), kThreads>>>(ptr<int64_t>(out), ptr<int64_t>(c.inputs[0]), ix,
                                                  n, map, args);
  check_launch("mask_tokens");
  return {out};
}

}  // namespace

void register_random(OpTable& t) {
  t[static_cast<size_t>(OpKind::Dropout)].cuda = dropout;
  // Dropout takes bf16 itself (f32 compute, one rounding: the route's result in one kernel).
  t[static_cast<size_t>(OpKind::Dropout)].cuda_bf16 = true;
  t[static_cast<size_t>(OpKind::MaskTokens)].cuda = mask_tokens;
}

}  // namespace hap::ops::cuda
