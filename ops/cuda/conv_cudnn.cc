#include "ops/cuda/conv_cudnn.h"

#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <string>

#include "core/cuda/backend.h"
#include "core/cuda/cudnn.h"
#include "ops/dispatch.h"

namespace hap::ops::cuda {

namespace {

using hap::cuda::Cudnn;

constexpr size_t kMaxWorkspace = size_t{256} << 20;
constexpr int kAlgorithms = 16;  // more than cuDNN 9 has in any direction

bool ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }

// The descriptors of one convolution, destroyed with it.
struct Descriptors {
  explicit Descriptors(const Cudnn& c) : c(c) {}
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    if (x) c.destroy_tensor(x);
    if (y) c.destroy_tensor(y);
    if (b) c.destroy_tensor(b);
    if (w) c.destroy_filter(w);
    if (conv) c.destroy_conv(conv);
  }
  const Cudnn& c;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

// Dims that cuDNN's int sizes hold (and its 2^31-element limit per tensor), none empty.
bool fits(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    if (d <= 0 || d > std::numeric_limits<int32_t>::max()) return false;
    n *= d;
    if (n > std::numeric_limits<int32_t>::max()) return false;
  }
  return true;
}

bool set_dense(const Cudnn& c, cudnnTensorDescriptor_t d, cudnnDataType_t t, const Shape& s) {
  int dims[4], strides[4];
  int64_t stride = 1;
  for (int k = 3; k >= 0; --k) {
    dims[k] = static_cast<int>(s[static_cast<size_t>(k)]);
    strides[k] = static_cast<int>(stride);
    stride *= s[static_cast<size_t>(k)];
  }
  return ok(c.set_tensor(d, t, 4, dims, strides));
}

// The descriptors of x [N, C, H, W] * w [O, C / groups, KH, KW] -> y [N, O, OH, OW] (and the bias
// [1, O, 1, 1] where asked), with TF32 off unless `tf32` (inside an op given bf16 inputs:
// ops::in_bf16_route); false where cuDNN refuses any of them.
bool describe(Descriptors& d, cudnnDataType_t t, const Shape& xs, const Shape& ws, const Shape& ys,
              const Conv2dAttrs& a, bool bias, bool tf32) {
  const Cudnn& c = d.c;
  if (!fits(xs) || !fits(ws) || !fits(ys)) return false;
  for (int64_t v : {a.stride[0], a.stride[1], a.padding[0], a.padding[1], a.dilation[0],
                    a.dilation[1], a.groups})
    if (v > std::numeric_limits<int32_t>::max()) return false;
  if (!ok(c.create_tensor(&d.x)) || !ok(c.create_tensor(&d.y)) || !ok(c.create_filter(&d.w)) ||
      !ok(c.create_conv(&d.conv)))
    return false;
  if (!set_dense(c, d.x, t, xs) || !set_dense(c, d.y, t, ys)) return false;
  const int filter[4] = {static_cast<int>(ws[0]), static_cast<int>(ws[1]), static_cast<int>(ws[2]),
                         static_cast<int>(ws[3])};
  if (!ok(c.set_filter(d.w, t, CUDNN_TENSOR_NCHW, 4, filter))) return false;
  const int pad[2] = {static_cast<int>(a.padding[0]), static_cast<int>(a.padding[1])};
  const int stride[2] = {static_cast<int>(a.stride[0]), static_cast<int>(a.stride[1])};
  const int dilation[2] = {static_cast<int>(a.dilation[0]), static_cast<int>(a.dilation[1])};
  if (!ok(c.set_conv(d.conv, 2, pad, stride, dilation, CUDNN_CROSS_CORRELATION, t)) ||
      !ok(c.set_conv_groups(d.conv, static_cast<int>(a.groups))) ||
      !ok(c.set_conv_math(d.conv, tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH)))
    return false;
  if (bias) {
    if (!ok(c.create_tensor(&d.b)) || !set_dense(c, d.b, t, {1, ys[1], 1, 1})) return false;
  }
  return true;
}

// An algorithm chosen for one convolution (per direction, device, dtype and geometry), cached.
struct Choice {
  bool usable = false;
  int algo = 0;
  size_t workspace = 0;
  // The math type cuDNN ranked the algorithm with (its workspace is for that one): set on the
  // convolution descriptor before the run.
  cudnnMathType_t math = CUDNN_FMA_MATH;
};

std::mutex g_mu;
std::map<std::string, Choice> g_choices;

