// CUDA kernels of conv2d and its backward, max and average pooling and theirs, with the CPU's
// semantics (ops/defs/conv.cc): zero padding for conv2d, padding never chosen by max pooling (the
// first maximum in window order wins, a NaN over a number), padding counted in average pooling's
// divisor. Convolution goes through cuDNN where it is available and accepts the geometry
// (ops/cuda/conv_cudnn.h: deterministic algorithms, no TF32); otherwise, and with HAP_CUDNN=0, it
// is im2col + cuBLAS GEMM, one GEMM per chunk of images batched over the groups. Pooling stays
// with the own kernels: max pooling's rule for ties and NaNs is the CPU's, which cuDNN's pooling
// does not promise, the op's backward takes the input where cuDNN's takes the output too, and
// pooling is one memory-bound pass either way. Every own backward gathers in a fixed order
// (col2im and the pooling gradients: one thread per input element; the bias gradient: one block
// per channel), so runs are deterministic and no kernel uses atomics. Pooling matches the CPU bit
// for bit, except that the CPU may fuse average pooling's backward multiply-add where the host
// compiler contracts it.
#include <cstdint>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/conv_cudnn.h"
#include "ops/cuda/kernels.h"
#include "ops/defs/common.h"

namespace hap::ops::cuda {
namespace {

// Elements of the im2col buffer per chunk of images (128 MiB in f32): bounds the temporaries of a
// large batch while keeping each GEMM large.
constexpr int64_t kColumnBudget = int64_t{1} << 25;

void zero(const Tensor& t) {
  if (t.numel() == 0) return;
  HAP_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.nbytes()));  // +0.0 in f32 and f64
}

// A temporary of `numel` elements with `like`'s dtype, on its device.
Tensor buffer(int64_t numel, const Tensor& like) {
  return Tensor::empty({numel},
                       TensorOptions{}.with_dtype(like.dtype()).with_device(like.device()));
}

// ---- conv2d ----

// x [N, C, H, W], weight [O, C / groups, KH, KW], output [N, O, OH, OW].
struct ConvGeometry {
  int64_t n, c, h, w;      // input
  int64_t o, kh, kw;       // weight
  int64_t oh, ow, plane;   // output; plane = OH * OW
  int64_t groups, cg, og;  // groups; input and output channels per group
  int64_t k;               // C / groups * KH * KW: the GEMM's inner size
  int64_t sh, sw, ph, pw, dh, dw;
};

ConvGeometry conv_geometry(const Shape& x, const Shape& w, const Shape& y, const Conv2dAttrs& a) {
  ConvGeometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.kh = w[2], g.kw = w[3];
  g.oh = y[2], g.ow = y[3], g.plane = y[2] * y[3];
  g.groups = a.groups, g.cg = g.c / a.groups, g.og = g.o / a.groups;
  g.k = g.cg * g.kh * g.kw;
  g.sh = a.stride[0], g.sw = a.stride[1];
  g.ph = a.padding[0], g.pw = a.padding[1];
  g.dh = a.dilation[0], g.dw = a.dilation[1];
  return g;
}

// Images per chunk: as many as the column budget holds, at least one.
int64_t images_per_chunk(const ConvGeometry& g) {
  const int64_t per_image = g.c * g.kh * g.kw * g.plane;
  if (per_image == 0 || g.n == 0) return g.n > 0 ? g.n : 1;
  const int64_t fit = kColumnBudget / per_image;
  return fit < 1 ? 1 : (fit < g.n ? fit : g.n);
}

// The columns of images [n0, n0 + count), channel-major so that one GEMM per group covers every
// image: cols [groups, K, count, OH * OW], row r = (channel * KH + ki) * KW + kj (= group * K +
// the row within the group), zeros where the window reaches into the padding.
template <typename T>
__global__ void im2col_kernel(T* cols, const T* x, ConvGeometry g, int64_t n0, int64_t count) {
  const int64_t width = count * g.plane;
  HAP_GRID_STRIDE_LOOP(i, g.c * g.kh * g.kw * width) {
    const int64_t q = i % width, row = i / width;
    const int64_t n = q / g.plane, p = q % g.plane;
    const int64_t oy = p / g.ow, ox = p % g.ow;
    const int64_t kj = row % g.kw, ki = (row / g.kw) % g.kh, ch = row / (g.kh * g.kw);
    const int64_t iy = oy * g.sh - g.ph + ki * g.dh, ix = ox * g.sw - g.pw + kj * g.dw;
    cols[i] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w
                  ? x[(((n0 + n) * g.c + ch) * g.h + iy) * g.w + ix]
                  : T(0);
  }
}

