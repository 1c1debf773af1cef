// Losses: cross_entropy over class logits, and the fused kernel its backward rule uses. Neither
// materialises log_softmax: the forward needs one log-sum-exp per row, the backward writes
// softmax - onehot straight into the gradient.
#include <cmath>
#include <limits>

#include "ops/cpu/loops.h"
#include "ops/cpu/multiversion.h"
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

// Row i's loss: logsumexp(x_i) - (1 - e) x_i[target_i] - e mean_j x_i[j] (e the label
// smoothing), 0 for an ignored row. Reduced to the mean over counted rows (0 when none counts),
// their sum, or left per row.
template <typename T>
HAP_MULTIVERSION void cross_entropy_kernel_clones(const KernelContext& c, const Tensor& out) {
  Tensor x = c.inputs[0].contiguous(), targets = c.inputs[1].contiguous();
  const CrossEntropyAttrs& a = attr<CrossEntropyAttrs>(c.attrs);
  const int64_t ignore = a.ignore_index;
  const double e = a.label_smoothing;
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
    T mx = cpu::max_skipping_nan(xr, v);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) sum += exp_fast(xr[j] - mx);
    double smooth = 0;
    if (e != 0) {
      double row_sum = 0;
      for (int64_t j = 0; j < v; ++j) row_sum += static_cast<double>(xr[j]);
      smooth = e * row_sum / static_cast<double>(v);
    }
    row_loss[i] = static_cast<double>(mx) + std::log(static_cast<double>(sum)) -
                  (1.0 - e) * static_cast<double>(xr[pt[i]]) - smooth;
  }
  T* py = out.data<T>();
  if (a.reduction == Reduction::None) {
    for (int64_t i = 0; i < n; ++i) py[i] = static_cast<T>(row_loss[i]);
    return;
  }
  double total = 0;
  for (double l : row_loss) total += l;
  if (a.reduction == Reduction::Mean) total = count == 0 ? 0.0 : total / static_cast<double>(count);
  py[0] = static_cast<T>(total);
}

template <typename T>
void cross_entropy_kernel(const KernelContext& c, const Tensor& out) {
  ::hap::cpu::clone_call (&cross_entropy_kernel_clones<T>)(c, out);
}

// Inputs (grad of the loss: [] reduced, [N] per row; logits [N, V], targets [N]) -> d logits
// [N, V]: (softmax(x_i) - (1 - e) onehot(target_i) - e / V) g_i for counted rows, 0 for ignored
// rows; g_i the loss's gradient over the count (mean), as it is (sum), or row i's (none).
template <typename T>
HAP_MULTIVERSION void cross_entropy_backward_kernel_clones(const KernelContext& c,
                                                           const Tensor& out) {
  Tensor x = c.inputs[1].contiguous(), targets = c.inputs[2].contiguous();
  const CrossEntropyAttrs& a = attr<CrossEntropyAttrs>(c.attrs);
  const int64_t ignore = a.ignore_index;
  const T e = static_cast<T>(a.label_smoothing);
  int64_t n = x.shape()[0], v = x.shape()[1];
  int64_t count = counted_targets(targets, v, ignore);
  const Tensor g = c.inputs[0].contiguous();
  const T* pg = g.data<T>();
  const T reduced = a.reduction == Reduction::Sum    ? pg[0]
                    : a.reduction == Reduction::None ? T(0)
                    : count == 0
                        ? T(0)
                        : static_cast<T>(static_cast<double>(pg[0]) / static_cast<double>(count));
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
    T mx = cpu::max_skipping_nan(xr, v);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) {
      T e = exp_fast(xr[j] - mx);
      yr[j] = e;
      sum += e;
    }
    const T scale = a.reduction == Reduction::None ? pg[i] : reduced;
    T f = scale / sum, uniform = scale * e / static_cast<T>(v);
#pragma omp simd
    for (int64_t j = 0; j < v; ++j) yr[j] = yr[j] * f - uniform;
    yr[pt[i]] -= scale * (T(1) - e);
  }
}

template <typename T>
void cross_entropy_backward_kernel(const KernelContext& c, const Tensor& out) {
  ::hap::cpu::clone_call (&cross_entropy_backward_kernel_clones<T>)(c, out);
}

// Checks x [N, V] (input `at`, V may be 0: a shard with no columns) and targets i64 [N].
void check_target_inputs(const Metas& in, size_t at, const char* op) {
  const TensorMeta &x = in[at], &t = in[at + 1];
  check_floating(op, in, at);
  HAP_CHECK(x.shape.size() == 2, op, ": logits must be [N, V], got ", shape_str(x.shape));
  HAP_CHECK(t.dtype == DType::I64, op, ": targets must be i64, got ", dtype_name(t.dtype));
  HAP_CHECK(t.shape == Shape{x.shape[0]}, op, ": targets ", shape_str(t.shape),
            " do not match logits ", shape_str(x.shape), " (expected [", x.shape[0], "])");
}