std::string key_of(char direction, const Tensor& x, const Shape& ws, const Shape& ys,
                   const Conv2dAttrs& a, bool tf32) {
  return detail::concat(direction, tf32 ? "tf32" : "", x.device().index, dtype_name(x.dtype()),
                        shape_str(x.shape()), shape_str(ws), shape_str(ys), a.stride[0], ',',
                        a.stride[1], ',', a.padding[0], ',', a.padding[1], ',', a.dilation[0], ',',
                        a.dilation[1], ',', a.groups);
}

// The first of cuDNN's ranked algorithms that HAP accepts (ops/cuda/conv_cudnn.h): succeeded,
// deterministic, without tensor-op math (unless `tf32`), summing in order, with a bounded
// workspace. In the TF32 route it runs in the math type it was ranked with; otherwise in FMA
// math, as the descriptor says (the default math type would let f32 use TF32 from the A100 on).
template <typename Perf>
Choice pick(const Perf* perf, int n, std::initializer_list<int> in_order, bool tf32) {
  for (int i = 0; i < n; ++i) {
    const Perf& p = perf[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.determinism != CUDNN_DETERMINISTIC) continue;
    // (Never with conversion allowed: f32 operands rounded to fp16, whose range bf16 activations
    // exceed.)
    if (p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
    if (!tf32 && p.mathType == CUDNN_TENSOR_OP_MATH) continue;
    if (p.memory > kMaxWorkspace) continue;
    for (int allowed : in_order)
      if (static_cast<int>(p.algo) == allowed)
        return {true, allowed, p.memory, tf32 ? p.mathType : CUDNN_FMA_MATH};
  }
  return {};
}

// The cached choice for `key`, made by `choose` on first use.
template <typename Fn>
Choice choice_for(const std::string& key, Fn choose) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_choices.find(key);
    if (it != g_choices.end()) return it->second;
  }
  const Choice c = choose();
  std::lock_guard<std::mutex> lock(g_mu);
  g_choices[key] = c;
  return c;
}

void forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_choices[key] = Choice{};
}

bool data_type(DType d, cudnnDataType_t* t) {
  if (d == DType::F32) {
    *t = CUDNN_DATA_FLOAT;
  } else if (d == DType::F64) {
    *t = CUDNN_DATA_DOUBLE;
  } else {
    return false;
  }
  return true;
}

Tensor workspace(size_t bytes, const Tensor& like) {
  if (bytes == 0) return Tensor();
  return Tensor::empty({static_cast<int64_t>(bytes)},
                       TensorOptions{}.with_dtype(DType::U8).with_device(like.device()));
}

void* data_of(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

// Scaling factors: double for f64 data, float otherwise (cuDNN's rule).
struct Scale {
  Scale(DType dtype, double v) : f(static_cast<float>(v)), d(v), is_double(dtype == DType::F64) {}
  const void* ptr() const { return is_double ? static_cast<const void*>(&d) : &f; }
  float f;
  double d;
  bool is_double;
};

// A run that cuDNN refuses after all (its heuristics offered the algorithm): false, and the
// geometry is left to the own kernels from then on; any other failure is an error.
bool ran(cudnnStatus_t s, const std::string& key, const char* call) {
  if (s == CUDNN_STATUS_SUCCESS) {
    hap::cuda::count_cudnn_convolution();
    return true;
  }
  // (cuDNN 9's codes are categories with details below them: NOT_SUPPORTED_SHAPE,
  // BAD_PARAM_MISALIGNED_POINTER, ... are refusals too.)
  const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(s));
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM) {
    forget(key);
    return false;
  }
  HAP_CHECK(false, "cuDNN: ", call, " failed: ", hap::cuda::cudnn()->error_string(s));
  return false;
}

// The device's cuDNN handle; null, with cuDNN turned off for the process and a warning, where
// the library loads but makes no handle (a cuDNN built for another CUDA, a GPU it does not
// support): the convolutions then take the own kernels rather than fail.
cudnnHandle_t handle_or_off(int index) {
  try {
    return hap::cuda::cudnn_handle(index);
  } catch (const Error& e) {
    hap::cuda::set_cudnn_enabled(false);
    std::fprintf(stderr, "hap: warning: %s; convolutions take HAP's own kernels\n", e.what());
    return nullptr;
  }
}

}  // namespace

