// Convolution and pooling over [N, C, H, W] images: conv2d (stride, padding, dilation, groups) as
// im2col + OpenBLAS GEMM per image and group, its fused backward (input, weight and bias
// gradients), max and average pooling with their backward kernels.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu/blas.h"
#include "ops/cpu/loops.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

// The output size of one spatial dim (0 when the window does not fit).
int64_t conv_out(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

void check_pair(const char* op, const char* what, const std::array<int64_t, 2>& v, int64_t min) {
  HAP_CHECK(v[0] >= min && v[1] >= min, op, ": ", what, " must be >= ", min, ", got [", v[0], ", ",
            v[1], "]");
}

// ---- conv2d ----

struct ConvGeometry {
  int64_t n, c, h, w;      // input
  int64_t o, kh, kw;       // weight [O, C / groups, KH, KW]
  int64_t oh, ow;          // output
  int64_t groups, cg, og;  // channels per group in and out
  int64_t k;               // C / groups * KH * KW: the GEMM's inner size
};

ConvGeometry conv_geometry(const Shape& x, const Shape& w, const Conv2dAttrs& a) {
  ConvGeometry g;
  g.n = x[0], g.c = x[1], g.h = x[2], g.w = x[3];
  g.o = w[0], g.kh = w[2], g.kw = w[3];
  g.groups = a.groups;
  g.cg = g.c / a.groups;
  g.og = g.o / a.groups;
  g.oh = conv_out(g.h, g.kh, a.stride[0], a.padding[0], a.dilation[0]);
  g.ow = conv_out(g.w, g.kw, a.stride[1], a.padding[1], a.dilation[1]);
  g.k = g.cg * g.kh * g.kw;
  return g;
}

Metas infer_conv2d(const Metas& in, const Attrs& attrs) {
  const char* op = "conv2d";
  const Conv2dAttrs& a = attr<Conv2dAttrs>(attrs);
  check_floating(op, in, 0);
  check_floating(op, in, 1);
  check_same_dtype(op, in, 0, 1);
  const Shape &x = in[0].shape, &w = in[1].shape;
  HAP_CHECK(x.size() == 4, op, ": input must be [N, C, H, W], got ", shape_str(x));
  HAP_CHECK(w.size() == 4, op, ": weight must be [O, C / groups, KH, KW], got ", shape_str(w));
  check_pair(op, "stride", a.stride, 1);
  check_pair(op, "dilation", a.dilation, 1);
  check_pair(op, "padding", a.padding, 0);
  HAP_CHECK(a.groups >= 1 && x[1] % a.groups == 0 && w[0] % a.groups == 0, op, ": groups ",
            a.groups, " must divide the input channels (", x[1], ") and the output channels (",
            w[0], ")");
  HAP_CHECK(w[1] * a.groups == x[1], op, ": weight ", shape_str(w), " takes ", w[1] * a.groups,
            " input channels in ", a.groups, " group(s), the input ", shape_str(x), " has ", x[1]);
  if (in[2].defined) {
    check_same_dtype(op, in, 0, 2);
    HAP_CHECK(in[2].shape == Shape{w[0]}, op, ": bias ", shape_str(in[2].shape), " must be [", w[0],
              "]");
  }
  const ConvGeometry g = conv_geometry(x, w, a);
  HAP_CHECK(g.oh >= 1 && g.ow >= 1, op, ": a ", g.kh, "x", g.kw, " kernel (dilation [",
            a.dilation[0], ", ", a.dilation[1], "], padding [", a.padding[0], ", ", a.padding[1],
            "]) does not fit the input ", shape_str(x));
  return {{Shape{g.n, g.o, g.oh, g.ow}, in[0].dtype}};
}

// cols [K, OH * OW] of image `img` (C x H x W, contiguous), channels [c0, c0 + cg).
template <typename T>
void im2col(const T* img, const ConvGeometry& g, const Conv2dAttrs& a, int64_t c0, T* cols) {
  const int64_t plane = g.oh * g.ow;
  for (int64_t c = 0; c < g.cg; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = cols + ((c * g.kh + i) * g.kw + j) * plane;
        const T* src = img + (c0 + c) * g.h * g.w;
        for (int64_t y = 0; y < g.oh; ++y) {
          const int64_t iy = y * a.stride[0] - a.padding[0] + i * a.dilation[0];
          for (int64_t x = 0; x < g.ow; ++x) {
            const int64_t ix = x * a.stride[1] - a.padding[1] + j * a.dilation[1];
            row[y * g.ow + x] =
                iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? src[iy * g.w + ix] : T(0);
          }
        }
      }
}

// The adjoint of im2col: adds cols [K, OH * OW] into image `img`'s channels [c0, c0 + cg).
template <typename T>
void col2im(const T* cols, const ConvGeometry& g, const Conv2dAttrs& a, int64_t c0, T* img) {
  const int64_t plane = g.oh * g.ow;
  for (int64_t c = 0; c < g.cg; ++c)
    for (int64_t i = 0; i < g.kh; ++i)
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = cols + ((c * g.kh + i) * g.kw + j) * plane;
        T* dst = img + (c0 + c) * g.h * g.w;
        for (int64_t y = 0; y < g.oh; ++y) {
          const int64_t iy = y * a.stride[0] - a.padding[0] + i * a.dilation[0];
          if (iy < 0 || iy >= g.h) continue;
          for (int64_t x = 0; x < g.ow; ++x) {
            const int64_t ix = x * a.stride[1] - a.padding[1] + j * a.dilation[1];
            if (ix >= 0 && ix < g.w) dst[iy * g.w + ix] += row[y * g.ow + x];
          }
        }
      }
}