// The column of row i's target in a tensor holding columns [offset, offset + v), or -1.
inline int64_t held_column(int64_t target, const TargetAttrs& a, int64_t v) {
  if (target == a.ignore_index) return -1;
  const int64_t j = target - a.offset;
  return j >= 0 && j < v ? j : -1;
}

// out[i] = x[i, target_i - offset] where that column is held and the target counts, else 0.
template <typename T>
void target_logit_kernel(const KernelContext& c, const Tensor& out) {
  Tensor x = c.inputs[0].contiguous(), targets = c.inputs[1].contiguous();
  const TargetAttrs& a = attr<TargetAttrs>(c.attrs);
  const int64_t n = x.shape()[0], v = x.shape()[1];
  const T* px = x.data<T>();
  const int64_t* pt = targets.data<int64_t>();
  T* py = out.data<T>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = held_column(pt[i], a, v);
    py[i] = j < 0 ? T(0) : px[i * v + j];
  }
}

// (g [N], x [N, V], targets) -> d x: g[i] at [i, target_i - offset] where held, 0 elsewhere.
template <typename T>
void target_logit_backward_kernel(const KernelContext& c, const Tensor& out) {
  Tensor g = c.inputs[0].contiguous(), targets = c.inputs[2].contiguous();
  const TargetAttrs& a = attr<TargetAttrs>(c.attrs);
  const int64_t n = out.shape()[0], v = out.shape()[1];
  out.zero_();
  const T* pg = g.data<T>();
  const int64_t* pt = targets.data<int64_t>();
  T* py = out.data<T>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = held_column(pt[i], a, v);
    if (j >= 0) py[i * v + j] = pg[i];
  }
}

// Cross-entropy on one rank's shards.
//  - Rows split (logits and targets Sharded(0), loss Partial): each rank's mean over its own
//    counted targets, scaled by local count / global count, sums to the global mean.
//  - Vocabulary split (logits Sharded(1), targets whole, loss Partial): row i's loss is
//    lse_i - x_i[t_i] with lse_i = log sum_r exp(lse_r,i) over the ranks' column shards. Each
//    rank's log-sum-exp travels in one all-gather; the rank holding a row's target contributes
//    that row's loss, so the Partial sum over ranks is the mean over counted targets.
// When no target counts the mean is 0 with zero gradients (PyTorch gives nan), as on one device.
// A sum needs no counts; per-row losses are split with the rows (or, vocabulary split, each
// rank's part of every row, summed over ranks).
std::vector<Tensor> cross_entropy_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                        const Attrs& attrs) {
  const Tensor& logits = inputs[0];
  const Tensor& targets = inputs[1];
  const CrossEntropyAttrs& a = attr<CrossEntropyAttrs>(attrs);
  const int64_t ignore = a.ignore_index;
  const Prop x = ctx.input_prop(0);
  if (x.kind == PropKind::Sharded && x.dim == 1) {
    const int64_t n = logits.size(0), v = logits.size(1);
    const double count = call1(OpKind::CountTargets, {targets}, attrs).item();  // targets are whole
    Tensor lse_r = call1(OpKind::LogSumExp, {logits});                          // [N]
    Tensor all = ctx.all_gather(call1(OpKind::Reshape, {lse_r}, ShapeAttrs{{n, 1}}), 1,
                                std::vector<int64_t>(static_cast<size_t>(ctx.world_size()), 1));
    Tensor lse = call1(OpKind::LogSumExp, {all});  // [N], the same on every rank
    Tensor column = call1(OpKind::Reshape, {lse}, ShapeAttrs{{n, 1}});
    Tensor row_loss =
        call1(OpKind::Sub, {call1(OpKind::Expand, {column}, ShapeAttrs{{n, v}}), logits});
    Tensor mine =
        call1(OpKind::TargetLogit, {row_loss, targets}, TargetAttrs{ctx.input_offset(0), ignore});
    if (a.reduction == Reduction::None) return {mine};
    Tensor total = call1(OpKind::Sum, {mine}, ReduceAttrs{});
    if (a.reduction == Reduction::Sum) return {total};
    return {call1(OpKind::MulScalar, {total}, ScalarAttrs{count > 0 ? 1.0 / count : 0.0})};
  }
  Tensor loss = call1(OpKind::CrossEntropy, inputs, attrs);
  if (ctx.output_prop(0).kind != PropKind::Partial || a.reduction != Reduction::Mean) return {loss};
  const int64_t local = static_cast<int64_t>(call1(OpKind::CountTargets, {targets}, attrs).item());
  const int64_t global = ctx.sum_over_ranks(local);
  const double scale = global > 0 ? static_cast<double>(local) / static_cast<double>(global) : 0.0;
  return {call1(OpKind::MulScalar, {loss}, ScalarAttrs{scale})};
}