// The adjoint of im2col, gathered: dx of images [n0, n0 + count) is, for each element, the sum of
// the column entries that read it, in kernel order (ki, kj) as the CPU's col2im adds them.
template <typename T>
__global__ void col2im_kernel(T* dx, const T* cols, ConvGeometry g, int64_t n0, int64_t count) {
  const int64_t image = g.c * g.h * g.w;
  HAP_GRID_STRIDE_LOOP(i, count * image) {
    const int64_t ix = i % g.w, iy = (i / g.w) % g.h, ch = (i / (g.h * g.w)) % g.c, n = i / image;
    T acc = 0;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t ty = iy + g.ph - ki * g.dh;
      if (ty < 0 || ty % g.sh != 0 || ty / g.sh >= g.oh) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const int64_t tx = ix + g.pw - kj * g.dw;
        if (tx < 0 || tx % g.sw != 0 || tx / g.sw >= g.ow) continue;
        const int64_t row = (ch * g.kh + ki) * g.kw + kj;
        acc += cols[(row * count + n) * g.plane + (ty / g.sh) * g.ow + tx / g.sw];
      }
    }
    dx[n0 * image + i] = acc;
  }
}

// out[n0 + n, o, p] = y[o, n, p] (+ bias[o], added after the product as on the CPU).
template <typename T>
__global__ void to_image_major_kernel(T* out, const T* y, const T* bias, int64_t o, int64_t plane,
                                      int64_t n0, int64_t count) {
  HAP_GRID_STRIDE_LOOP(i, count * o * plane) {
    const int64_t p = i % plane, ch = (i / plane) % o, n = i / (o * plane);
    const T v = y[(ch * count + n) * plane + p];
    out[n0 * o * plane + i] = bias ? v + bias[ch] : v;
  }
}

// y[o, n, p] = gy[n0 + n, o, p]: the gradient of images [n0, n0 + count), channel-major.
template <typename T>
__global__ void to_channel_major_kernel(T* y, const T* gy, int64_t o, int64_t plane, int64_t n0,
                                        int64_t count) {
  HAP_GRID_STRIDE_LOOP(i, count * o * plane) {
    const int64_t p = i % plane, ch = (i / plane) % o, n = i / (o * plane);
    y[(ch * count + n) * plane + p] = gy[n0 * o * plane + i];
  }
}

// db[o] = the sum of gy[:, o] over images and positions: one block per channel, each thread a
// strided partial sum, then a tree over the block (a fixed order).
template <typename T>
__global__ void bias_grad_kernel(T* db, const T* gy, int64_t n, int64_t o, int64_t plane) {
  __shared__ T scratch[kThreads];
  for (int64_t ch = blockIdx.x; ch < o; ch += gridDim.x) {
    T s = 0;
    for (int64_t j = threadIdx.x; j < n * plane; j += blockDim.x)
      s += gy[((j / plane) * o + ch) * plane + j % plane];
    scratch[threadIdx.x] = s;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
      if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x == 0) db[ch] = scratch[0];
    __syncthreads();
  }
}

// y = conv2d(x, w) + b per chunk of images: cols = im2col(x), Y_g [og, count * OH * OW] = W_g
// [og, K] @ cols_g [K, count * OH * OW] for every group in one batched GEMM, then Y (+ b) moved
// into [N, O, OH, OW].
std::vector<Tensor> conv2d(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const Tensor x = dense(c.inputs[0]), w = dense(c.inputs[1]);
  const Tensor b = c.inputs[2].defined() ? dense(c.inputs[2]) : Tensor();
  if (cudnn_conv2d(x, w, b, out, attr<Conv2dAttrs>(c.attrs))) return {out};
  const ConvGeometry g =
      conv_geometry(x.shape(), w.shape(), out.shape(), attr<Conv2dAttrs>(c.attrs));
  const int64_t chunk = images_per_chunk(g);
  on_float(out, "conv2d", [&](auto tag) {
    using T = decltype(tag);
    const Tensor cols = buffer(g.c * g.kh * g.kw * chunk * g.plane, out),
                 y = buffer(g.o * chunk * g.plane, out);
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t count = g.n - n0 < chunk ? g.n - n0 : chunk;
      if (g.k > 0) {
        im2col_kernel<<<blocks_for(g.c * g.kh * g.kw * count * g.plane), kThreads>>>(
            ptr<T>(cols), ptr<T>(x), g, n0, count);
        gemm(y, w, false, cols, false, g.groups, g.og, count * g.plane, g.k, "conv2d");
      } else {
        zero(y);  // no input channels: the empty sum
      }
      to_image_major_kernel<<<blocks_for(count * g.o * g.plane), kThreads>>>(
          ptr<T>(out), ptr<T>(y), b.defined() ? ptr<T>(b) : nullptr, g.o, g.plane, n0, count);
    }
  });
  return {out};
}