// out[n, group o-block] = W_g [og, K] @ cols [K, OH * OW] (+ bias), images in parallel (GEMM
// runs single-threaded inside the parallel region).
template <typename T>
void conv2d_kernel(const KernelContext& c, const Tensor& out) {
  const Conv2dAttrs& a = attr<Conv2dAttrs>(c.attrs);
  const Tensor x = c.inputs[0].contiguous(), w = c.inputs[1].contiguous();
  const Tensor b = c.inputs[2].defined() ? c.inputs[2].contiguous() : Tensor();
  const ConvGeometry g = conv_geometry(x.shape(), w.shape(), a);
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pb = b.defined() ? b.data<T>() : nullptr;
  T* py = out.data<T>();
  const int64_t plane = g.oh * g.ow;
  cpu::gemm_path();  // HAP_CPU_GEMM is read (and may throw) before the parallel region
#pragma omp parallel if (g.n > 1)
  {
    std::vector<T> cols(static_cast<size_t>(g.k * plane));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n) {
      const T* img = px + n * g.c * g.h * g.w;
      T* yn = py + n * g.o * plane;
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        im2col(img, g, a, grp * g.cg, cols.data());
        cpu::gemm<T>(false, false, g.og, plane, g.k, T(1), pw + grp * g.og * g.k, g.k, cols.data(),
                     plane, T(0), yn + grp * g.og * plane, plane);
      }
      if (pb)
        for (int64_t o = 0; o < g.o; ++o)
          for (int64_t p = 0; p < plane; ++p) yn[o * plane + p] += pb[o];
    }
  }
}

