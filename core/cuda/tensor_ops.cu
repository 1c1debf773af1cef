// Fill and copy of strided CUDA tensors: one thread per element, each mapping its flat index to
// an offset in every view. A copy of one dtype moves the elements' bits; between dtypes it
// converts as the host does (core/strided_copy.h).
#include <cstring>

#include "core/cuda/backend.h"
#include "core/cuda/indexing.cuh"
#include "core/cuda/tensor_ops.h"
#include "core/strided_copy.h"

namespace hap::cuda {
namespace {

template <typename Bits>
__global__ void fill_kernel(Bits* p, Indexer ix, int64_t n, Bits value) {
  HAP_GRID_STRIDE_LOOP(i, n) { p[offset_of(ix, i)] = value; }
}

template <typename To, typename From>
__global__ void copy_kernel(To* dst, Indexer di, const From* src, Indexer si, int64_t n) {
  HAP_GRID_STRIDE_LOOP(i, n) { dst[offset_of(di, i)] = convert<To>(src[offset_of(si, i)]); }
}

// Calls f(Bits{}) with an unsigned type of the element size of `dtype`.
template <typename F>
void on_bits(DType dtype, F&& f) {
  switch (dtype_size(dtype)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      HAP_ASSERT(false, "unexpected element size of ", dtype_name(dtype));
  }
}

}  // namespace

void fill_elements(const Tensor& t, double value) {
  const int64_t n = t.numel();
  if (n == 0) return;
  const Indexer ix = indexer(t, t.shape(), "fill_");
  ::hap::cuda::set_device(t.device().index);
  // The element's bits, converted on the host exactly as a host fill_ would.
  on_bits(t.dtype(), [&](auto bits_tag) {
    using Bits = decltype(bits_tag);
    Bits bits{};
    dispatch_all_types(t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (sizeof(T) == sizeof(Bits)) {
        const T v = hap::convert<T>(value);
        std::memcpy(&bits, &v, sizeof(Bits));
      }
    });
    fill_kernel<<<blocks_for(n), kThreads>>>(static_cast<Bits*>(t.raw_data()), ix, n, bits);
  });
  check_launch("fill_");
}

void copy_elements(const Tensor& dst, const Tensor& src) {
  HAP_CHECK(dst.shape() == src.shape() && dst.device() == src.device(), "copy on ",
            dst.device().str(), ": ", src.str(), " into ", dst.str(),
            " (a copy needs one shape on one device)");
  const int64_t n = dst.numel();
  if (n == 0) return;
  const Indexer di = indexer(dst, dst.shape(), "copy"), si = indexer(src, dst.shape(), "copy");
  ::hap::cuda::set_device(dst.device().index);
  if (dst.dtype() == src.dtype()) {
    on_bits(dst.dtype(), [&](auto tag) {
      using Bits = decltype(tag);
      copy_kernel<<<blocks_for(n), kThreads>>>(static_cast<Bits*>(dst.raw_data()), di,
                                               static_cast<const Bits*>(src.raw_data()), si, n);
    });
  } else {
    on_any_dtype(dst.dtype(), [&](auto to_tag) {
      using To = decltype(to_tag);
      on_any_dtype(src.dtype(), [&](auto from_tag) {
        using From = decltype(from_tag);
        copy_kernel<<<blocks_for(n), kThreads>>>(static_cast<To*>(dst.raw_data()), di,
                                                 static_cast<const From*>(src.raw_data()), si, n);
      });
    });
  }
  check_launch("copy");
}

}  // namespace hap::cuda
