#include "ops/functional.h"

#include "ops/dispatch.h"

namespace hap {

using ops::call1;
using ops::OpKind;

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.dim() >= 2 && b.dim() >= 2) return call1(OpKind::MatMul, {a, b});
  // The op takes operands of >= 2 dims; 1-D ones are promoted here as in NumPy: a row [1, K] on
  // the left, a column [K, 1] on the right, and the added dim is dropped from the result.
  HAP_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: operands must have at least 1 dim, got ",
            shape_str(a.shape()), " and ", shape_str(b.shape()));
  Tensor y = call1(OpKind::MatMul,
                   {a.dim() == 1 ? unsqueeze(a, 0) : a, b.dim() == 1 ? unsqueeze(b, 1) : b});
  Shape s(y.shape().begin(), y.shape().end() - 2);
  if (a.dim() > 1) s.push_back(y.shape()[y.dim() - 2]);
  if (b.dim() > 1) s.push_back(y.shape().back());
  return reshape(y, s);
}
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  return call1(OpKind::Linear, {x, w, b});
}

Tensor add(const Tensor& a, const Tensor& b) { return call1(OpKind::Add, {a, b}); }
Tensor sub(const Tensor& a, const Tensor& b) { return call1(OpKind::Sub, {a, b}); }
Tensor mul(const Tensor& a, const Tensor& b) { return call1(OpKind::Mul, {a, b}); }
Tensor div(const Tensor& a, const Tensor& b) { return call1(OpKind::Div, {a, b}); }
Tensor add(const Tensor& a, double s) { return call1(OpKind::AddScalar, {a}, ops::ScalarAttrs{s}); }
Tensor mul(const Tensor& a, double s) { return call1(OpKind::MulScalar, {a}, ops::ScalarAttrs{s}); }
Tensor pow(const Tensor& a, double e) { return call1(OpKind::PowScalar, {a}, ops::ScalarAttrs{e}); }
Tensor neg(const Tensor& a) { return call1(OpKind::Neg, {a}); }
Tensor exp(const Tensor& a) { return call1(OpKind::Exp, {a}); }
Tensor log(const Tensor& a) { return call1(OpKind::Log, {a}); }
Tensor sqrt(const Tensor& a) { return call1(OpKind::Sqrt, {a}); }
Tensor rsqrt(const Tensor& a) { return call1(OpKind::Rsqrt, {a}); }
Tensor tanh(const Tensor& a) { return call1(OpKind::Tanh, {a}); }
Tensor gelu(const Tensor& a, GeluApprox approx) {
  return call1(OpKind::Gelu, {a}, ops::GeluAttrs{approx});
}
Tensor relu(const Tensor& a) { return call1(OpKind::Relu, {a}); }
Tensor sigmoid(const Tensor& a) { return call1(OpKind::Sigmoid, {a}); }

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double s) { return add(a, s); }
Tensor operator+(double s, const Tensor& a) { return add(a, s); }
Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
Tensor operator-(double s, const Tensor& a) { return add(neg(a), s); }
Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
Tensor operator/(const Tensor& a, double s) {
  HAP_CHECK(s != 0.0, "division of tensor ", a.str(), " by the scalar 0");
  return mul(a, 1.0 / s);
}
Tensor operator-(const Tensor& a) { return neg(a); }

Tensor softmax(const Tensor& x, int64_t dim) {
  return call1(OpKind::Softmax, {x}, ops::DimAttrs{dim, false});
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return call1(OpKind::LogSoftmax, {x}, ops::DimAttrs{dim, false});
}
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  return call1(OpKind::LayerNorm, {x, w, b}, ops::NormAttrs{eps});
}
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) {
  return call1(OpKind::RmsNorm, {x, w}, ops::NormAttrs{eps});
}

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return call1(OpKind::Sum, {x}, ops::ReduceAttrs{std::move(dims), keepdim});
}
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return call1(OpKind::Mean, {x}, ops::ReduceAttrs{std::move(dims), keepdim});
}
Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  return call1(OpKind::Max, {x}, ops::DimAttrs{dim, keepdim});
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return call1(OpKind::Argmax, {x}, ops::DimAttrs{dim, keepdim});
}
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest) {
  std::vector<Tensor> outs = ops::call(OpKind::TopK, {x}, ops::TopKAttrs{k, dim, largest});
  return {outs[0], outs[1]};
}