// (g [N, O, OH, OW], x, w) -> dx, dw, db.
template <typename T>
void conv2d_backward_kernel(const KernelContext& c, const std::vector<Tensor>& outs) {
  const Conv2dAttrs& a = attr<Conv2dAttrs>(c.attrs);
  const Tensor gy = c.inputs[0].contiguous(), x = c.inputs[1].contiguous(),
               w = c.inputs[2].contiguous();
  const ConvGeometry g = conv_geometry(x.shape(), w.shape(), a);
  const T* pg = gy.data<T>();
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  T* dx = outs[0].data<T>();
  T* dw = outs[1].data<T>();
  T* db = outs[2].data<T>();
  const int64_t plane = g.oh * g.ow;
  // Bias: sum over images and positions, in a fixed order.
#pragma omp parallel for if (g.o * g.n * plane > cpu::kParallelGrain)
  for (int64_t o = 0; o < g.o; ++o) {
    T s = 0;
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t p = 0; p < plane; ++p) s += pg[(n * g.o + o) * plane + p];
    db[o] = s;
  }
  // Input: dcols = W_g^T g_n, added back by col2im; images in parallel.
  std::fill(dx, dx + x.numel(), T(0));
  cpu::gemm_path();  // HAP_CPU_GEMM is read (and may throw) before the parallel region
#pragma omp parallel if (g.n > 1)
  {
    std::vector<T> cols(static_cast<size_t>(g.k * plane));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < g.n; ++n)
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        cpu::gemm<T>(true, false, g.k, plane, g.og, T(1), pw + grp * g.og * g.k, g.k,
                     pg + (n * g.o + grp * g.og) * plane, plane, T(0), cols.data(), plane);
        col2im(cols.data(), g, a, grp * g.cg, dx + n * g.c * g.h * g.w);
      }
  }
  // Weight: sum over images of g_n,g cols_n,g^T, images in order (GEMM's own threads).
  std::fill(dw, dw + w.numel(), T(0));
  std::vector<T> cols(static_cast<size_t>(g.k * plane));
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      im2col(px + n * g.c * g.h * g.w, g, a, grp * g.cg, cols.data());
      cpu::gemm<T>(false, true, g.og, g.k, plane, T(1), pg + (n * g.o + grp * g.og) * plane, plane,
                   cols.data(), plane, T(1), dw + grp * g.og * g.k, g.k);
    }
}

// Batch split; output channels split (weight and bias rows, groups of 1); input channels split
// (a Partial sum, the bias Partial as for a row-parallel linear).
std::vector<ShardSignature> shard_conv2d(const Metas& in, const Metas&, const Attrs& attrs) {
  const bool bias = in[2].defined;
  const Prop r = Prop::replicated();
  std::vector<ShardSignature> sigs = {{{Prop::sharded(0), r, r}, {Prop::sharded(0)}}};
  if (attr<Conv2dAttrs>(attrs).groups == 1) {
    sigs.push_back({{r, Prop::sharded(0), bias ? Prop::sharded(0) : r}, {Prop::sharded(1)}});
    sigs.push_back(
        {{Prop::sharded(1), Prop::sharded(1), bias ? Prop::partial() : r}, {Prop::partial()}});
  }
  return sigs;
}

// ---- pooling ----

Metas infer_pool(const Metas& in, const Attrs& attrs, const char* op) {
  const Pool2dAttrs& a = attr<Pool2dAttrs>(attrs);
  check_floating(op, in, 0);
  const Shape& x = in[0].shape;
  HAP_CHECK(x.size() == 4, op, ": input must be [N, C, H, W], got ", shape_str(x));
  check_pair(op, "kernel size", a.kernel, 1);
  check_pair(op, "stride", a.stride, 1);
  check_pair(op, "padding", a.padding, 0);
  HAP_CHECK(2 * a.padding[0] <= a.kernel[0] && 2 * a.padding[1] <= a.kernel[1], op, ": padding [",
            a.padding[0], ", ", a.padding[1], "] must be at most half the kernel [", a.kernel[0],
            ", ", a.kernel[1], "]");
  const int64_t oh = conv_out(x[2], a.kernel[0], a.stride[0], a.padding[0], 1);
  const int64_t ow = conv_out(x[3], a.kernel[1], a.stride[1], a.padding[1], 1);
  HAP_CHECK(oh >= 1 && ow >= 1, op, ": a ", a.kernel[0], "x", a.kernel[1],
            " window does not fit the input ", shape_str(x));
  return {{Shape{x[0], x[1], oh, ow}, in[0].dtype}};
}

