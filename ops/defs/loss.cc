// Losses: cross_entropy over class logits, and the fused kernel its backward rule uses. Neither
// materialises log_softmax: the forward needs one log-sum-exp per row, the backward writes
// softmax - onehot straight into the gradient.
#include <cmath>
#include <limits>

#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

using cpu::exp_fast;

// Checks logits [N, V] (input `at`) and targets i64 [N] (input `at + 1`).
void check_cross_entropy_inputs(const Metas& in, size_t at, const char* op) {
  const TensorMeta &x = in[at], &t = in[at + 1];
  check_floating(op, in, at);
  HAP_CHECK(x.shape.size() == 2 && x.shape[1] > 0, op, ": logits must be [N, V] with V > 0, got ",
            shape_str(x.shape));
  HAP_CHECK(t.dtype == DType::I64, op, ": targets must be i64, got ", dtype_name(t.dtype));
  HAP_CHECK(t.shape == Shape{x.shape[0]}, op, ": targets ", shape_str(t.shape),
            " do not match logits ", shape_str(x.shape), " (expected [", x.shape[0], "])");
}

// How many targets count (!= ignore_index); each of them must be a class index in [0, V).
int64_t counted_targets(const Tensor& targets, int64_t v, int64_t ignore_index) {
  const int64_t* p = targets.data<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) {
    if (p[i] == ignore_index) continue;
    HAP_CHECK(p[i] >= 0 && p[i] < v, "cross_entropy: target ", p[i], " at position ", i,
              " is out of range for ", v, " classes (expected 0 <= target < ", v,
              ", or ignore_index ", ignore_index, ")");
    ++count;
  }
  return count;
}

template <typename T>
inline T row_max(const T* x, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
  return mx;
}

// loss = mean over counted rows of logsumexp(x_i) - x_i[target_i]; 0 when no target counts.
template <typename T>
void cross_entropy_kernel(const KernelContext& c, const Tensor& out) {
  Tensor x = c.inputs[0].contiguous(), targets = c.inputs[1].contiguous();
  int64_t ignore = attr<CrossEntropyAttrs>(c.attrs).ignore_index;
  int64_t n = x.shape()[0], v = x.shape()[1];
  int64_t count = counted_targets(targets, v, ignore);
  const T* px = x.data<T>();
  const int64_t* pt = targets.data<int64_t>();
  // Rows are independent and summed in order afterwards: any schedule gives the same bits.
  std::vector<double> row_loss(static_cast<size_t>(n), 0.0);
#pragma omp parallel for schedule(dynamic) if (n * v > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    if (pt[i] == ignore) continue;
    const T* xr = px + i * v;
    T mx = row_max(xr, v);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) sum += exp_fast(xr[j] - mx);
    row_loss[i] = static_cast<double>(mx) + std::log(static_cast<double>(sum)) -
                  static_cast<double>(xr[pt[i]]);
  }
  double total = 0;
  for (double l : row_loss) total += l;
  out.data<T>()[0] = static_cast<T>(count == 0 ? 0.0 : total / static_cast<double>(count));
}

// Inputs (grad of the loss [], logits [N, V], targets [N]) -> d logits [N, V]:
// (softmax(x_i) - onehot(target_i)) * grad / count for counted rows, 0 for ignored rows.
template <typename T>
void cross_entropy_backward_kernel(const KernelContext& c, const Tensor& out) {
  Tensor x = c.inputs[1].contiguous(), targets = c.inputs[2].contiguous();
  int64_t ignore = attr<CrossEntropyAttrs>(c.attrs).ignore_index;
  int64_t n = x.shape()[0], v = x.shape()[1];
  int64_t count = counted_targets(targets, v, ignore);
  T scale = count == 0 ? T(0) : static_cast<T>(c.inputs[0].item() / static_cast<double>(count));
  const T* px = x.data<T>();
  const int64_t* pt = targets.data<int64_t>();
  T* py = out.data<T>();
#pragma omp parallel for schedule(dynamic) if (n * v > cpu::kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T* yr = py + i * v;
    if (pt[i] == ignore) {
      std::fill(yr, yr + v, T(0));
      continue;
    }
    const T* xr = px + i * v;
    T mx = row_max(xr, v);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) {
      T e = exp_fast(xr[j] - mx);
      yr[j] = e;
      sum += e;
    }
    T f = scale / sum;
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) yr[j] *= f;
    yr[pt[i]] -= scale;
  }
}

}  // namespace

void register_loss_ops(OpTable& t) {
  OpDef& ce = def_of(t, OpKind::CrossEntropy);
  ce.name = "cross_entropy";
  ce.num_inputs = 2;
  ce.infer = [](const Metas& in, const Attrs&) {
    check_cross_entropy_inputs(in, 0, "cross_entropy");
    return Metas{{Shape{}, in[0].dtype}};
  };
  ce.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return 4.0 * static_cast<double>(shape_numel(in[0].shape));
  };
  // Rows split alike in logits and targets: each rank's loss is a mean over its own counted
  // targets, so the executor must scale rank r's loss (and so its gradient) by
  // local_count_r / global_count for the Partial sum to be the global mean.
  // Vocabulary-parallel: logits split over the vocabulary, targets whole. Each rank's logsumexp
  // covers only its slice; the executor combines them over ranks (an all-gather of one number
  // per row and rank) and picks each target's logit on the rank that holds it (parallel/executor).
  ce.shard = [](const Metas&, const Metas&, const Attrs&) {
    return std::vector<ShardSignature>{{{Prop::sharded(0), Prop::sharded(0)}, {Prop::partial()}},
                                       {{Prop::sharded(1), Prop::replicated()}, {Prop::partial()}}};
  };
  ce.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "cross_entropy",
                   [&](auto tag) { cross_entropy_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };
  ce.backward = [](const BackwardContext& c) {
    Tensor g =
        call1(OpKind::CrossEntropyBackward, {c.grad_outputs[0], c.inputs[0], c.inputs[1]}, c.attrs);
    return std::vector<Tensor>{g, Tensor()};
  };

  OpDef& cb = def_of(t, OpKind::CrossEntropyBackward);
  cb.name = "cross_entropy_backward";
  cb.num_inputs = 3;
  cb.infer = [](const Metas& in, const Attrs&) {
    check_cross_entropy_inputs(in, 1, "cross_entropy_backward");
    check_same_dtype("cross_entropy_backward", in, 0, 1);
    HAP_CHECK(shape_numel(in[0].shape) == 1, "cross_entropy_backward: gradient of the loss must ",
              "have one element, got ", shape_str(in[0].shape));
    return Metas{in[1]};
  };
  cb.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return 5.0 * static_cast<double>(shape_numel(in[1].shape));
  };
  // As in the forward, the count is local: the executor scales the loss gradient per rank.
  cb.shard = [](const Metas&, const Metas&, const Attrs&) {
    return std::vector<ShardSignature>{
        {{Prop::replicated(), Prop::sharded(0), Prop::sharded(0)}, {Prop::sharded(0)}}};
  };
  cb.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "cross_entropy_backward",
                   [&](auto tag) { cross_entropy_backward_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };
}

}  // namespace hap::ops