Tensor reshape(const Tensor& x, Shape shape) {
  return call1(OpKind::Reshape, {x}, ops::ShapeAttrs{std::move(shape)});
}
Tensor view(const Tensor& x, Shape shape) { return reshape(x, std::move(shape)); }
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  int64_t n = x.dim();
  HAP_CHECK(n > 0, "transpose: input must have at least 1 dim, got a scalar");
  d0 = wrap_dim(d0, n, "transpose dim0");
  d1 = wrap_dim(d1, n, "transpose dim1");
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  std::swap(perm[d0], perm[d1]);
  return permute(x, std::move(perm));
}
Tensor permute(const Tensor& x, std::vector<int64_t> perm) {
  return call1(OpKind::Permute, {x}, ops::PermuteAttrs{std::move(perm)});
}
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end) {
  return call1(OpKind::Slice, {x}, ops::SliceAttrs{dim, start, end});
}
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  HAP_CHECK(length >= 0, "narrow: length must be >= 0, got ", length);
  return slice(x, dim, start, start + length);
}
Tensor expand(const Tensor& x, Shape shape) {
  return call1(OpKind::Expand, {x}, ops::ShapeAttrs{std::move(shape)});
}
Tensor unsqueeze(const Tensor& x, int64_t dim) {
  dim = wrap_dim(dim, x.dim() + 1, "unsqueeze dim");
  Shape s = x.shape();
  s.insert(s.begin() + dim, 1);
  return reshape(x, s);
}
Tensor squeeze(const Tensor& x, int64_t dim) {
  HAP_CHECK(x.dim() > 0, "squeeze: input must have at least 1 dim, got a scalar");
  dim = wrap_dim(dim, x.dim(), "squeeze dim");
  HAP_CHECK(x.shape()[dim] == 1, "squeeze: dim ", dim, " of ", shape_str(x.shape()), " has size ",
            x.shape()[dim], ", expected 1");
  Shape s = x.shape();
  s.erase(s.begin() + dim);
  return reshape(x, s);
}
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  start_dim = wrap_dim(start_dim, x.dim(), "flatten start_dim");
  end_dim = wrap_dim(end_dim, x.dim(), "flatten end_dim");
  HAP_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " > end_dim ", end_dim);
  Shape s(x.shape().begin(), x.shape().begin() + start_dim);
  int64_t m = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) m *= x.shape()[d];
  s.push_back(m);
  s.insert(s.end(), x.shape().begin() + end_dim + 1, x.shape().end());
  return reshape(x, s);
}
Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  return call1(OpKind::Concat, xs, ops::DimAttrs{dim, false});
}
std::vector<Tensor> split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim) {
  return ops::call(OpKind::Split, {x}, ops::SplitAttrs{dim, std::move(sizes)});
}
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  HAP_CHECK(chunks >= 1, "chunk: chunks must be >= 1, got ", chunks);
  HAP_CHECK(x.dim() > 0, "chunk: input must have at least 1 dim, got a scalar");
  int64_t d = wrap_dim(dim, x.dim(), "chunk dim");
  HAP_CHECK(x.shape()[d] % chunks == 0, "chunk: dim ", d, " of ", shape_str(x.shape()),
            " is not divisible into ", chunks, " chunks");
  return split(x, std::vector<int64_t>(chunks, x.shape()[d] / chunks), d);
}
Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return call1(OpKind::Contiguous, {x});
}
Tensor cast(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return call1(OpKind::Cast, {x}, ops::CastAttrs{dtype});
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  return call1(OpKind::MaskedFill, {x, mask}, ops::ScalarAttrs{value});
}
Tensor causal_mask(int64_t T) {
  HAP_CHECK(T >= 0, "causal_mask: size must be >= 0, got ", T);
  Tensor m = Tensor::zeros({T, T}, TensorOptions{}.with_dtype(DType::U8));
  uint8_t* p = m.data<uint8_t>();
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) p[i * T + j] = 1;
  return m;
}
namespace {

// What both batch norms check and share: the per-channel shape [1, C, 1, ...] and the reduced
// dims (all but 1).
struct BatchNormDims {
  Shape channel;
  std::vector<int64_t> dims;
  int64_t per_channel = 0;  // values per channel
};

BatchNormDims batch_norm_dims(const Tensor& x, const Tensor& weight, const Tensor& bias,
                              double eps) {
  HAP_CHECK(x.defined() && x.dim() >= 2, "batch_norm: x must be [N, C, ...], got ",
            x.defined() ? x.str() : "undefined");
  HAP_CHECK(eps > 0, "batch_norm: eps must be > 0, got ", eps);
  const int64_t C = x.size(1);
  BatchNormDims d;
  d.channel.assign(static_cast<size_t>(x.dim()), 1);
  d.channel[1] = C;
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != 1) d.dims.push_back(i);
  d.per_channel = C > 0 ? x.numel() / C : 0;
  for (const Tensor* p : {&weight, &bias})
    HAP_CHECK(!p->defined() || p->shape() == Shape{C}, "batch_norm: weight and bias must be [", C,
              "] for x ", shape_str(x.shape()), ", got ", shape_str(p->shape()));
  return d;
}

