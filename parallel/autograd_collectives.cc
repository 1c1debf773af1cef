#include "parallel/autograd_collectives.h"

#include "autograd/engine.h"
#include "core/error.h"
#include "ops/functional.h"
#include "parallel/shard.h"

namespace hap::parallel::functional {

namespace {

// The gradient a backward received for its single output, or zeros of the output's shape if
// none arrived: every rank must still take part in the backward collective.
Tensor grad_or_zeros(const std::vector<Tensor>& grad_outputs, const Shape& shape,
                     const TensorOptions& like) {
  if (!grad_outputs.empty() && grad_outputs[0].defined()) return grad_outputs[0].contiguous();
  return Tensor::zeros(shape, like);
}

// The dtype and device of `t`, for tensors made in its place.
TensorOptions options_of(const Tensor& t) {
  return TensorOptions{}.with_dtype(t.dtype()).with_device(t.device());
}

Tensor record1(const char* name, const Tensor& input, Tensor output, autograd::CustomBackward bw) {
  return autograd::record_custom(name, {input}, {std::move(output)}, std::move(bw))[0];
}

}  // namespace

Tensor all_gather(const Communicator& comm, const Tensor& x_local, int64_t dim,
                  const std::vector<int64_t>& lengths, CollectiveMethod method) {
  Tensor out = parallel::all_gather(comm, x_local.detach(), dim, lengths, method);
  const Shape& out_shape = out.shape();
  const TensorOptions like = options_of(out);
  return record1("all_gather", x_local, out, [=](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{
        parallel::reduce_scatter(comm, grad_or_zeros(g, out_shape, like), dim, lengths, method)};
  });
}

Tensor all_gather_regathered(const Communicator& comm, const Tensor& x_local, int64_t dim,
                             const std::vector<int64_t>& lengths, CollectiveMethod method) {
  Tensor out = functional::all_gather(comm, x_local, dim, lengths, method);
  if (!out.requires_grad()) return out;  // no backward: nothing would be saved
  const Tensor shard = x_local.detach();
  return autograd::rematerializable(
      out, [=] { return parallel::all_gather(comm, shard, dim, lengths, method); });
}

Tensor reduce_scatter(const Communicator& comm, const Tensor& x_partial, int64_t dim,
                      const std::vector<int64_t>& lengths, CollectiveMethod method) {
  Tensor out = parallel::reduce_scatter(comm, x_partial.detach(), dim, lengths, method);
  const Shape& out_shape = out.shape();
  const TensorOptions like = options_of(out);
  return record1("reduce_scatter", x_partial, out, [=](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{
        parallel::all_gather(comm, grad_or_zeros(g, out_shape, like), dim, lengths, method)};
  });
}

Tensor all_reduce(const Communicator& comm, const Tensor& x_partial, CollectiveMethod method) {
  Tensor out = parallel::all_reduce(comm, x_partial.detach(), method);
  const Shape& out_shape = out.shape();
  const TensorOptions like = options_of(out);
  return record1("all_reduce", x_partial, out, [=](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{
        parallel::all_reduce(comm, grad_or_zeros(g, out_shape, like), method)};
  });
}

Tensor all_to_all(const Communicator& comm, const Tensor& x_local, int64_t split_dim,
                  int64_t concat_dim, const std::vector<int64_t>& lengths_split,
                  const std::vector<int64_t>& lengths_concat, CollectiveMethod method) {
  Tensor out = parallel::all_to_all(comm, x_local.detach(), split_dim, concat_dim, lengths_split,
                                    lengths_concat, method);
  const Shape& out_shape = out.shape();
  const TensorOptions like = options_of(out);
  return record1("all_to_all", x_local, out, [=](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{parallel::all_to_all(comm, grad_or_zeros(g, out_shape, like),
                                                    concat_dim, split_dim, lengths_concat,
                                                    lengths_split, method)};
  });
}

Tensor shard_slice(const Communicator& comm, const Tensor& x, int64_t dim,
                   const std::vector<int64_t>& lengths) {
  HAP_CHECK(x.defined(), "shard_slice: got an undefined tensor");
  HAP_CHECK(static_cast<int>(lengths.size()) == comm.size(), "shard_slice: got ", lengths.size(),
            " shard lengths for a communicator of ", comm.size(), " ranks");
  ShardSpec spec(dim, lengths);
  const int me = comm.rank();
  spec.local_shape(x.shape(), me);  // validates dim and the lengths' sum against x
  // The registry's slice: its backward is exactly the zero-embedding this convention needs.
  return slice(x, dim, spec.offset(me), spec.offset(me) + spec.length(me));
}

Tensor to_partial(const Communicator& comm, const Tensor& x, int root) {
  HAP_CHECK(x.defined(), "to_partial: got an undefined tensor");
  HAP_CHECK(root >= 0 && root < comm.size(), "to_partial: root ", root, " out of range for ",
            comm.size(), " ranks");
  const bool keep = comm.rank() == root;
  const Shape& shape = x.shape();
  const TensorOptions like = options_of(x);
  Tensor out = keep ? x.detach() : Tensor::zeros(shape, like);
  return record1("to_partial", x, out, [=](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{keep ? grad_or_zeros(g, shape, like) : Tensor::zeros(shape, like)};
  });
}

Tensor replicate(const Communicator& comm, const Tensor& x, CollectiveMethod method) {
  HAP_CHECK(x.defined(), "replicate: got an undefined tensor");
  const Shape& shape = x.shape();
  const TensorOptions like = options_of(x);
  return record1("replicate", x, x.detach(), [=](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{parallel::all_reduce(comm, grad_or_zeros(g, shape, like), method)};
  });
}

}  // namespace hap::parallel::functional
