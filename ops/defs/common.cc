#include "ops/defs/common.h"

namespace hap::ops {

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  int64_t nd = grad.dim(), k = static_cast<int64_t>(shape.size());
  HAP_ASSERT(nd >= k, "sum_to: ", shape_str(grad.shape()), " -> ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < nd; ++d) {
    int64_t sd = d - (nd - k);
    if (sd < 0 || (shape[sd] == 1 && grad.shape()[d] != 1)) dims.push_back(d);
  }
  Tensor s = dims.empty() ? grad : call1(OpKind::Sum, {grad}, ReduceAttrs{dims, true});
  return call1(OpKind::Reshape, {s}, ShapeAttrs{shape});
}

std::vector<ShardSignature> elementwise_signatures(const Metas& in, const Metas& out,
                                                   const std::vector<size_t>& partial_inputs) {
  std::vector<ShardSignature> sigs;
  const Shape& os = out[0].shape;
  int64_t nd = static_cast<int64_t>(os.size());
  for (int64_t d = 0; d < nd; ++d) {
    if (os[d] <= 1) continue;
    ShardSignature s;
    for (const TensorMeta& m : in) {
      int64_t k = static_cast<int64_t>(m.shape.size());
      int64_t id = d - (nd - k);
      bool along = id >= 0 && m.shape[id] == os[d];
      s.inputs.push_back(along ? Prop::sharded(id) : Prop::replicated());
    }
    s.outputs.assign(out.size(), Prop::sharded(d));
    sigs.push_back(std::move(s));
  }
  for (size_t p : partial_inputs) {
    ShardSignature s;
    for (size_t i = 0; i < in.size(); ++i)
      s.inputs.push_back(i == p ? Prop::partial() : Prop::replicated());
    s.outputs.assign(out.size(), Prop::partial());
    sigs.push_back(std::move(s));
  }
  return sigs;
}

}  // namespace hap::ops
