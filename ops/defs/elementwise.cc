// Elementwise ops: binary with broadcasting, scalar, unary, activations, masking, casting, dropout.
#include <cmath>

#include "core/rng.h"
#include "ops/cpu/loops.h"
#include "ops/cpu/vec_math.h"
#include "ops/defs/common.h"

namespace hap::ops {

namespace {

using cpu::binary_map;
using cpu::unary_map;

// Inference is shared by many ops but its errors must name the op: InferFn gets no OpKind, so
// each op gets its own instantiation, picked from these tables by kind.
template <Metas (*Infer)(const Metas&, const char*)>
struct NamedInfer {
  template <OpKind K>
  static Metas fn(const Metas& in, const Attrs&) {
    return Infer(in, op_def(K).name);
  }
  static InferFn of(OpKind k) {
    static constexpr InferFn table[] = {
#define HAP_OP_INFER(name) &fn<OpKind::name>,
        HAP_OP_LIST(HAP_OP_INFER)
#undef HAP_OP_INFER
    };
    return table[static_cast<size_t>(k)];
  }
};

// ---------------- binary ----------------
Metas infer_binary_named(const Metas& in, const char* op) {
  check_floating(op, in, 0);
  check_floating(op, in, 1);
  check_same_dtype(op, in, 0, 1);
  return {{broadcast_shapes(in[0].shape, in[1].shape, op), in[0].dtype}};
}
InferFn infer_binary(OpKind k) { return NamedInfer<infer_binary_named>::of(k); }

template <typename F>
std::vector<Tensor> run_binary(const KernelContext& ctx, F f) {
  Tensor out = ctx.alloc(0);
  dispatch_float(out.dtype(), op_name(ctx.kind), [&](auto tag) {
    using T = decltype(tag);
    binary_map<T>(out, ctx.inputs[0], ctx.inputs[1], [&](T a, T b) { return f(a, b); });
  });
  return {out};
}

std::vector<Tensor> grads2(const Tensor& ga, const Tensor& gb) { return {ga, gb}; }

double flops1(const Metas&, const Metas& out, const Attrs&) { return elementwise_flops(out, 1); }

void def_binary(OpTable& t, OpKind k, const char* name, KernelFn cpu, BackwardFn bw) {
  OpDef& d = def_of(t, k);
  d.name = name;
  d.num_inputs = 2;
  d.infer = infer_binary(k);
  d.flops = flops1;
  d.cpu = cpu;
  d.backward = bw;
}

// ---------------- unary ----------------
Metas infer_unary_named(const Metas& in, const char* op) {
  check_floating(op, in, 0);
  return {in[0]};
}
InferFn infer_unary(OpKind k) { return NamedInfer<infer_unary_named>::of(k); }

template <typename F>
std::vector<Tensor> run_unary(const KernelContext& ctx, F f) {
  Tensor out = ctx.alloc(0);
  dispatch_float(out.dtype(), op_name(ctx.kind), [&](auto tag) {
    using T = decltype(tag);
    unary_map<T>(out, ctx.inputs[0], [&](T x) { return f(x); });
  });
  return {out};
}

std::vector<ShardSignature> shard_any_dim(const Metas& in, const Metas& out, const Attrs&) {
  return elementwise_signatures(in, out, {});
}
std::vector<ShardSignature> shard_linear_unary(const Metas& in, const Metas& out, const Attrs&) {
  return elementwise_signatures(in, out, {0});
}

void def_unary(OpTable& t, OpKind k, const char* name, KernelFn cpu, BackwardFn bw,
               double flops_per_element, bool linear, bool saves_inputs, bool saves_outputs) {
  OpDef& d = def_of(t, k);
  d.name = name;
  d.num_inputs = 1;
  d.infer = infer_unary(k);
  d.cpu = cpu;
  d.backward = bw;
  d.shard = linear ? shard_linear_unary : shard_any_dim;
  d.saves_inputs = saves_inputs;
  d.saves_outputs = saves_outputs;
  // Stateless lambdas cannot capture the per-element count; the common cases are listed.
  if (flops_per_element <= 1)
    d.flops = flops1;
  else if (flops_per_element <= 4)
    d.flops = [](const Metas&, const Metas& o, const Attrs&) { return elementwise_flops(o, 4); };
  else
    d.flops = [](const Metas&, const Metas& o, const Attrs&) { return elementwise_flops(o, 12); };
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCoeff = 0.044715;

template <typename T>
inline T gelu_tanh(T x) {
  T u = static_cast<T>(kSqrt2OverPi) * (x + static_cast<T>(kGeluCoeff) * x * x * x);
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + cpu::tanh_fast(u));
}
template <typename T>
inline T gelu_tanh_grad(T x) {
  T x2 = x * x;
  T u = static_cast<T>(kSqrt2OverPi) * (x + static_cast<T>(kGeluCoeff) * x2 * x);
  T th = cpu::tanh_fast(u);
  T du = static_cast<T>(kSqrt2OverPi) * (static_cast<T>(1) + static_cast<T>(3 * kGeluCoeff) * x2);
  return static_cast<T>(0.5) * (static_cast<T>(1) + th) +
         static_cast<T>(0.5) * x * (static_cast<T>(1) - th * th) * du;
}
template <typename T>
inline T gelu_erf(T x) {
  return static_cast<T>(0.5) * x * (static_cast<T>(1) + std::erf(x * static_cast<T>(M_SQRT1_2)));
}
template <typename T>
inline T gelu_erf_grad(T x) {
  T cdf = static_cast<T>(0.5) * (static_cast<T>(1) + std::erf(x * static_cast<T>(M_SQRT1_2)));
  T pdf = std::exp(static_cast<T>(-0.5) * x * x) * static_cast<T>(0.3989422804014327);
  return cdf + x * pdf;
}

}  // namespace

namespace {

// Dropout on a shard draws exactly its slice of the single-device mask, with the step's streams
// and the run's seed; in evaluation it is the identity.
std::vector<Tensor> dropout_local(ShardContext& ctx, const std::vector<Tensor>& inputs,
                                  const Attrs& attrs) {
  RandomAttrs r = attr<RandomAttrs>(attrs);
  if (!ctx.training() || r.p == 0) return {inputs[0]};
  r.stream += ctx.random_offset();
  if (ctx.random_seed()) r.seed = *ctx.random_seed();
  r.slice = ctx.input_slice(0);
  return {call1(OpKind::Dropout, inputs, r)};
}

}  // namespace

void register_elementwise_ops(OpTable& t) {
  // ---- binary: backward reduces broadcast dims with sum_to ----
  def_binary(
      t, OpKind::Add, "add",
      [](const KernelContext& c) { return run_binary(c, [](auto a, auto b) { return a + b; }); },
      [](const BackwardContext& c) {
        const Tensor& g = c.grad_outputs[0];
        return grads2(c.needs_input_grad[0] ? sum_to(g, c.inputs[0].shape()) : Tensor(),
                      c.needs_input_grad[1] ? sum_to(g, c.inputs[1].shape()) : Tensor());
      });
  def_binary(
      t, OpKind::Sub, "sub",
      [](const KernelContext& c) { return run_binary(c, [](auto a, auto b) { return a - b; }); },
      [](const BackwardContext& c) {
        const Tensor& g = c.grad_outputs[0];
        return grads2(c.needs_input_grad[0] ? sum_to(g, c.inputs[0].shape()) : Tensor(),
                      c.needs_input_grad[1] ? sum_to(call1(OpKind::Neg, {g}), c.inputs[1].shape())
                                            : Tensor());
      });
  def_binary(
      t, OpKind::Mul, "mul",
      [](const KernelContext& c) { return run_binary(c, [](auto a, auto b) { return a * b; }); },
      [](const BackwardContext& c) {
        const Tensor& g = c.grad_outputs[0];
        const Tensor &a = c.inputs[0], &b = c.inputs[1];
        return grads2(
            c.needs_input_grad[0] ? sum_to(call1(OpKind::Mul, {g, b}), a.shape()) : Tensor(),
            c.needs_input_grad[1] ? sum_to(call1(OpKind::Mul, {g, a}), b.shape()) : Tensor());
      });
  def_binary(
      t, OpKind::Div, "div",
      [](const KernelContext& c) { return run_binary(c, [](auto a, auto b) { return a / b; }); },
      [](const BackwardContext& c) {
        const Tensor& g = c.grad_outputs[0];
        const Tensor &a = c.inputs[0], &b = c.inputs[1];
        Tensor ga, gb;
        if (c.needs_input_grad[0]) ga = sum_to(call1(OpKind::Div, {g, b}), a.shape());
        if (c.needs_input_grad[1]) {
          // d(a/b)/db = -a / b^2
          Tensor q = call1(OpKind::Div, {call1(OpKind::Mul, {g, a}), call1(OpKind::Mul, {b, b})});
          gb = sum_to(call1(OpKind::Neg, {q}), b.shape());
        }
        return grads2(ga, gb);
      });
  // Sharding of binary ops: any output dim; Partial through the linear inputs.
  def_of(t, OpKind::Add).shard = [](const Metas& in, const Metas& out, const Attrs&) {
    auto s = elementwise_signatures(in, out, {});
    s.push_back({{Prop::partial(), Prop::partial()}, {Prop::partial()}});
    return s;
  };
  def_of(t, OpKind::Sub).shard = def_of(t, OpKind::Add).shard;
  def_of(t, OpKind::Add).input_metas_only = true;  // their backward reads the inputs' shapes
  def_of(t, OpKind::Sub).input_metas_only = true;
  def_of(t, OpKind::Mul).shard = [](const Metas& in, const Metas& out, const Attrs&) {
    return elementwise_signatures(in, out, {0, 1});
  };
  def_of(t, OpKind::Div).shard = [](const Metas& in, const Metas& out, const Attrs&) {
    return elementwise_signatures(in, out, {0});
  };

  // ---- scalar ----
  def_unary(
      t, OpKind::AddScalar, "add_scalar",
      [](const KernelContext& c) {
        double s = attr<ScalarAttrs>(c.attrs).value;
        return run_unary(c, [s](auto x) { return x + static_cast<decltype(x)>(s); });
      },
      [](const BackwardContext& c) { return std::vector<Tensor>{c.grad_outputs[0]}; }, 1, false,
      false, false);
  def_unary(
      t, OpKind::MulScalar, "mul_scalar",
      [](const KernelContext& c) {
        double s = attr<ScalarAttrs>(c.attrs).value;
        return run_unary(c, [s](auto x) { return x * static_cast<decltype(x)>(s); });
      },
      [](const BackwardContext& c) {
        return std::vector<Tensor>{call1(OpKind::MulScalar, {c.grad_outputs[0]}, c.attrs)};
      },
      1, true, false, false);
  def_unary(
      t, OpKind::PowScalar, "pow",
      [](const KernelContext& c) {
        double e = attr<ScalarAttrs>(c.attrs).value;
        return run_unary(c, [e](auto x) {
          using T = decltype(x);
          return e == 2.0 ? x * x : static_cast<T>(std::pow(x, static_cast<T>(e)));
        });
      },
      [](const BackwardContext& c) {
        double e = attr<ScalarAttrs>(c.attrs).value;
        Tensor d =
            call1(OpKind::MulScalar, {call1(OpKind::PowScalar, {c.inputs[0]}, ScalarAttrs{e - 1})},
                  ScalarAttrs{e});
        return std::vector<Tensor>{call1(OpKind::Mul, {c.grad_outputs[0], d})};
      },
      4, false, true, false);

  // ---- unary math ----
  def_unary(
      t, OpKind::Neg, "neg",
      [](const KernelContext& c) { return run_unary(c, [](auto x) { return -x; }); },
      [](const BackwardContext& c) {
        return std::vector<Tensor>{call1(OpKind::Neg, {c.grad_outputs[0]})};
      },
      1, true, false, false);
  def_unary(
      t, OpKind::Exp, "exp",
      [](const KernelContext& c) { return run_unary(c, [](auto x) { return std::exp(x); }); },
      [](const BackwardContext& c) {
        return std::vector<Tensor>{call1(OpKind::Mul, {c.grad_outputs[0], c.outputs[0]})};
      },
      4, false, false, true);
  def_unary(
      t, OpKind::Log, "log",
      [](const KernelContext& c) { return run_unary(c, [](auto x) { return std::log(x); }); },
      [](const BackwardContext& c) {
        return std::vector<Tensor>{call1(OpKind::Div, {c.grad_outputs[0], c.inputs[0]})};
      },
      4, false, true, false);
  def_unary(
      t, OpKind::Sqrt, "sqrt",
      [](const KernelContext& c) { return run_unary(c, [](auto x) { return std::sqrt(x); }); },
      [](const BackwardContext& c) {
        Tensor d = call1(OpKind::MulScalar, {c.outputs[0]}, ScalarAttrs{2.0});
        return std::vector<Tensor>{call1(OpKind::Div, {c.grad_outputs[0], d})};
      },
      4, false, false, true);
  def_unary(
      t, OpKind::Rsqrt, "rsqrt",
      [](const KernelContext& c) {
        return run_unary(c, [](auto x) { return static_cast<decltype(x)>(1) / std::sqrt(x); });
      },
      [](const BackwardContext& c) {
        // d/dx x^-1/2 = -1/2 y^3
        const Tensor& y = c.outputs[0];
        Tensor y3 = call1(OpKind::Mul, {call1(OpKind::Mul, {y, y}), y});
        Tensor d = call1(OpKind::MulScalar, {y3}, ScalarAttrs{-0.5});
        return std::vector<Tensor>{call1(OpKind::Mul, {c.grad_outputs[0], d})};
      },
      4, false, false, true);
  def_unary(
      t, OpKind::Tanh, "tanh",
      [](const KernelContext& c) { return run_unary(c, [](auto x) { return std::tanh(x); }); },
      [](const BackwardContext& c) {
        const Tensor& y = c.outputs[0];
        Tensor d = call1(OpKind::AddScalar, {call1(OpKind::Neg, {call1(OpKind::Mul, {y, y})})},
                         ScalarAttrs{1.0});
        return std::vector<Tensor>{call1(OpKind::Mul, {c.grad_outputs[0], d})};
      },
      12, false, false, true);
  def_unary(
      t, OpKind::Sigmoid, "sigmoid",
      [](const KernelContext& c) {
        return run_unary(c, [](auto x) {
          using T = decltype(x);
          return static_cast<T>(1) / (static_cast<T>(1) + cpu::exp_fast(-x));
        });
      },
      [](const BackwardContext& c) {
        const Tensor& y = c.outputs[0];
        Tensor one_minus = call1(OpKind::AddScalar, {call1(OpKind::Neg, {y})}, ScalarAttrs{1.0});
        return std::vector<Tensor>{
            call1(OpKind::Mul, {c.grad_outputs[0], call1(OpKind::Mul, {y, one_minus})})};
      },
      4, false, false, true);
  def_unary(
      t, OpKind::Relu, "relu",
      [](const KernelContext& c) {
        return run_unary(c, [](auto x) { return x > 0 ? x : static_cast<decltype(x)>(0); });
      },
      [](const BackwardContext& c) {
        return std::vector<Tensor>{call1(OpKind::ReluBackward, {c.grad_outputs[0], c.outputs[0]})};
      },
      1, false, false, true);
  def_unary(
      t, OpKind::Gelu, "gelu",
      [](const KernelContext& c) {
        if (attr<GeluAttrs>(c.attrs).approx == GeluApprox::Tanh)
          return run_unary(c, [](auto x) { return gelu_tanh(x); });
        return run_unary(c, [](auto x) { return gelu_erf(x); });
      },
      [](const BackwardContext& c) {
        return std::vector<Tensor>{
            call1(OpKind::GeluBackward, {c.grad_outputs[0], c.inputs[0]}, c.attrs)};
      },
      12, false, true, false);

  // ---- fused backward kernels: inputs (grad, x or y) ----
  OpDef& gb = def_of(t, OpKind::GeluBackward);
  gb.name = "gelu_backward";
  gb.num_inputs = 2;
  gb.infer = infer_binary(OpKind::GeluBackward);
  gb.flops = [](const Metas&, const Metas& o, const Attrs&) { return elementwise_flops(o, 16); };
  gb.shard = shard_any_dim;
  gb.cpu = [](const KernelContext& c) {
    if (attr<GeluAttrs>(c.attrs).approx == GeluApprox::Tanh)
      return run_binary(c, [](auto g, auto x) { return g * gelu_tanh_grad(x); });
    return run_binary(c, [](auto g, auto x) { return g * gelu_erf_grad(x); });
  };
  OpDef& rb = def_of(t, OpKind::ReluBackward);
  rb.name = "relu_backward";
  rb.num_inputs = 2;
  rb.infer = infer_binary(OpKind::ReluBackward);
  rb.flops = flops1;
  rb.shard = shard_any_dim;
  rb.cpu = [](const KernelContext& c) {
    return run_binary(c, [](auto g, auto y) { return y > 0 ? g : static_cast<decltype(g)>(0); });
  };

  // ---- masked_fill(x, mask u8 broadcastable to x, value) ----
  OpDef& mf = def_of(t, OpKind::MaskedFill);
  mf.name = "masked_fill";
  mf.num_inputs = 2;
  mf.infer = [](const Metas& in, const Attrs&) {
    check_floating("masked_fill", in, 0);
    HAP_CHECK(in[1].dtype == DType::U8, "masked_fill: mask must be u8, got ",
              dtype_name(in[1].dtype));
    Shape s = broadcast_shapes(in[0].shape, in[1].shape, "masked_fill");
    HAP_CHECK(s == in[0].shape, "masked_fill: mask ", shape_str(in[1].shape),
              " must broadcast to the input shape ", shape_str(in[0].shape));
    return Metas{in[0]};
  };
  mf.flops = flops1;
  mf.shard = shard_any_dim;
  mf.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    const Tensor& x = c.inputs[0];
    const Tensor& m = c.inputs[1];
    Tensor mask =
        m.as_strided(x.shape(), cpu::broadcast_strides(m, x.shape()), m.offset()).contiguous();
    Tensor xc = x.contiguous();
    double value = attr<ScalarAttrs>(c.attrs).value;
    dispatch_float(out.dtype(), "masked_fill", [&](auto tag) {
      using T = decltype(tag);
      const T* px = xc.data<T>();
      const uint8_t* pm = mask.data<uint8_t>();
      T* py = out.data<T>();
      T v = static_cast<T>(value);
      int64_t n = out.numel();
#pragma omp parallel for simd if (parallel : n > cpu::kParallelGrain)
      for (int64_t i = 0; i < n; ++i) py[i] = pm[i] ? v : px[i];
    });
    return std::vector<Tensor>{out};
  };
  mf.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{
        call1(OpKind::MaskedFill, {c.grad_outputs[0], c.inputs[1]}, ScalarAttrs{0.0}), Tensor()};
  };

  // ---- cast ----
  OpDef& cs = def_of(t, OpKind::Cast);
  cs.autocast = Autocast::Keep;
  cs.moves_data = true;
  cs.name = "cast";
  cs.num_inputs = 1;
  cs.infer = [](const Metas& in, const Attrs& a) {
    return Metas{{in[0].shape, attr<CastAttrs>(a).dtype}};
  };
  cs.shard = shard_linear_unary;
  cs.any_device = true;
  cs.cpu = [](const KernelContext& c) {
    Tensor out = c.alloc(0);
    out.copy_from(c.inputs[0]);  // on any device
    return std::vector<Tensor>{out};
  };
  cs.input_metas_only = true;
  cs.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{
        call1(OpKind::Cast, {c.grad_outputs[0]}, CastAttrs{c.inputs[0].dtype()})};
  };

  // ---- dropout: y = x * mask / (1 - p); its backward is the same op on the gradient ----
  OpDef& dr = def_of(t, OpKind::Dropout);
  dr.name = "dropout";
  dr.num_inputs = 1;
  dr.infer = infer_unary(OpKind::Dropout);
  dr.flops = [](const Metas&, const Metas& o, const Attrs&) { return elementwise_flops(o, 2); };
  dr.shard = shard_linear_unary;
  dr.local = dropout_local;
  dr.saves_inputs = false;
  dr.cpu = [](const KernelContext& c) {
    const RandomAttrs& a = attr<RandomAttrs>(c.attrs);
    Tensor out = c.alloc(0);
    fill_bernoulli(out, a.seed, a.stream, 1.0 - a.p, a.slice);
    double scale = 1.0 / (1.0 - a.p);
    dispatch_float(out.dtype(), "dropout", [&](auto tag) {
      using T = decltype(tag);
      T s = static_cast<T>(scale);
      binary_map<T>(out, out, c.inputs[0], [s](T m, T x) { return m * x * s; });
    });
    return std::vector<Tensor>{out};
  };
  dr.backward = [](const BackwardContext& c) {
    return std::vector<Tensor>{call1(OpKind::Dropout, {c.grad_outputs[0]}, c.attrs)};
  };
}

}  // namespace hap::ops
