// The differentiable tensor functions users write models with. Each one records an op call;
// gradients flow through every floating-point input.
#pragma once
#include <array>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/attrs.h"

namespace hap {

using ops::GeluApprox;
using ops::Reduction;
// cross_entropy's options: {ignore_index, label_smoothing, reduction}.
using CrossEntropyOptions = ops::CrossEntropyAttrs;

// ---- linear algebra ----
// Matrix product with NumPy semantics: 1-D operands are promoted, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x W^T + b, with x: [..., in], weight: [out, in], bias: [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- elementwise (broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor gelu(const Tensor& a, GeluApprox approx = GeluApprox::Tanh);
Tensor relu(const Tensor& a);
Tensor sigmoid(const Tensor& a);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(const Tensor& a, double s);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(const Tensor& a, double s);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(const Tensor& a, double s);
Tensor operator-(const Tensor& a);

// ---- normalisation and activations over a dim ----
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
// Over the last dim; weight and bias ([C]) may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// Batch normalisation with the batch's statistics: each channel (dim 1) of x [N, C, ...] is
// normalised by the mean and (biased) variance over every other dim, then scaled by weight [C] and
// shifted by bias [C] (either may be undefined). Composed of reductions and elementwise ops, so
// that under any sharding of x the statistics are those of the whole logical batch (a batch split
// reduces them across ranks) and the result equals one device's.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// Batch norm with running statistics (PyTorch's track_running_stats): in training it normalises
// by the batch's statistics and updates running_mean/running_var ([C], in place) by
//   running = (1 - momentum) * running + momentum * batch statistic
// (the variance unbiased, as PyTorch); in evaluation it normalises by the running statistics.
// Training needs more than one value per channel. A traced training forward records the updates
// (synth::Graph::state_updates) and, through train_eval_select, the evaluation path.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum, double eps);
// `train` (training) or `eval` (evaluation) of one shape: see ops TrainEvalSelect. Eagerly, only
// training is meaningful (a layer in eval() uses its evaluation path directly).
Tensor train_eval_select(const Tensor& train, const Tensor& eval);
// state <- keep * state + take * value (value: any shape with state's number of elements), in
// place and outside autograd; recorded instead while tracing, for the executor to apply on ranks.
void update_running_average(const Tensor& state, const Tensor& value, double keep, double take);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// ---- reductions (empty dims = all) ----
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// Values and indices (i64) of the k largest (or smallest) along dim, sorted.
std::pair<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true);

// ---- shape ----
// One dim may be -1 (inferred). Returns a view when the layout allows, else a copy.
Tensor reshape(const Tensor& x, Shape shape);
Tensor view(const Tensor& x, Shape shape);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, std::vector<int64_t> perm);
// Elements [start, end) of dim (negative indices count from the end).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& x, Shape shape);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, std::vector<int64_t> sizes, int64_t dim);
// Splits dim into `chunks` equal parts (dim size must divide).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
Tensor contiguous(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);

// ---- masking, embedding, dropout ----
// Where mask (u8, broadcast to x) is non-zero, the result is `value`.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// u8 [T, T]: 1 above the diagonal (future positions), 0 elsewhere.
Tensor causal_mask(int64_t T);
// weight: [V, C], ids: i64 [...] -> [..., C]. Backward is a scatter-add into weight's gradient.
Tensor embedding(const Tensor& weight, const Tensor& ids);
// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when !training
// or p == 0. The mask for element i depends only on (seed, stream, logical index of i).
Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed, uint64_t stream,
               const LogicalSlice& slice = {});

// BERT's masked-LM corruption (ops::MaskTokensAttrs): ids i64 [...] -> (corrupted ids, targets:
// the original id where a position was chosen, ignore_index elsewhere). Not differentiable.
std::pair<Tensor, Tensor> mask_tokens(const Tensor& ids, double p, int64_t mask_id, int64_t vocab,
                                      uint64_t seed, uint64_t stream, int64_t ignore_index = -100);

// ---- mixture of experts (ops/defs/moe.cc: GShard routing per group) ----
// tokens [G, T, C], expert ids i64 [G, T, k], optional weights [G, T, k] -> [G, E, capacity, C].
Tensor moe_dispatch(const Tensor& tokens, const Tensor& expert_ids, const Tensor& weights,
                    int64_t experts, int64_t capacity);
// expert outputs [G, E, capacity, C], expert ids, optional gates -> [G, T, C].
Tensor moe_combine(const Tensor& buffers, const Tensor& expert_ids, const Tensor& gates,
                   int64_t experts, int64_t capacity);

// ---- losses and attention ----
// logits: [N, V], targets: i64 [N]; mean over targets != ignore_index. When no target counts
// (all ignored, or N = 0) the mean is 0 with zero gradients; PyTorch gives nan there.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// With label smoothing e in [0, 1] (a row's loss is (1 - e) (-log p_target) + e mean_j
// (-log p_j), as PyTorch's) and a reduction: Mean (as above), Sum over rows, or None (one loss
// per row, [N], 0 at ignored rows).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options);
// ---- images [N, C, H, W] ----
// weight [O, C / groups, KH, KW], bias [O] or undefined -> [N, O, OH, OW].
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::array<int64_t, 2> stride = {1, 1}, std::array<int64_t, 2> padding = {0, 0},
              std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);
// Windows of `kernel` every `stride` (defaults to the kernel), `padding` on each side.
Tensor max_pool2d(const Tensor& x, std::array<int64_t, 2> kernel,
                  std::array<int64_t, 2> stride = {0, 0}, std::array<int64_t, 2> padding = {0, 0});
// Padding counts in the divisor (PyTorch's count_include_pad).
Tensor avg_pool2d(const Tensor& x, std::array<int64_t, 2> kernel,
                  std::array<int64_t, 2> stride = {0, 0}, std::array<int64_t, 2> padding = {0, 0});
// Average pooling to `size` [OH, OW]; each must divide the input's (then every window has the
// same size; an error otherwise).
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> size);

// log sum_j exp(x[..., j]) over the last dim (stable; -inf for an empty row).
Tensor logsumexp(const Tensor& x);
// x: [N, V] holding the columns [offset, offset + V) of a vocabulary; targets: i64 [N]. Row i's
// target logit x[i, targets[i] - offset] where this tensor holds that column and the target is
// not ignore_index, else 0 (the pieces of a vocabulary-parallel cross-entropy).
Tensor target_logit(const Tensor& x, const Tensor& targets, int64_t offset = 0,
                    int64_t ignore_index = -100);
// How many targets differ from ignore_index (an i64 scalar; not differentiable).
Tensor count_targets(const Tensor& targets, int64_t ignore_index = -100);

// The sum of x's squared elements, accumulated in double (no autograd): gradient norms. The same
// bits for the same thread count.
double sum_of_squares(const Tensor& x);
// Over every element of every tensor (0 for none): the global norm is its square root.
double sum_of_squares(const std::vector<Tensor>& xs);
// q, k, v: [B, H, T, D] -> [B, H, T, D]. scale 0 means 1/sqrt(D). key_mask: u8 [B, T] or
// undefined; a query attends only to keys whose mask is 1 (and, causal, not after it). A query
// left with no key to attend to gets zeros (PyTorch gives NaN there) and no gradient.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    bool causal = true, double dropout_p = 0.0, uint64_t seed = 0,
                                    uint64_t stream = 0, double scale = 0.0,
                                    const Tensor& key_mask = Tensor());

}  // namespace hap