Tensor batch_norm_affine(Tensor y, const Tensor& weight, const Tensor& bias, const Shape& channel) {
  if (weight.defined()) y = y * reshape(weight, channel);
  if (bias.defined()) y = y + reshape(bias, channel);
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const BatchNormDims d = batch_norm_dims(x, weight, bias, eps);
  Tensor centered = x - mean(x, d.dims, /*keepdim=*/true);
  Tensor var = mean(centered * centered, d.dims, /*keepdim=*/true);
  return batch_norm_affine(centered * rsqrt(var + eps), weight, bias, d.channel);
}

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps) {
  const BatchNormDims d = batch_norm_dims(x, weight, bias, eps);
  const int64_t C = x.size(1);
  for (const Tensor* r : {&running_mean, &running_var})
    HAP_CHECK(r->defined() && r->shape() == Shape{C} && r->dtype() == x.dtype(),
              "batch_norm: running_mean and running_var must be [", C, "] ", dtype_name(x.dtype()),
              " for x ", x.str(), ", got ", r->defined() ? r->str() : "undefined");
  HAP_CHECK(momentum >= 0 && momentum <= 1, "batch_norm: momentum must be in [0, 1], got ",
            momentum);
  const Tensor rm = reshape(running_mean, d.channel), rv = reshape(running_var, d.channel);
  if (!training) return batch_norm_affine((x - rm) * rsqrt(rv + eps), weight, bias, d.channel);
  HAP_CHECK(d.per_channel > 1,
            "batch_norm: training needs more than one value per channel, got input ",
            shape_str(x.shape()));
  // The batch's statistics in training, the running ones in evaluation: one traced graph runs
  // both on ranks (train_eval_select), with the same arithmetic as the eager paths.
  Tensor batch_mean = mean(x, d.dims, /*keepdim=*/true);
  Tensor centered = x - train_eval_select(batch_mean, rm);
  Tensor batch_var = mean(centered * centered, d.dims, /*keepdim=*/true);
  Tensor y = centered * rsqrt(train_eval_select(batch_var, rv) + eps);
  const double n = static_cast<double>(d.per_channel);
  update_running_average(running_mean, batch_mean, 1 - momentum, momentum);
  update_running_average(running_var, batch_var, 1 - momentum, momentum * n / (n - 1));
  return batch_norm_affine(y, weight, bias, d.channel);
}

Tensor train_eval_select(const Tensor& train, const Tensor& eval) {
  return call1(OpKind::TrainEvalSelect, {train, eval});
}