// The gradient of a row-split cross-entropy: each rank's kernel divides by its own count of
// targets; scaled by local count / global count it is the slice of the global gradient.
std::vector<Tensor> cross_entropy_backward_local(ShardContext& ctx,
                                                 const std::vector<Tensor>& inputs,
                                                 const Attrs& attrs) {
  Tensor grad = call1(OpKind::CrossEntropyBackward, inputs, attrs);
  if (ctx.input_prop(2).kind != PropKind::Sharded ||
      attr<CrossEntropyAttrs>(attrs).reduction != Reduction::Mean)
    return {grad};
  const int64_t local =
      static_cast<int64_t>(call1(OpKind::CountTargets, {inputs[2]}, attrs).item());
  const int64_t global = ctx.sum_over_ranks(local);
  const double scale = global > 0 ? static_cast<double>(local) / static_cast<double>(global) : 0.0;
  return {call1(OpKind::MulScalar, {grad}, ScalarAttrs{scale})};
}

}  // namespace

void register_loss_ops(OpTable& t) {
  OpDef& ce = def_of(t, OpKind::CrossEntropy);
  ce.autocast = Autocast::Float;
  ce.name = "cross_entropy";
  ce.num_inputs = 2;
  ce.infer = [](const Metas& in, const Attrs& attrs) {
    check_cross_entropy_inputs(in, 0, "cross_entropy");
    const CrossEntropyAttrs& a = attr<CrossEntropyAttrs>(attrs);
    HAP_CHECK(a.label_smoothing >= 0 && a.label_smoothing <= 1,
              "cross_entropy: label_smoothing must be in [0, 1], got ", a.label_smoothing);
    if (a.reduction == Reduction::None) return Metas{{Shape{in[0].shape[0]}, in[0].dtype}};
    return Metas{{Shape{}, in[0].dtype}};
  };
  ce.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return 4.0 * static_cast<double>(shape_numel(in[0].shape));
  };
  // Rows split alike in logits and targets, or the vocabulary split with the targets whole: see
  // cross_entropy_local for how the shards combine (the vocabulary split without label smoothing,
  // whose mean over a row's columns would need one more collective).
  ce.local = cross_entropy_local;
  // Rows split with a mean: the forward sums the ranks' target counts (sum_over_ranks: an
  // all-gather of one 8-byte count per rank; the backward's scale comes from the forward's, through
  // autograd). The vocabulary split: every rank's log-sum-exp of its columns, [N, 1], gathered
  // into [N, P] (grouped; f32 statistics, or f64), and the reduce-scatter of its gradient in the
  // backward.
  ce.own_collectives = [](const ShardSignature& sig, const Metas& in, const Attrs& attrs) {
    std::vector<OwnCollective> c;
    const Prop x = sig.inputs[0];
    if (x.kind == PropKind::Sharded && x.dim == 1) {
      const double column = static_cast<double>(in[0].shape[0]) *
                            static_cast<double>(std::max<size_t>(4, dtype_size(in[0].dtype)));
      c.push_back({OwnCollective::Kind::AllGather, CollectiveMethod::Grouped, column, true});
      c.push_back({OwnCollective::Kind::ReduceScatter, CollectiveMethod::Grouped, column, false});
    } else if (sig.outputs[0].kind == PropKind::Partial &&
               attr<CrossEntropyAttrs>(attrs).reduction == Reduction::Mean) {
      c.push_back({OwnCollective::Kind::AllGather, CollectiveMethod::Padded, 8.0, true});
    }
    return c;
  };
  ce.shard = [](const Metas&, const Metas&, const Attrs& attrs) {
    const CrossEntropyAttrs& a = attr<CrossEntropyAttrs>(attrs);
    const Prop rows = a.reduction == Reduction::None ? Prop::sharded(0) : Prop::partial();
    std::vector<ShardSignature> sigs = {{{Prop::sharded(0), Prop::sharded(0)}, {rows}}};
    if (a.label_smoothing == 0)
      sigs.push_back({{Prop::sharded(1), Prop::replicated()}, {Prop::partial()}});
    return sigs;
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
  cb.infer = [](const Metas& in, const Attrs& attrs) {
    check_cross_entropy_inputs(in, 1, "cross_entropy_backward");
    check_same_dtype("cross_entropy_backward", in, 0, 1);
    if (attr<CrossEntropyAttrs>(attrs).reduction == Reduction::None) {
      HAP_CHECK(in[0].shape == Shape{in[1].shape[0]}, "cross_entropy_backward: gradient of the ",
                "per-row losses must be [", in[1].shape[0], "], got ", shape_str(in[0].shape));
    } else {
      HAP_CHECK(shape_numel(in[0].shape) == 1, "cross_entropy_backward: gradient of the loss must ",
                "have one element, got ", shape_str(in[0].shape));
    }
    return Metas{in[1]};
  };
  cb.flops = [](const Metas& in, const Metas&, const Attrs&) {
    return 5.0 * static_cast<double>(shape_numel(in[1].shape));
  };
  // As in the forward, each rank's kernel counts its own targets; the local hook rescales.
  cb.local = cross_entropy_backward_local;
  cb.shard = [](const Metas&, const Metas&, const Attrs& attrs) {
    const bool rows = attr<CrossEntropyAttrs>(attrs).reduction == Reduction::None;
    return std::vector<ShardSignature>{
        {{rows ? Prop::sharded(0) : Prop::replicated(), Prop::sharded(0), Prop::sharded(0)},
         {Prop::sharded(0)}}};
  };
  cb.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "cross_entropy_backward",
                   [&](auto tag) { cross_entropy_backward_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };

  // TargetLogit(x [N, V], targets [N]): each row's target logit among the columns
  // [offset, offset + V) x holds, 0 where the target is elsewhere or ignored.
  OpDef& tl = def_of(t, OpKind::TargetLogit);
  tl.autocast = Autocast::Float;
  tl.name = "target_logit";
  tl.num_inputs = 2;
  tl.infer = [](const Metas& in, const Attrs&) {
    check_target_inputs(in, 0, "target_logit");
    return Metas{{Shape{in[0].shape[0]}, in[0].dtype}};
  };
  tl.shard = [](const Metas&, const Metas&, const Attrs&) {
    return std::vector<ShardSignature>{{{Prop::sharded(0), Prop::sharded(0)}, {Prop::sharded(0)}}};
  };
  tl.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "target_logit",
                   [&](auto tag) { target_logit_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };
  tl.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{
        call1(OpKind::TargetLogitBackward, {c.grad_outputs[0], c.inputs[0], c.inputs[1]}, c.attrs),
        Tensor()};
  };

  OpDef& tb = def_of(t, OpKind::TargetLogitBackward);
  tb.name = "target_logit_backward";
  tb.num_inputs = 3;
  tb.infer = [](const Metas& in, const Attrs&) {
    check_target_inputs(in, 1, "target_logit_backward");
    check_same_dtype("target_logit_backward", in, 0, 1);
    HAP_CHECK(in[0].shape == Shape{in[1].shape[0]}, "target_logit_backward: gradient ",
              shape_str(in[0].shape), " does not match ", shape_str(in[1].shape));
    return Metas{in[1]};
  };
  tb.shard = [](const Metas&, const Metas&, const Attrs&) {
    return std::vector<ShardSignature>{
        {{Prop::sharded(0), Prop::sharded(0), Prop::sharded(0)}, {Prop::sharded(0)}}};
  };
  tb.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    dispatch_float(out.dtype(), "target_logit_backward",
                   [&](auto tag) { target_logit_backward_kernel<decltype(tag)>(c, out); });
    return std::vector<Tensor>{out};
  };

  // CountTargets(targets i64 [...]): how many differ from ignore_index, as an i64 scalar.
  OpDef& ct = def_of(t, OpKind::CountTargets);
  ct.name = "count_targets";
  ct.num_inputs = 1;
  ct.infer = [](const Metas& in, const Attrs&) {
    HAP_CHECK(in[0].dtype == DType::I64, "count_targets: targets must be i64, got ",
              dtype_name(in[0].dtype));
    return Metas{{Shape{}, DType::I64}};
  };
  ct.cpu = [](const KernelContext& c) {
    Tensor targets = c.inputs[0].contiguous();
    const int64_t ignore = attr<CrossEntropyAttrs>(c.attrs).ignore_index;
    const int64_t* p = targets.data<int64_t>();
    int64_t count = 0;
    for (int64_t i = 0; i < targets.numel(); ++i) count += p[i] != ignore;
    Tensor out = c.alloc(0);
    out.data<int64_t>()[0] = count;
    return std::vector<Tensor>{out};
  };
}

}  // namespace hap::ops