// (gradient of the output, input) -> gradient of the input.
Metas infer_pool_backward(const Metas& in, const Attrs& attrs, const char* op) {
  const Metas y = infer_pool({in[1]}, attrs, op);
  HAP_CHECK(in[0].shape == y[0].shape, op, ": gradient ", shape_str(in[0].shape),
            " does not match the output ", shape_str(y[0].shape));
  check_same_dtype(op, in, 0, 1);
  return Metas{in[1]};
}

// Calls f(plane index, oy, ox, iy, ix) for every in-bounds input position of every output
// window, over the N * C planes in parallel.
template <typename F>
void for_each_window(const Shape& x, const Shape& y, const Pool2dAttrs& a, F&& f) {
  const int64_t planes = x[0] * x[1], h = x[2], w = x[3], oh = y[2], ow = y[3];
#pragma omp parallel for if (planes * oh * ow * a.kernel[0] * a.kernel[1] > cpu::kParallelGrain)
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox)
        for (int64_t i = 0; i < a.kernel[0]; ++i) {
          const int64_t iy = oy * a.stride[0] - a.padding[0] + i;
          if (iy < 0 || iy >= h) continue;
          for (int64_t j = 0; j < a.kernel[1]; ++j) {
            const int64_t ix = ox * a.stride[1] - a.padding[1] + j;
            if (ix >= 0 && ix < w) f(p, oy, ox, iy, ix);
          }
        }
}

// The first maximum of each window (in window order; NaN wins, as in PyTorch), as an input index.
template <typename T>
void argmax_windows(const Tensor& x, const Shape& y, const Pool2dAttrs& a,
                    std::vector<int64_t>& at) {
  const Shape& s = x.shape();
  const T* px = x.data<T>();
  const int64_t h = s[2], w = s[3], oh = y[2], ow = y[3];
  at.assign(static_cast<size_t>(s[0] * s[1] * oh * ow), -1);
  for_each_window(s, y, a, [&](int64_t p, int64_t oy, int64_t ox, int64_t iy, int64_t ix) {
    int64_t& best = at[static_cast<size_t>((p * oh + oy) * ow + ox)];
    const int64_t idx = (p * h + iy) * w + ix;
    const T v = px[idx];
    if (best < 0 || v > px[best] || (v != v && px[best] == px[best])) best = idx;
  });
}

}  // namespace