void update_running_average(const Tensor& state, const Tensor& value, double keep, double take) {
  HAP_CHECK(state.defined() && value.defined() && state.numel() == value.numel() &&
                state.dtype() == value.dtype() && is_floating(state.dtype()),
            "update_running_average: the value must have the state's dtype and number of "
            "elements, got state ",
            state.defined() ? state.str() : "undefined", " and value ",
            value.defined() ? value.str() : "undefined");
  if (ops::TraceHook* hook = ops::trace_hook()) {
    hook->on_state_update(state, value, keep, take);
    return;
  }
  HAP_CHECK(!state.requires_grad(), "update_running_average: the state ", state.str(),
            " requires grad (a parameter, not a buffer)");
  const Tensor next = state.detach() * keep + reshape(value.detach(), state.shape()) * take;
  state.copy_from(next);
}

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  return call1(OpKind::Embedding, {weight, ids});
}
Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed, uint64_t stream,
               const LogicalSlice& slice) {
  HAP_CHECK(p >= 0.0 && p < 1.0, "dropout: probability must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  return call1(OpKind::Dropout, {x}, ops::RandomAttrs{p, seed, stream, slice});
}

std::pair<Tensor, Tensor> mask_tokens(const Tensor& ids, double p, int64_t mask_id, int64_t vocab,
                                      uint64_t seed, uint64_t stream, int64_t ignore_index) {
  ops::MaskTokensAttrs a{p, mask_id, vocab, ignore_index, false, seed, stream, {}};
  Tensor inputs = call1(OpKind::MaskTokens, {ids}, a);
  a.targets = true;
  return {inputs, call1(OpKind::MaskTokens, {ids}, a)};
}

Tensor moe_dispatch(const Tensor& tokens, const Tensor& expert_ids, const Tensor& weights,
                    int64_t experts, int64_t capacity) {
  return call1(OpKind::MoeDispatch, {tokens, expert_ids, weights},
               ops::MoeAttrs{experts, capacity});
}

Tensor moe_combine(const Tensor& buffers, const Tensor& expert_ids, const Tensor& gates,
                   int64_t experts, int64_t capacity) {
  return call1(OpKind::MoeCombine, {buffers, expert_ids, gates}, ops::MoeAttrs{experts, capacity});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  return call1(OpKind::CrossEntropy, {logits, targets}, ops::CrossEntropyAttrs{ignore_index});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) {
  return call1(OpKind::CrossEntropy, {logits, targets}, options);
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias,
              std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
              std::array<int64_t, 2> dilation, int64_t groups) {
  return ops::call1(ops::OpKind::Conv2d, {x, weight, bias},
                    ops::Conv2dAttrs{stride, padding, dilation, groups});
}

namespace {
std::array<int64_t, 2> stride_or_kernel(std::array<int64_t, 2> stride,
                                        std::array<int64_t, 2> kernel) {
  return stride[0] == 0 && stride[1] == 0 ? kernel : stride;
}
}  // namespace

Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  return ops::call1(ops::OpKind::MaxPool2d, {x},
                    ops::Pool2dAttrs{kernel, stride_or_kernel(stride, kernel), padding});
}

Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel, std::array<int64_t, 2> stride,
                  std::array<int64_t, 2> padding) {
  return ops::call1(ops::OpKind::AvgPool2d, {x},
                    ops::Pool2dAttrs{kernel, stride_or_kernel(stride, kernel), padding});
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> size) {
  HAP_CHECK(x.defined() && x.dim() == 4, "adaptive_avg_pool2d: input must be [N, C, H, W], got ",
            x.defined() ? x.str() : "undefined");
  const int64_t h = x.size(2), w = x.size(3);
  HAP_CHECK(size[0] >= 1 && size[1] >= 1 && h % size[0] == 0 && w % size[1] == 0,
            "adaptive_avg_pool2d: the output size [", size[0], ", ", size[1],
            "] must divide the input's [", h, ", ", w,
            "] (windows of unequal sizes are not supported)");
  const std::array<int64_t, 2> kernel = {h / size[0], w / size[1]};
  return avg_pool2d(x, kernel, kernel);
}

Tensor logsumexp(const Tensor& x) { return ops::call1(ops::OpKind::LogSumExp, {x}); }

Tensor target_logit(const Tensor& x, const Tensor& targets, int64_t offset, int64_t ignore_index) {
  return ops::call1(ops::OpKind::TargetLogit, {x, targets}, ops::TargetAttrs{offset, ignore_index});
}

Tensor count_targets(const Tensor& targets, int64_t ignore_index) {
  return ops::call1(ops::OpKind::CountTargets, {targets}, ops::CrossEntropyAttrs{ignore_index});
}
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    double dropout_p, uint64_t seed, uint64_t stream, double scale,
                                    const Tensor& key_mask) {
  HAP_CHECK(dropout_p >= 0.0 && dropout_p < 1.0,
            "scaled_dot_product_attention: dropout probability must be in [0, 1), got ", dropout_p);
  ops::AttentionAttrs a{causal, scale, ops::RandomAttrs{dropout_p, seed, stream, {}}};
  // Output 1 is the row log-sum-exp saved for backward.
  return ops::call(OpKind::Attention, {q, k, v, key_mask}, a)[0];
}

double sum_of_squares(const Tensor& x) { return sum_of_squares(std::vector<Tensor>{x}); }

double sum_of_squares(const std::vector<Tensor>& xs) {
  if (xs.empty()) return 0.0;
  return ops::call1(ops::OpKind::SumOfSquares, xs).item();
}

}  // namespace hap