// (gy [N, O, OH, OW], x, w) -> dx, dw, db. Per chunk of images, with G = gy channel-major:
// dcols_g = W_g^T G_g then col2im into dx; dW_g += G_g cols_g^T (the chunks' sums added by the
// GEMM's beta). db is one reduction over the whole gradient.
std::vector<Tensor> conv2d_backward(const KernelContext& c) {
  std::vector<Tensor> outs = {c.alloc(0), c.alloc(1), c.alloc(2)};
  const Tensor &dx = outs[0], &dw = outs[1], &db = outs[2];
  const Tensor gy = dense(c.inputs[0]), x = dense(c.inputs[1]), w = dense(c.inputs[2]);
  const ConvGeometry g =
      conv_geometry(x.shape(), w.shape(), gy.shape(), attr<Conv2dAttrs>(c.attrs));
  const int64_t chunk = images_per_chunk(g);
  on_float(dx, "conv2d_backward", [&](auto tag) {
    using T = decltype(tag);
    if (g.o > 0) {
      const int64_t blocks = g.o < 65536 ? g.o : 65536;
      bias_grad_kernel<<<static_cast<int>(blocks), kThreads>>>(ptr<T>(db), ptr<T>(gy), g.n, g.o,
                                                               g.plane);
    }
    if (g.n == 0 || g.og == 0 || g.k == 0) {  // an empty sum for every gradient element
      zero(dx);
      zero(dw);
      return;
    }
    if (cudnn_conv2d_backward(gy, x, w, dx, dw, attr<Conv2dAttrs>(c.attrs))) return;
    const Tensor cols = buffer(g.c * g.kh * g.kw * chunk * g.plane, dx),
                 gc = buffer(g.o * chunk * g.plane, dx);
    for (int64_t n0 = 0; n0 < g.n; n0 += chunk) {
      const int64_t count = g.n - n0 < chunk ? g.n - n0 : chunk, width = count * g.plane;
      to_channel_major_kernel<<<blocks_for(g.o * width), kThreads>>>(ptr<T>(gc), ptr<T>(gy), g.o,
                                                                     g.plane, n0, count);
      gemm(cols, w, true, gc, false, g.groups, g.k, width, g.og, "conv2d_backward");
      col2im_kernel<<<blocks_for(count * g.c * g.h * g.w), kThreads>>>(ptr<T>(dx), ptr<T>(cols), g,
                                                                       n0, count);
      im2col_kernel<<<blocks_for(g.c * g.kh * g.kw * width), kThreads>>>(ptr<T>(cols), ptr<T>(x), g,
                                                                         n0, count);
      gemm(dw, gc, false, cols, true, g.groups, g.og, g.k, width, "conv2d_backward", 1,
           n0 == 0 ? 0 : 1);
    }
  });
  return outs;
}

// ---- pooling ----

// x [N, C, H, W] as planes of H x W, output [N, C, OH, OW].
struct PoolGeometry {
  int64_t planes, h, w, oh, ow;
  int64_t kh, kw, sh, sw, ph, pw;
};

PoolGeometry pool_geometry(const Shape& x, const Shape& y, const Pool2dAttrs& a) {
  return {x[0] * x[1], x[2],        x[3],        y[2],         y[3],        a.kernel[0],
          a.kernel[1], a.stride[0], a.stride[1], a.padding[0], a.padding[1]};
}