bool cudnn_conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                  const Conv2dAttrs& a) {
  cudnnDataType_t t;
  if (!hap::cuda::cudnn_enabled() || !data_type(y.dtype(), &t)) return false;
  const Cudnn& c = *hap::cuda::cudnn();
  Descriptors d(c);
  const bool tf32 = t == CUDNN_DATA_FLOAT && in_bf16_route();
  if (!describe(d, t, x.shape(), w.shape(), y.shape(), a, b.defined(), tf32)) return false;
  const int index = y.device().index;
  hap::cuda::set_device(index);
  cudnnHandle_t h = handle_or_off(index);
  if (h == nullptr) return false;
  const std::string key = key_of('f', x, w.shape(), y.shape(), a, tf32);
  const Choice ch = choice_for(key, [&] {
    cudnnConvolutionFwdAlgoPerf_t perf[kAlgorithms];
    int n = 0;
    if (!ok(c.forward_algorithms(h, d.x, d.w, d.conv, d.y, kAlgorithms, &n, perf))) return Choice{};
    return pick(
        perf, n,
        {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
         CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT},
        tf32);
  });
  if (!ch.usable) return false;
  HAP_CUDNN_CHECK(c.set_conv_math(d.conv, ch.math));
  const Tensor ws = workspace(ch.workspace, y);
  const Scale one(y.dtype(), 1), zero(y.dtype(), 0);
  if (!ran(c.forward(h, one.ptr(), d.x, x.raw_data(), d.w, w.raw_data(), d.conv,
                     static_cast<cudnnConvolutionFwdAlgo_t>(ch.algo), data_of(ws), ch.workspace,
                     zero.ptr(), d.y, y.raw_data()),
           key, "cudnnConvolutionForward"))
    return false;
  if (b.defined())
    HAP_CUDNN_CHECK(c.add_tensor(h, one.ptr(), d.b, b.raw_data(), one.ptr(), d.y, y.raw_data()));
  return true;
}

bool cudnn_conv2d_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& dx,
                           const Tensor& dw, const Conv2dAttrs& a) {
  cudnnDataType_t t;
  if (!hap::cuda::cudnn_enabled() || !data_type(dx.dtype(), &t)) return false;
  const Cudnn& c = *hap::cuda::cudnn();
  Descriptors d(c);
  const bool tf32 = t == CUDNN_DATA_FLOAT && in_bf16_route();
  if (!describe(d, t, x.shape(), w.shape(), gy.shape(), a, false, tf32)) return false;
  const int index = dx.device().index;
  hap::cuda::set_device(index);
  cudnnHandle_t h = handle_or_off(index);
  if (h == nullptr) return false;
  const std::string data_key = key_of('d', x, w.shape(), gy.shape(), a, tf32),
                    filter_key = key_of('w', x, w.shape(), gy.shape(), a, tf32);
  const Choice data = choice_for(data_key, [&] {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kAlgorithms];
    int n = 0;
    if (!ok(c.backward_data_algorithms(h, d.w, d.y, d.conv, d.x, kAlgorithms, &n, perf)))
      return Choice{};
    return pick(perf, n, {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_0},
                tf32);
  });
  const Choice filter = choice_for(filter_key, [&] {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kAlgorithms];
    int n = 0;
    if (!ok(c.backward_filter_algorithms(h, d.x, d.y, d.conv, d.w, kAlgorithms, &n, perf)))
      return Choice{};
    return pick(perf, n,
                {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0,
                 CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3},
                tf32);
  });
  if (!data.usable || !filter.usable) return false;
  const Tensor ws =
      workspace(data.workspace > filter.workspace ? data.workspace : filter.workspace, dx);
  const Scale one(dx.dtype(), 1), zero(dx.dtype(), 0);
  HAP_CUDNN_CHECK(c.set_conv_math(d.conv, data.math));
  if (!ran(c.backward_data(h, one.ptr(), d.w, w.raw_data(), d.y, gy.raw_data(), d.conv,
                           static_cast<cudnnConvolutionBwdDataAlgo_t>(data.algo), data_of(ws),
                           data.workspace, zero.ptr(), d.x, dx.raw_data()),
           data_key, "cudnnConvolutionBackwardData"))
    return false;
  HAP_CUDNN_CHECK(c.set_conv_math(d.conv, filter.math));
  if (!ran(c.backward_filter(h, one.ptr(), d.x, x.raw_data(), d.y, gy.raw_data(), d.conv,
                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(filter.algo), data_of(ws),
                             filter.workspace, zero.ptr(), d.w, dw.raw_data()),
           filter_key, "cudnnConvolutionBackwardFilter"))
    return false;  // the caller recomputes dx too: everything or nothing from cuDNN
  return true;
}

}  // namespace hap::ops::cuda