void register_conv_ops(OpTable& t) {
  OpDef& cv = def_of(t, OpKind::Conv2d);
  cv.autocast = Autocast::Lower;
  cv.name = "conv2d";
  cv.num_inputs = 3;
  cv.optional_inputs = 0b100u;
  cv.product = cv.flops_bound = true;
  cv.infer = infer_conv2d;
  cv.flops = [](const Metas& in, const Metas& out, const Attrs& attrs) {
    const Shape& w = in[1].shape;
    return 2.0 * static_cast<double>(shape_numel(out[0].shape)) *
           static_cast<double>(w[1] * w[2] * w[3]);
  };
  cv.shard = shard_conv2d;
  cv.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "conv2d", [&](auto tag) { conv2d_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };
  cv.backward = [](const BackwardContext& c) {
    std::vector<Tensor> g =
        call(OpKind::Conv2dBackward, {c.grad_outputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
    std::vector<Tensor> grads(3);
    for (size_t i = 0; i < 3; ++i)
      if (c.needs_input_grad[i]) grads[i] = g[i];
    return grads;
  };

  OpDef& cb = def_of(t, OpKind::Conv2dBackward);
  cb.name = "conv2d_backward";
  cb.num_inputs = 3;
  cb.flops_bound = true;
  cb.infer = [](const Metas& in, const Attrs& attrs) {
    Metas fwd = {in[1], in[2], {{}, DType::F32, false}};
    const Metas y = infer_conv2d(fwd, attrs);
    HAP_CHECK(in[0].shape == y[0].shape, "conv2d_backward: gradient ", shape_str(in[0].shape),
              " does not match the output ", shape_str(y[0].shape));
    check_same_dtype("conv2d_backward", in, 0, 1);
    return Metas{in[1], in[2], {Shape{in[2].shape[0]}, in[2].dtype}};
  };
  cb.flops = [](const Metas& in, const Metas&, const Attrs&) {
    const Shape& w = in[2].shape;
    return 4.0 * static_cast<double>(shape_numel(in[0].shape)) *
           static_cast<double>(w[1] * w[2] * w[3]);
  };
  // The forward's three splits. Images: the input gradient split alike, the weight and bias
  // gradients Partial sums. Output channels: weight and bias gradients split, the input gradient
  // a Partial sum. Input channels: input and weight gradients split, the bias gradient whole.
  cb.shard = [](const Metas&, const Metas&, const Attrs& attrs) {
    const Prop r = Prop::replicated(), p = Prop::partial();
    std::vector<ShardSignature> sigs = {
        {{Prop::sharded(0), Prop::sharded(0), r}, {Prop::sharded(0), p, p}}};
    if (attr<Conv2dAttrs>(attrs).groups == 1) {
      sigs.push_back(
          {{Prop::sharded(1), r, Prop::sharded(0)}, {p, Prop::sharded(0), Prop::sharded(0)}});
      sigs.push_back(
          {{r, Prop::sharded(1), Prop::sharded(1)}, {Prop::sharded(1), Prop::sharded(1), r}});
    }
    return sigs;
  };
  cb.cpu = [](const KernelContext& c) {
    std::vector<Tensor> outs = {c.alloc(0), c.alloc(1), c.alloc(2)};
    dispatch_float(outs[0].dtype(), "conv2d_backward",
                   [&](auto tag) { conv2d_backward_kernel<decltype(tag)>(c, outs); });
    return outs;
  };

  // Pools split by image and by channel alike.
  auto shard_pool = [](const Metas&, const Metas&, const Attrs&) {
    return std::vector<ShardSignature>{{{Prop::sharded(0)}, {Prop::sharded(0)}},
                                       {{Prop::sharded(1)}, {Prop::sharded(1)}}};
  };
  auto shard_pool_backward = [](const Metas&, const Metas&, const Attrs&) {
    return std::vector<ShardSignature>{{{Prop::sharded(0), Prop::sharded(0)}, {Prop::sharded(0)}},
                                       {{Prop::sharded(1), Prop::sharded(1)}, {Prop::sharded(1)}}};
  };

  OpDef& mp = def_of(t, OpKind::MaxPool2d);
  mp.name = "max_pool2d";
  mp.num_inputs = 1;
  mp.infer = [](const Metas& in, const Attrs& a) { return infer_pool(in, a, "max_pool2d"); };
  mp.flops = [](const Metas&, const Metas& out, const Attrs& a) {
    const Pool2dAttrs& p = attr<Pool2dAttrs>(a);
    return static_cast<double>(shape_numel(out[0].shape) * p.kernel[0] * p.kernel[1]);
  };
  mp.shard = shard_pool;
  mp.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "max_pool2d", [&](auto tag) {
      using T = decltype(tag);
      const Tensor x = c.inputs[0].contiguous();
      std::vector<int64_t> at;
      argmax_windows<T>(x, out.shape(), attr<Pool2dAttrs>(c.attrs), at);
      const T* px = x.data<T>();
      T* py = out.data<T>();
      for (size_t i = 0; i < at.size(); ++i) py[i] = px[at[i]];
    });
    return std::vector<Tensor>{out};
  };
  mp.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{
        call1(OpKind::MaxPool2dBackward, {c.grad_outputs[0], c.inputs[0]}, c.attrs)};
  };

  OpDef& mb = def_of(t, OpKind::MaxPool2dBackward);
  mb.name = "max_pool2d_backward";
  mb.num_inputs = 2;
  mb.infer = [](const Metas& in, const Attrs& a) {
    return infer_pool_backward(in, a, "max_pool2d_backward");
  };
  mb.shard = shard_pool_backward;
  mb.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "max_pool2d_backward", [&](auto tag) {
      using T = decltype(tag);
      const Tensor g = c.inputs[0].contiguous(), x = c.inputs[1].contiguous();
      std::vector<int64_t> at;
      argmax_windows<T>(x, g.shape(), attr<Pool2dAttrs>(c.attrs), at);
      const T* pg = g.data<T>();
      T* dx = out.data<T>();
      std::fill(dx, dx + out.numel(), T(0));
      for (size_t i = 0; i < at.size(); ++i) dx[at[i]] += pg[i];
    });
    return std::vector<Tensor>{out};
  };

  // Average pooling counts padding positions in the divisor (PyTorch's count_include_pad).
  OpDef& ap = def_of(t, OpKind::AvgPool2d);
  ap.name = "avg_pool2d";
  ap.num_inputs = 1;
  ap.saves_inputs = true;
  ap.infer = [](const Metas& in, const Attrs& a) { return infer_pool(in, a, "avg_pool2d"); };
  ap.flops = mp.flops;
  ap.shard = shard_pool;
  ap.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "avg_pool2d", [&](auto tag) {
      using T = decltype(tag);
      const Pool2dAttrs& a = attr<Pool2dAttrs>(c.attrs);
      const Tensor x = c.inputs[0].contiguous();
      const Shape& s = x.shape();
      const T* px = x.data<T>();
      T* py = out.data<T>();
      std::fill(py, py + out.numel(), T(0));
      const int64_t oh = out.shape()[2], ow = out.shape()[3];
      for_each_window(s, out.shape(), a,
                      [&](int64_t p, int64_t oy, int64_t ox, int64_t iy, int64_t ix) {
                        py[(p * oh + oy) * ow + ox] += px[(p * s[2] + iy) * s[3] + ix];
                      });
      const T scale = T(1) / static_cast<T>(a.kernel[0] * a.kernel[1]);
      for (int64_t i = 0; i < out.numel(); ++i) py[i] *= scale;
    });
    return std::vector<Tensor>{out};
  };
  ap.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{
        call1(OpKind::AvgPool2dBackward, {c.grad_outputs[0], c.inputs[0]}, c.attrs)};
  };

  OpDef& ab = def_of(t, OpKind::AvgPool2dBackward);
  ab.name = "avg_pool2d_backward";
  ab.num_inputs = 2;
  ab.infer = [](const Metas& in, const Attrs& a) {
    return infer_pool_backward(in, a, "avg_pool2d_backward");
  };
  ab.shard = shard_pool_backward;
  ab.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "avg_pool2d_backward", [&](auto tag) {
      using T = decltype(tag);
      const Pool2dAttrs& a = attr<Pool2dAttrs>(c.attrs);
      const Tensor g = c.inputs[0].contiguous();
      const Shape& s = out.shape();
      const T* pg = g.data<T>();
      T* dx = out.data<T>();
      std::fill(dx, dx + out.numel(), T(0));
      const int64_t oh = g.shape()[2], ow = g.shape()[3];
      const T scale = T(1) / static_cast<T>(a.kernel[0] * a.kernel[1]);
      // Windows overlap when the stride is below the kernel: scatter plane by plane.
      for_each_window(s, g.shape(), a,
                      [&](int64_t p, int64_t oy, int64_t ox, int64_t iy, int64_t ix) {
                        dx[(p * s[2] + iy) * s[3] + ix] += pg[(p * oh + oy) * ow + ox] * scale;
                      });
    });
    return std::vector<Tensor>{out};
  };
}

}  // namespace hap::ops