// The first maximum of window (oy, ox) of a plane in window order, as an index into the plane; a
// NaN beats a number (ops/defs/conv.cc's argmax_windows). Padding is skipped, never chosen; -1
// only for a window with no input in it, which the shape checks rule out.
template <typename T>
__device__ int64_t window_argmax(const T* plane, const PoolGeometry& g, int64_t oy, int64_t ox) {
  int64_t best = -1;
  T top = 0;
  for (int64_t i = 0; i < g.kh; ++i) {
    const int64_t iy = oy * g.sh - g.ph + i;
    if (iy < 0 || iy >= g.h) continue;
    for (int64_t j = 0; j < g.kw; ++j) {
      const int64_t ix = ox * g.sw - g.pw + j;
      if (ix < 0 || ix >= g.w) continue;
      const T v = plane[iy * g.w + ix];
      if (best < 0 || v > top || (v != v && top == top)) {
        best = iy * g.w + ix;
        top = v;
      }
    }
  }
  return best;
}

// The windows of an output plane that hold input row (or column) `i`: [first, last], empty when
// first > last.
__device__ __forceinline__ void windows_over(int64_t i, int64_t kernel, int64_t stride, int64_t pad,
                                             int64_t out, int64_t& first, int64_t& last) {
  const int64_t lo = i + pad - kernel + 1;
  first = lo <= 0 ? 0 : (lo + stride - 1) / stride;
  last = (i + pad) / stride;
  if (last > out - 1) last = out - 1;
}

// One thread per output element; `at` (when not null) gets the chosen index in the plane.
template <typename T>
__global__ void max_pool_kernel(T* y, int64_t* at, const T* x, PoolGeometry g) {
  HAP_GRID_STRIDE_LOOP(i, g.planes * g.oh * g.ow) {
    const int64_t ox = i % g.ow, oy = (i / g.ow) % g.oh, p = i / (g.oh * g.ow);
    const T* plane = x + p * g.h * g.w;
    const int64_t best = window_argmax(plane, g, oy, ox);
    if (y) y[i] = best >= 0 ? plane[best] : T(0);
    if (at) at[i] = best;
  }
}

// dx of each input element: the gradients of the windows that chose it, added in window order
// (the order in which the CPU's scatter adds them).
template <typename T>
__global__ void max_pool_backward_kernel(T* dx, const T* gy, const int64_t* at, PoolGeometry g) {
  HAP_GRID_STRIDE_LOOP(i, g.planes * g.h * g.w) {
    const int64_t ix = i % g.w, iy = (i / g.w) % g.h, p = i / (g.h * g.w);
    int64_t y0, y1, x0, x1;
    windows_over(iy, g.kh, g.sh, g.ph, g.oh, y0, y1);
    windows_over(ix, g.kw, g.sw, g.pw, g.ow, x0, x1);
    const int64_t self = iy * g.w + ix;
    T acc = 0;
    for (int64_t oy = y0; oy <= y1; ++oy)
      for (int64_t ox = x0; ox <= x1; ++ox) {
        const int64_t win = (p * g.oh + oy) * g.ow + ox;
        if (at[win] == self) acc += gy[win];
      }
    dx[i] = acc;
  }
}

