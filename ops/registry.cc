#include <sstream>

#include "ops/dispatch.h"
#include "ops/op.h"
#ifdef HAP_HAVE_CUDA
#include "ops/cuda/kernels.h"
#endif

namespace hap::ops {

namespace {
constexpr const char* kOpNames[] = {
#define HAP_OP_NAME(name) #name,
    HAP_OP_LIST(HAP_OP_NAME)
#undef HAP_OP_NAME
};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == kNumOps, "op name table incomplete");

OpTable build_table() {
  OpTable t{};
  register_matmul_ops(t);
  register_elementwise_ops(t);
  register_reduce_ops(t);
  register_shape_ops(t);
  register_nn_ops(t);
  register_loss_ops(t);
  register_attention_ops(t);
  register_optim_ops(t);
  register_conv_ops(t);
  register_moe_ops(t);
#ifdef HAP_HAVE_CUDA
  cuda::register_all(t);
#endif
  for (size_t i = 0; i < kNumOps; ++i) {
    HAP_ASSERT(t[i].name != nullptr && t[i].infer != nullptr && t[i].cpu != nullptr, "op ",
               kOpNames[i], " has no complete registry entry");
  }
  return t;
}
}  // namespace

const char* op_name(OpKind kind) { return kOpNames[static_cast<size_t>(kind)]; }

const OpTable& op_table() {
  static const OpTable table = build_table();
  return table;
}

const OpDef& op_def(OpKind kind) { return op_table()[static_cast<size_t>(kind)]; }

const char* method_name(CollectiveMethod m) {
  switch (m) {
    case CollectiveMethod::None:
      return "-";
    case CollectiveMethod::Padded:
      return "padded";
    case CollectiveMethod::Grouped:
      return "grouped";
    case CollectiveMethod::Hierarchical:
      return "hierarchical";
  }
  return "?";
}

std::string Prop::str() const {
  switch (kind) {
    case PropKind::Replicated:
      return "R";
    case PropKind::Sharded:
      return "S(" + std::to_string(dim) + ")";
    case PropKind::Partial:
      return "P";
  }
  return "?";
}

namespace {
std::string vec_str(const std::vector<int64_t>& v) { return shape_str(v); }
struct AttrPrinter {
  std::ostringstream& os;
  void operator()(const NoAttrs&) {}
  void operator()(const ScalarAttrs& a) { os << "value=" << a.value; }
  void operator()(const GeluAttrs& a) {
    os << "approx=" << (a.approx == GeluApprox::Tanh ? "tanh" : "none");
  }
  void operator()(const DimAttrs& a) { os << "dim=" << a.dim << (a.keepdim ? " keepdim" : ""); }
  void operator()(const ReduceAttrs& a) {
    os << "dims=" << vec_str(a.dims) << (a.keepdim ? " keepdim" : "");
  }
  void operator()(const NormAttrs& a) { os << "eps=" << a.eps; }
  void operator()(const RandomAttrs& a) {
    os << "p=" << a.p << " seed=" << a.seed << " stream=" << a.stream;
  }
  void operator()(const ShapeAttrs& a) { os << "shape=" << vec_str(a.shape); }
  void operator()(const PermuteAttrs& a) { os << "perm=" << vec_str(a.perm); }
  void operator()(const SliceAttrs& a) {
    os << "dim=" << a.dim << " start=" << a.start << " end=" << a.end;
  }
  void operator()(const SplitAttrs& a) { os << "dim=" << a.dim << " sizes=" << vec_str(a.sizes); }
  void operator()(const TargetAttrs& a) {
    os << "offset=" << a.offset << " ignore_index=" << a.ignore_index;
  }
  void operator()(const AttentionAttrs& a) {
    os << "causal=" << a.causal << " scale=" << a.scale << " dropout=" << a.dropout.p;
  }
  void operator()(const TopKAttrs& a) {
    os << "k=" << a.k << " dim=" << a.dim << (a.largest ? " largest" : " smallest");
  }
  void operator()(const ScatterAttrs& a) {
    os << "dim=" << a.dim << " start=" << a.start << " shape=" << vec_str(a.shape);
  }
  void operator()(const CastAttrs& a) { os << "dtype=" << dtype_name(a.dtype); }
  void operator()(const OptimizerAttrs& a) { os << "tensors=" << a.lr.size(); }
  void operator()(const CrossEntropyAttrs& a) {
    os << "ignore_index=" << a.ignore_index;
    if (a.label_smoothing != 0) os << " label_smoothing=" << a.label_smoothing;
    if (a.reduction != Reduction::Mean)
      os << " reduction=" << (a.reduction == Reduction::Sum ? "sum" : "none");
  }
  void operator()(const Conv2dAttrs& a) {
    os << "stride=" << pair(a.stride) << " padding=" << pair(a.padding)
       << " dilation=" << pair(a.dilation) << " groups=" << a.groups;
  }
  void operator()(const Pool2dAttrs& a) {
    os << "kernel=" << pair(a.kernel) << " stride=" << pair(a.stride)
       << " padding=" << pair(a.padding);
  }
  void operator()(const MaskTokensAttrs& a) {
    os << "p=" << a.p << " mask_id=" << a.mask_id << " vocab=" << a.vocab
       << " ignore_index=" << a.ignore_index << (a.targets ? " targets" : " inputs")
       << " seed=" << a.seed << " stream=" << a.stream;
  }
  void operator()(const MoeAttrs& a) {
    os << "experts=" << a.experts << " capacity=" << a.capacity;
  }
  static std::string pair(const std::array<int64_t, 2>& v) { return vec_str({v[0], v[1]}); }
};
}  // namespace

std::string attrs_str(const Attrs& attrs) {
  std::ostringstream os;
  std::visit(AttrPrinter{os}, attrs);
  return os.str();
}

}  // namespace hap::ops
