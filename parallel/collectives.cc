#include "parallel/collectives.h"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "core/strided_copy.h"
#include "core/timeline.h"
#include "parallel/hierarchical.h"
#include "parallel/shard.h"

namespace hap::parallel {

namespace {

// ---- argument checks ----

void check_tensor(const Communicator& comm, const Tensor& x, const char* op) {
  HAP_CHECK(x.defined(), op, ": got an undefined tensor");
  HAP_CHECK(x.has_storage(), op, ": tensor ", x.str(), " has no storage (a traced tensor)");
  HAP_CHECK(comm.backend().supports(x.device()), op, ": tensor ", x.str(), " is on ",
            x.device().str(), ", which the ", comm.backend().name(), " backend does not carry");
}

std::string lengths_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

void check_lengths(const Communicator& comm, const std::vector<int64_t>& lengths, const char* op) {
  HAP_CHECK(static_cast<int>(lengths.size()) == comm.size(), op, ": got ", lengths.size(),
            " shard lengths ", lengths_str(lengths), " for a communicator of ", comm.size(),
            " ranks (expected one per rank)");
  for (int64_t len : lengths)
    HAP_CHECK(len >= 0, op, ": shard lengths ", lengths_str(lengths), " have a negative entry");
}

// `gathers`: an all-gather or a reduce-scatter, which have a hierarchical form where the
// communicator carries node groups.
void check_method(const Communicator& comm, CollectiveMethod method, const char* op, bool gathers) {
  HAP_CHECK(method != CollectiveMethod::None, op,
            ": collective method None moves nothing; use "
            "Padded or Grouped");
  HAP_CHECK(method != CollectiveMethod::Hierarchical || gathers, op,
            ": only all_reduce, all_gather and reduce_scatter have a hierarchical form; use "
            "Padded or Grouped");
  HAP_CHECK(method != CollectiveMethod::Hierarchical || comm.node_groups() != nullptr, op,
            ": the hierarchical form needs the ranks' nodes (Communicator::with_node_groups)");
}

int64_t check_dim(const Tensor& x, int64_t dim, const char* op) {
  HAP_CHECK(x.dim() >= 1, op, ": a 0-dim tensor (", x.str(), ") has no dim to shard");
  return wrap_dim(dim, x.dim(), op);
}

void check_reducible(DType dtype, const char* op) {
  HAP_CHECK(dtype != DType::U8, op, ": cannot sum u8 tensors (masks); cast them first");
}

int64_t sum_of(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

int64_t max_of(const std::vector<int64_t>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// ---- views and buffer layouts ----

Shape with_dim(Shape s, int64_t dim, int64_t len) {
  s[dim] = len;
  return s;
}

// Elements [start, start + len) of dim, as a raw view.
Tensor narrow_view(const Tensor& t, int64_t dim, int64_t start, int64_t len) {
  return t.as_strided(with_dim(t.shape(), dim, len), t.strides(),
                      t.offset() + start * t.strides()[dim]);
}

// A contiguous block of `shape` starting `at` elements into a 1-D contiguous buffer.
Tensor block_view(const Tensor& buffer, const Shape& shape, int64_t at) {
  return buffer.as_strided(shape, contiguous_strides(shape), buffer.offset() + at);
}

// Where each rank's block sits in a 1-D exchange buffer: exact sizes back to back (grouped), or
// every block in a slot the size of the largest block anywhere (padded).
BlockLayout make_layout(CollectiveMethod method, const std::vector<int64_t>& numels, int64_t slot) {
  return method == CollectiveMethod::Padded ? BlockLayout::slots(numels.size(), slot)
                                            : BlockLayout::packed(numels);
}

Tensor new_buffer(int64_t numel, const Tensor& like, bool zeroed) {
  Tensor b =
      Tensor::empty({numel}, TensorOptions{}.with_dtype(like.dtype()).with_device(like.device()));
  if (zeroed) b.zero_();  // padding travels too: never send uninitialised bytes
  return b;
}

// Copies blocks[r] to its place in a new buffer laid out by `l`.
Tensor pack(const std::vector<Tensor>& blocks, const BlockLayout& l, const Tensor& like,
            bool padded) {
  Tensor buf = new_buffer(l.total(), like, padded);
  for (size_t r = 0; r < blocks.size(); ++r)
    block_view(buf, blocks[r].shape(), l.displs[r]).copy_from(blocks[r]);  // on any device
  return buf;
}

// ---- statistics ----

CollectiveStats g_stats;
thread_local int g_depth = 0;

// Times the outermost collective of a call chain into g_stats.
class Timed {
 public:
  Timed(CollectiveStat kind, double bytes) : kind_(static_cast<int>(kind)), outer_(g_depth++ == 0) {
    if (outer_) {
      start_ = std::chrono::steady_clock::now();
      g_stats.bytes[kind_] += bytes;
      if (timeline::recording())
        span_.emplace("collective", collective_stat_name(kind),
                      std::to_string(static_cast<int64_t>(bytes)) + " bytes");
    }
  }
  ~Timed() {
    --g_depth;
    if (!outer_) return;
    g_stats.calls[kind_] += 1;
    g_stats.seconds[kind_] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  int kind_;
  bool outer_;
  std::chrono::steady_clock::time_point start_;
  std::optional<timeline::Scope> span_;  // in --trace timelines
};

double tensor_bytes(const Tensor& x) {
  return x.defined() ? static_cast<double>(x.numel()) * static_cast<double>(dtype_size(x.dtype()))
                     : 0;
}

}  // namespace

// x_local: [..., lengths[rank], ...] -> out: [..., sum(lengths), ...]
Tensor all_gather(const Communicator& comm, const Tensor& x_local, int64_t dim,
                  const std::vector<int64_t>& lengths, CollectiveMethod method) {
  const char* op = "all_gather";
  check_method(comm, method, op, true);
  check_tensor(comm, x_local, op);
  check_lengths(comm, lengths, op);
  dim = check_dim(x_local, dim, op);
  const int me = comm.rank();
  HAP_CHECK(x_local.size(dim) == lengths[me], op, ": rank ", me, "'s shard ", x_local.str(),
            " has size ", x_local.size(dim), " in dim ", dim, " but its shard length is ",
            lengths[me], " (lengths ", lengths_str(lengths), ")");

  const Shape& local = x_local.shape();
  const int64_t row_elems = shape_numel(with_dim(local, dim, 1));  // elements per index of dim
  const Timed timed(CollectiveStat::AllGather,
                    static_cast<double>(row_elems * sum_of(lengths) *
                                        static_cast<int64_t>(dtype_size(x_local.dtype()))));
  std::vector<int64_t> numels;
  numels.reserve(lengths.size());
  for (int64_t len : lengths) numels.push_back(len * row_elems);
  const int64_t slot = max_of(lengths) * row_elems;
  const BlockLayout l = make_layout(method, numels, slot);
  const bool padded = method == CollectiveMethod::Padded;

  Tensor out =
      Tensor::empty(with_dim(local, dim, sum_of(lengths)),
                    TensorOptions{}.with_dtype(x_local.dtype()).with_device(x_local.device()));
  const bool leading = shape_numel(Shape(local.begin(), local.begin() + dim)) == 1;
  Tensor send =
      padded ? pack({x_local}, BlockLayout::slots(1, slot), x_local, true) : x_local.contiguous();
  if (!padded && leading) {
    // Shards along the outermost non-trivial dim are consecutive in the output: gather in place.
    start_all_gather(comm, method, send, out, l)->wait();
    return out;
  }
  Tensor recv = new_buffer(l.total(), x_local, false);
  start_all_gather(comm, method, send, recv, l)->wait();
  const std::vector<int64_t> offsets = shard_offsets(lengths);
  for (size_t r = 0; r < lengths.size(); ++r)
    narrow_view(out, dim, offsets[r], lengths[r])
        .copy_from(block_view(recv, with_dim(local, dim, lengths[r]), l.displs[r]));
  return out;
}

// x_partial: [..., sum(lengths), ...] -> out: [..., lengths[rank], ...]
Tensor reduce_scatter(const Communicator& comm, const Tensor& x_partial, int64_t dim,
                      const std::vector<int64_t>& lengths, CollectiveMethod method) {
  const char* op = "reduce_scatter";
  check_method(comm, method, op, true);
  check_tensor(comm, x_partial, op);
  const Timed timed(CollectiveStat::ReduceScatter, tensor_bytes(x_partial));
  check_reducible(x_partial.dtype(), op);
  check_lengths(comm, lengths, op);
  dim = check_dim(x_partial, dim, op);
  HAP_CHECK(x_partial.size(dim) == sum_of(lengths), op, ": tensor ", x_partial.str(), " has size ",
            x_partial.size(dim), " in dim ", dim, " but the shard lengths ", lengths_str(lengths),
            " sum to ", sum_of(lengths));
  const int me = comm.rank();
  const Shape& full = x_partial.shape();
  const int64_t row_elems = shape_numel(with_dim(full, dim, 1));
  const bool padded = method == CollectiveMethod::Padded;

  std::vector<int64_t> numels;
  for (int64_t len : lengths) numels.push_back(len * row_elems);
  const BlockLayout l = make_layout(method, numels, max_of(lengths) * row_elems);

  const bool leading = shape_numel(Shape(full.begin(), full.begin() + dim)) == 1;
  Tensor send;
  if (!padded && leading) {
    send = x_partial.contiguous();  // blocks for ranks 0, 1, ... are already back to back
  } else {
    const std::vector<int64_t> offsets = shard_offsets(lengths);
    std::vector<Tensor> blocks;
    for (size_t r = 0; r < lengths.size(); ++r)
      blocks.push_back(narrow_view(x_partial, dim, offsets[r], lengths[r]));
    send = pack(blocks, l, x_partial, padded);
  }
  // The backend sums this rank's block (its slot, when padded) over ranks.
  Tensor mine = new_buffer(l.counts[me], x_partial, false);
  start_reduce_scatter(comm, method, send, l, mine)->wait();
  const Shape out_shape = with_dim(full, dim, lengths[me]);
  Tensor out = mine.as_strided(out_shape, contiguous_strides(out_shape), mine.offset());
  return padded ? out.clone() : out;
}

namespace {

// The block layout of a collective over several tensors: rank r's block holds its rows of every
// tensor in turn. Returns the layout and, per rank and tensor, where that piece starts in its
// block.
BlockLayout many_layout(const Communicator& comm, const std::vector<Shape>& wholes,
                        const std::vector<ShardOf>& shards, CollectiveMethod method,
                        std::vector<std::vector<int64_t>>* at, const char* op) {
  HAP_CHECK(wholes.size() == shards.size(), op, ": ", wholes.size(), " tensors but ", shards.size(),
            " shard specs");
  check_method(comm, method, op, true);
  const size_t P = static_cast<size_t>(comm.size());
  std::vector<int64_t> numels(P, 0);
  at->assign(P, std::vector<int64_t>(wholes.size(), 0));
  for (size_t k = 0; k < wholes.size(); ++k) {
    const ShardOf& s = shards[k];
    check_lengths(comm, s.lengths, op);
    HAP_CHECK(s.dim >= 0 && s.dim < static_cast<int64_t>(wholes[k].size()), op, ": tensor ", k,
              " of shape ", shape_str(wholes[k]), " has no dim ", s.dim);
    HAP_CHECK(wholes[k][s.dim] == sum_of(s.lengths), op, ": tensor ", k, " has size ",
              wholes[k][s.dim], " in dim ", s.dim, " but the shard lengths ",
              lengths_str(s.lengths), " sum to ", sum_of(s.lengths));
    const int64_t row = shape_numel(with_dim(wholes[k], s.dim, 1));
    for (size_t r = 0; r < P; ++r) {
      (*at)[r][k] = numels[r];
      numels[r] += s.lengths[r] * row;
    }
  }
  return make_layout(method, numels, max_of(numels));
}

}  // namespace

ManyGather pack_all_gather_many(const Communicator& comm, const std::vector<Tensor>& locals,
                                const std::vector<ShardOf>& shards, CollectiveMethod method) {
  const char* op = "all_gather_many";
  HAP_CHECK(!locals.empty(), op, ": no tensors");
  const int me = comm.rank();
  ManyGather m;
  for (size_t k = 0; k < locals.size(); ++k) {
    check_tensor(comm, locals[k], op);
    HAP_CHECK(locals[k].dtype() == locals[0].dtype(), op, ": tensor ", k, " is ",
              dtype_name(locals[k].dtype()), ", tensor 0 ", dtype_name(locals[0].dtype()));
    HAP_CHECK(k < shards.size() && shards[k].dim >= 0 && shards[k].dim < locals[k].dim() &&
                  static_cast<int>(shards[k].lengths.size()) == comm.size() &&
                  locals[k].size(shards[k].dim) == shards[k].lengths[me],
              op, ": rank ", me, "'s shard ", k, " ", locals[k].str(),
              " does not match its shard spec");
    m.wholes.push_back(with_dim(locals[k].shape(), shards[k].dim, sum_of(shards[k].lengths)));
    m.bytes += static_cast<double>(shape_numel(m.wholes.back())) * dtype_size(locals[k].dtype());
  }
  m.shards = shards;
  m.layout = many_layout(comm, m.wholes, shards, method, &m.at, op);
  const bool padded = method == CollectiveMethod::Padded;
  m.send = new_buffer(padded ? m.layout.counts[0] : m.layout.counts[me], locals[0], padded);
  for (size_t k = 0; k < locals.size(); ++k)
    block_view(m.send, locals[k].shape(), m.at[me][k]).copy_from(locals[k]);
  m.recv = new_buffer(m.layout.total(), locals[0], false);
  return m;
}

std::vector<Tensor> unpack_all_gather_many(const ManyGather& m) {
  std::vector<Tensor> out;
  for (size_t k = 0; k < m.wholes.size(); ++k) {
    Tensor whole = Tensor::empty(
        m.wholes[k], TensorOptions{}.with_dtype(m.recv.dtype()).with_device(m.recv.device()));
    const ShardOf& s = m.shards[k];
    const std::vector<int64_t> offsets = shard_offsets(s.lengths);
    for (size_t r = 0; r < offsets.size(); ++r)
      narrow_view(whole, s.dim, offsets[r], s.lengths[r])
          .copy_from(block_view(m.recv, with_dim(m.wholes[k], s.dim, s.lengths[r]),
                                m.layout.displs[r] + m.at[r][k]));
    out.push_back(std::move(whole));
  }
  return out;
}

std::vector<Tensor> all_gather_many(const Communicator& comm, const std::vector<Tensor>& locals,
                                    const std::vector<ShardOf>& shards, CollectiveMethod method) {
  if (locals.empty()) return {};
  ManyGather m = pack_all_gather_many(comm, locals, shards, method);
  const Timed timed(CollectiveStat::AllGather, m.bytes);
  start_all_gather(comm, method, m.send, m.recv, m.layout)->wait();
  return unpack_all_gather_many(m);
}

ManyScatter pack_reduce_scatter_many(const Communicator& comm, const std::vector<Tensor>& partials,
                                     const std::vector<ShardOf>& shards, CollectiveMethod method) {
  const char* op = "reduce_scatter_many";
  HAP_CHECK(!partials.empty(), op, ": no tensors");
  std::vector<Shape> wholes;
  for (size_t k = 0; k < partials.size(); ++k) {
    check_tensor(comm, partials[k], op);
    check_reducible(partials[k].dtype(), op);
    HAP_CHECK(partials[k].dtype() == partials[0].dtype(), op, ": tensor ", k, " is ",
              dtype_name(partials[k].dtype()), ", tensor 0 ", dtype_name(partials[0].dtype()));
    wholes.push_back(partials[k].shape());
  }
  ManyScatter m;
  std::vector<std::vector<int64_t>> at;
  m.layout = many_layout(comm, wholes, shards, method, &at, op);
  const bool padded = method == CollectiveMethod::Padded;
  m.send = new_buffer(m.layout.total(), partials[0], padded);
  for (size_t k = 0; k < partials.size(); ++k) {
    const std::vector<int64_t> offsets = shard_offsets(shards[k].lengths);
    for (size_t r = 0; r < offsets.size(); ++r) {
      const Shape piece = with_dim(wholes[k], shards[k].dim, shards[k].lengths[r]);
      block_view(m.send, piece, m.layout.displs[r] + at[r][k])
          .copy_from(narrow_view(partials[k], shards[k].dim, offsets[r], shards[k].lengths[r]));
    }
    m.local_shapes.push_back(with_dim(wholes[k], shards[k].dim, shards[k].lengths[comm.rank()]));
  }
  m.recv = new_buffer(m.layout.counts[comm.rank()], partials[0], false);
  return m;
}

std::vector<Tensor> unpack_reduce_scatter_many(const ManyScatter& m) {
  std::vector<Tensor> out;
  int64_t at = 0;
  for (const Shape& s : m.local_shapes) {
    out.push_back(block_view(m.recv, s, at).clone());
    at += shape_numel(s);
  }
  return out;
}

std::unique_ptr<PendingCollective> start_all_gather(const Communicator& comm,
                                                    CollectiveMethod method, const Tensor& send,
                                                    const Tensor& recv, const BlockLayout& layout) {
  if (method == CollectiveMethod::Hierarchical) {
    HAP_CHECK(comm.node_groups() != nullptr, "all_gather",
              ": the hierarchical form needs the ranks' nodes (Communicator::with_node_groups)");
    return start_hierarchical_all_gather(comm.node_groups(), send, recv, layout);
  }
  return comm.backend().start_all_gather(send, recv, layout);
}

std::unique_ptr<PendingCollective> start_reduce_scatter(const Communicator& comm,
                                                        CollectiveMethod method, const Tensor& send,
                                                        const BlockLayout& layout,
                                                        const Tensor& recv) {
  if (method == CollectiveMethod::Hierarchical) {
    HAP_CHECK(comm.node_groups() != nullptr, "reduce_scatter",
              ": the hierarchical form needs the ranks' nodes (Communicator::with_node_groups)");
    return start_hierarchical_reduce_scatter(comm.node_groups(), send, layout, recv);
  }
  return comm.backend().start_reduce_scatter(send, layout, recv);
}

Tensor all_reduce(const Communicator& comm, const Tensor& x_partial, CollectiveMethod method) {
  // The backend's all-reduce moves even blocks: padded and grouped move the same bytes.
  // Hierarchical runs over the communicator's node groups (parallel/hierarchical.h).
  const char* op = "all_reduce";
  HAP_CHECK(method != CollectiveMethod::Hierarchical || comm.node_groups() != nullptr, op,
            ": the hierarchical form needs the ranks' nodes (Communicator::with_node_groups)");
  check_tensor(comm, x_partial, op);
  const Timed timed(CollectiveStat::AllReduce, tensor_bytes(x_partial));
  check_reducible(x_partial.dtype(), op);
  Tensor in = x_partial.contiguous();
  Tensor out =
      Tensor::empty(x_partial.shape(),
                    TensorOptions{}.with_dtype(x_partial.dtype()).with_device(x_partial.device()));
  if (method == CollectiveMethod::Hierarchical)
    hierarchical_all_reduce(comm.node_groups(), in, out);
  else
    comm.backend().all_reduce(in, out);
  return out;
}

// x_local: Sharded(concat_dim), full in split_dim -> Sharded(split_dim), full in concat_dim.
Tensor all_to_all(const Communicator& comm, const Tensor& x_local, int64_t split_dim,
                  int64_t concat_dim, const std::vector<int64_t>& lengths_split,
                  const std::vector<int64_t>& lengths_concat, CollectiveMethod method) {
  const char* op = "all_to_all";
  check_method(comm, method, op, false);
  check_tensor(comm, x_local, op);
  const Timed timed(CollectiveStat::AllToAll, tensor_bytes(x_local));
  check_lengths(comm, lengths_split, op);
  check_lengths(comm, lengths_concat, op);
  split_dim = check_dim(x_local, split_dim, op);
  concat_dim = check_dim(x_local, concat_dim, op);
  HAP_CHECK(split_dim != concat_dim, op, ": split dim and concat dim are both ", split_dim,
            " (re-sharding one dim to new lengths is not an all-to-all)");
  const int me = comm.rank();
  const Shape& local = x_local.shape();
  HAP_CHECK(local[concat_dim] == lengths_concat[me], op, ": rank ", me, "'s shard ", x_local.str(),
            " has size ", local[concat_dim], " in concat dim ", concat_dim,
            " but its shard length is ", lengths_concat[me], " (lengths ",
            lengths_str(lengths_concat), ")");
  HAP_CHECK(local[split_dim] == sum_of(lengths_split), op, ": rank ", me, "'s shard ",
            x_local.str(), " has size ", local[split_dim], " in split dim ", split_dim,
            " but the split lengths ", lengths_str(lengths_split), " sum to ",
            sum_of(lengths_split));

  Shape unit = with_dim(with_dim(local, split_dim, 1), concat_dim, 1);
  const int64_t rest = shape_numel(unit);
  const bool padded = method == CollectiveMethod::Padded;
  const int64_t slot = rest * max_of(lengths_split) * max_of(lengths_concat);

  std::vector<int64_t> send_numels, recv_numels;
  for (size_t r = 0; r < lengths_split.size(); ++r) {
    send_numels.push_back(rest * lengths_split[r] * lengths_concat[me]);
    recv_numels.push_back(rest * lengths_split[me] * lengths_concat[r]);
  }
  const BlockLayout sl = make_layout(method, send_numels, slot);
  const BlockLayout rl = make_layout(method, recv_numels, slot);

  const std::vector<int64_t> split_offsets = shard_offsets(lengths_split);
  std::vector<Tensor> blocks;
  for (size_t r = 0; r < lengths_split.size(); ++r)
    blocks.push_back(narrow_view(x_local, split_dim, split_offsets[r], lengths_split[r]));
  Tensor send = pack(blocks, sl, x_local, padded);
  Tensor recv = new_buffer(rl.total(), x_local, false);
  comm.backend().all_to_all(send, sl, recv, rl);

  Shape out_shape =
      with_dim(with_dim(local, split_dim, lengths_split[me]), concat_dim, sum_of(lengths_concat));
  Tensor out = Tensor::empty(
      out_shape, TensorOptions{}.with_dtype(x_local.dtype()).with_device(x_local.device()));
  const std::vector<int64_t> concat_offsets = shard_offsets(lengths_concat);
  for (size_t r = 0; r < lengths_concat.size(); ++r)
    narrow_view(out, concat_dim, concat_offsets[r], lengths_concat[r])
        .copy_from(
            block_view(recv, with_dim(out_shape, concat_dim, lengths_concat[r]), rl.displs[r]));
  return out;
}

Tensor broadcast(const Communicator& comm, const Tensor& x, int root) {
  const char* op = "broadcast";
  const Timed timed(CollectiveStat::Broadcast, tensor_bytes(x));
  HAP_CHECK(root >= 0 && root < comm.size(), op, ": root ", root, " out of range for ", comm.size(),
            " ranks");
  const bool is_root = comm.rank() == root;

  // Header: dtype, ndim, dims (or -1 if the root's tensor is unusable, so that every rank throws
  // instead of waiting). Lets non-roots pass nothing and catches mismatched shapes.
  std::vector<int64_t> header;
  std::string root_error;
  if (is_root) {
    try {
      check_tensor(comm, x, op);
      header = {static_cast<int64_t>(x.dtype()), x.dim()};
      header.insert(header.end(), x.shape().begin(), x.shape().end());
    } catch (const Error& e) {
      root_error = e.what();
      header = {-1, 0};
    }
  }
  Tensor header_len =
      Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(header.size())}, {1});
  comm.backend().broadcast(header_len, root);
  header.resize(static_cast<size_t>(header_len.item()));
  Tensor header_t = Tensor::from_vector(header, {static_cast<int64_t>(header.size())});
  comm.backend().broadcast(header_t, root);
  const int64_t* h = header_t.data<int64_t>();
  HAP_CHECK(h[0] >= 0, is_root ? root_error
                               : std::string(op) + ": the root rank " + std::to_string(root) +
                                     "'s tensor is unusable");
  const DType dtype = static_cast<DType>(h[0]);
  const Shape shape(h + 2, h + header_t.numel());

  const Device device = x.defined() ? x.device() : Device::cpu();  // where this rank wants it
  Tensor out = is_root
                   ? x.clone()
                   : Tensor::empty(shape, TensorOptions{}.with_dtype(dtype).with_device(device));
  comm.backend().broadcast(out, root);
  // Checked only after the transfer, so a rank with a mismatched tensor throws without leaving
  // the root blocked in the broadcast.
  if (!is_root && x.defined())
    HAP_CHECK(x.shape() == shape && x.dtype() == dtype, op, ": rank ", comm.rank(), " passed ",
              x.str(), " but root ", root, " broadcasts ", dtype_name(dtype), shape_str(shape));
  return out;
}

const char* collective_stat_name(CollectiveStat c) {
  switch (c) {
    case CollectiveStat::AllGather:
      return "all_gather";
    case CollectiveStat::ReduceScatter:
      return "reduce_scatter";
    case CollectiveStat::AllReduce:
      return "all_reduce";
    case CollectiveStat::AllToAll:
      return "all_to_all";
    case CollectiveStat::Broadcast:
      return "broadcast";
  }
  return "?";
}

const CollectiveStats& collective_stats() { return g_stats; }
void reset_collective_stats() { g_stats = CollectiveStats{}; }
void add_collective_stat(CollectiveStat kind, uint64_t calls, double bytes, double seconds) {
  const int k = static_cast<int>(kind);
  g_stats.calls[k] += calls;
  g_stats.bytes[k] += bytes;
  g_stats.seconds[k] += seconds;
}

}  // namespace hap::parallel