__device__ __forceinline__ float mul_exact(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_exact(double a, double b) { return __dmul_rn(a, b); }

// The window's in-bounds inputs added in window order, then times 1 / (KH * KW): padding counts
// in the divisor.
template <typename T>
__global__ void avg_pool_kernel(T* y, const T* x, PoolGeometry g) {
  const T scale = T(1) / static_cast<T>(g.kh * g.kw);
  HAP_GRID_STRIDE_LOOP(i, g.planes * g.oh * g.ow) {
    const int64_t ox = i % g.ow, oy = (i / g.ow) % g.oh, p = i / (g.oh * g.ow);
    const T* plane = x + p * g.h * g.w;
    T acc = 0;
    for (int64_t r = 0; r < g.kh; ++r) {
      const int64_t iy = oy * g.sh - g.ph + r;
      if (iy < 0 || iy >= g.h) continue;
      for (int64_t s = 0; s < g.kw; ++s) {
        const int64_t ix = ox * g.sw - g.pw + s;
        if (ix >= 0 && ix < g.w) acc += plane[iy * g.w + ix];
      }
    }
    y[i] = mul_exact(acc, scale);
  }
}

// dx of each input element: gy * (1 / (KH * KW)) of every window over it, added in window order;
// the product rounded before the sum (no fused multiply-add), as the CPU's source writes it.
template <typename T>
__global__ void avg_pool_backward_kernel(T* dx, const T* gy, PoolGeometry g) {
  const T scale = T(1) / static_cast<T>(g.kh * g.kw);
  HAP_GRID_STRIDE_LOOP(i, g.planes * g.h * g.w) {
    const int64_t ix = i % g.w, iy = (i / g.w) % g.h, p = i / (g.h * g.w);
    int64_t y0, y1, x0, x1;
    windows_over(iy, g.kh, g.sh, g.ph, g.oh, y0, y1);
    windows_over(ix, g.kw, g.sw, g.pw, g.ow, x0, x1);
    T acc = 0;
    for (int64_t oy = y0; oy <= y1; ++oy)
      for (int64_t ox = x0; ox <= x1; ++ox)
        acc += mul_exact(gy[(p * g.oh + oy) * g.ow + ox], scale);
    dx[i] = acc;
  }
}

std::vector<Tensor> max_pool2d(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const Tensor x = dense(c.inputs[0]);
  const PoolGeometry g = pool_geometry(x.shape(), out.shape(), attr<Pool2dAttrs>(c.attrs));
  on_float(out, "max_pool2d", [&](auto tag) {
    using T = decltype(tag);
    max_pool_kernel<<<blocks_for(out.numel()), kThreads>>>(ptr<T>(out), nullptr, ptr<T>(x), g);
  });
  return {out};
}

// (gy, x) -> dx: each window's choice first (int64 per output element), then the gather.
std::vector<Tensor> max_pool2d_backward(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const Tensor gy = dense(c.inputs[0]), x = dense(c.inputs[1]);
  const PoolGeometry g = pool_geometry(x.shape(), gy.shape(), attr<Pool2dAttrs>(c.attrs));
  const Tensor at =
      Tensor::empty(gy.shape(), TensorOptions{}.with_dtype(DType::I64).with_device(out.device()));
  on_float(out, "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    max_pool_kernel<<<blocks_for(gy.numel()), kThreads>>>(static_cast<T*>(nullptr),
                                                          ptr<int64_t>(at), ptr<T>(x), g);
    max_pool_backward_kernel<<<blocks_for(out.numel()), kThreads>>>(ptr<T>(out), ptr<T>(gy),
                                                                    ptr<int64_t>(at), g);
  });
  return {out};
}

std::vector<Tensor> avg_pool2d(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const Tensor x = dense(c.inputs[0]);
  const PoolGeometry g = pool_geometry(x.shape(), out.shape(), attr<Pool2dAttrs>(c.attrs));
  on_float(out, "avg_pool2d", [&](auto tag) {
    using T = decltype(tag);
    avg_pool_kernel<<<blocks_for(out.numel()), kThreads>>>(ptr<T>(out), ptr<T>(x), g);
  });
  return {out};
}

std::vector<Tensor> avg_pool2d_backward(const KernelContext& c) {
  Tensor out = c.alloc(0);
  if (out.numel() == 0) return {out};
  const Tensor gy = dense(c.inputs[0]);
  const PoolGeometry g = pool_geometry(out.shape(), gy.shape(), attr<Pool2dAttrs>(c.attrs));
  on_float(out, "avg_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    avg_pool_backward_kernel<<<blocks_for(out.numel()), kThreads>>>(ptr<T>(out), ptr<T>(gy), g);
  });
  return {out};
}

}  // namespace

void register_conv(OpTable& t) {
  t[static_cast<size_t>(OpKind::Conv2d)].cuda = conv2d;
  t[static_cast<size_t>(OpKind::Conv2dBackward)].cuda = conv2d_backward;
  t[static_cast<size_t>(OpKind::MaxPool2d)].cuda = max_pool2d;
  t[static_cast<size_t>(OpKind::MaxPool2dBackward)].cuda = max_pool2d_backward;
  t[static_cast<size_t>(OpKind::AvgPool2d)].cuda = avg_pool2d;
  t[static_cast<size_t>(OpKind::AvgPool2dBackward)].cuda = avg_pool2d_backward;
}

}  // namespace hap::ops::cuda
