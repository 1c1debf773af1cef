#include "parallel/collectives.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <numeric>
#include <type_traits>

#include "core/error.h"
#include "core/strided_copy.h"
#include "parallel/shard.h"

namespace hap::parallel {

const char* method_name(CollectiveMethod method) {
  switch (method) {
    case CollectiveMethod::Padded:
      return "padded";
    case CollectiveMethod::Grouped:
      return "grouped";
  }
  return "?";
}

namespace {

// ---- argument checks ----

void check_tensor(const Tensor& x, const char* op) {
  HAP_CHECK(x.defined(), op, ": got an undefined tensor");
  HAP_CHECK(x.device().is_cpu(), op, ": tensor ", x.str(),
            " is not on the CPU; the MPI collectives move CPU tensors (CUDA tensors go through "
            "the NCCL communicator)");
  HAP_CHECK(x.has_storage(), op, ": tensor ", x.str(), " has no storage (a traced tensor)");
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

int64_t check_dim(const Tensor& x, int64_t dim, const char* op) {
  HAP_CHECK(x.dim() >= 1, op, ": a 0-dim tensor (", x.str(), ") has no dim to shard");
  return wrap_dim(dim, x.dim(), op);
}

void check_reducible(DType dtype, const char* op) {
  HAP_CHECK(dtype != DType::U8, op, ": cannot sum u8 tensors (masks); cast them first");
}

int mpi_count(int64_t n, const char* op) {
  HAP_CHECK(n <= INT_MAX, op, ": a block of ", n, " elements exceeds MPI's int count limit (",
            INT_MAX, "); split the tensor");
  return static_cast<int>(n);
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
struct Layout {
  std::vector<int> counts;
  std::vector<int> displs;
  int64_t total = 0;
  int slot = 0;  // padded only: the equal count of the regular collective
};

Layout exact_layout(const std::vector<int64_t>& numels, const char* op) {
  Layout l;
  for (int64_t n : numels) {
    l.counts.push_back(mpi_count(n, op));
    l.displs.push_back(mpi_count(l.total, op));
    l.total += n;
  }
  return l;
}

Layout padded_layout(size_t ranks, int64_t slot, const char* op) {
  Layout l;
  l.slot = mpi_count(slot, op);
  for (size_t r = 0; r < ranks; ++r) {
    l.counts.push_back(l.slot);
    l.displs.push_back(mpi_count(static_cast<int64_t>(r) * slot, op));
  }
  l.total = static_cast<int64_t>(ranks) * slot;
  return l;
}

Layout make_layout(CollectiveMethod method, const std::vector<int64_t>& numels, int64_t slot,
                   const char* op) {
  return method == CollectiveMethod::Padded ? padded_layout(numels.size(), slot, op)
                                            : exact_layout(numels, op);
}

Tensor new_buffer(int64_t numel, DType dtype, bool zeroed) {
  Tensor b = Tensor::empty({numel}, TensorOptions{}.with_dtype(dtype));
  if (zeroed) b.zero_();  // padding travels too: never send uninitialised bytes
  return b;
}

// Copies blocks[r] to its place in a new buffer laid out by `l`.
Tensor pack(const std::vector<Tensor>& blocks, const Layout& l, DType dtype, bool padded) {
  Tensor buf = new_buffer(l.total, dtype, padded);
  for (size_t r = 0; r < blocks.size(); ++r)
    strided_copy(block_view(buf, blocks[r].shape(), l.displs[r]), blocks[r]);
  return buf;
}

// out = block_0 + block_1 + ... in rank order, each block `out_shape`-sized at l.displs[r].
Tensor sum_blocks_in_rank_order(const Tensor& recv, const Layout& l, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape, TensorOptions{}.with_dtype(recv.dtype()));
  const int64_t n = out.numel();
  if (n == 0) return out;
  dispatch_all_types(recv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, uint8_t>) {
      using Acc = std::conditional_t<std::is_same_v<T, bf16>, float, T>;
      const T* in = recv.data<T>();
      T* o = out.data<T>();
      const size_t ranks = l.displs.size();
      // Each element's sum runs in rank order whatever the thread split: deterministic.
#pragma omp parallel for if (n * static_cast <int64_t>(ranks) > (int64_t{1} << 18))
      for (int64_t i = 0; i < n; ++i) {
        Acc acc = convert<Acc>(in[l.displs[0] + i]);
        for (size_t r = 1; r < ranks; ++r) acc = acc + convert<Acc>(in[l.displs[r] + i]);
        o[i] = convert<T>(acc);
      }
    }
  });
  return out;
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
};

double tensor_bytes(const Tensor& x) {
  return x.defined() ? static_cast<double>(x.numel()) * static_cast<double>(dtype_size(x.dtype()))
                     : 0;
}

// ---- the two exchange patterns ----

// Every rank's `send` block (send.numel() elements, or the slot when padded) lands in every
// rank's recv buffer at l.displs[source].
void exchange_allgather(const Communicator& comm, const Tensor& send, const Tensor& recv,
                        const Layout& l, CollectiveMethod method, const char* op) {
  MPI_Datatype type = mpi_datatype(send.dtype());
  if (method == CollectiveMethod::Padded) {
    HAP_MPI_RUN(MPI_Iallgather(send.raw_data(), l.slot, type, recv.raw_data(), l.slot, type,
                               comm.handle(), &hap_mpi_req_));
  } else {
    HAP_MPI_RUN(MPI_Iallgatherv(send.raw_data(), mpi_count(send.numel(), op), type, recv.raw_data(),
                                l.counts.data(), l.displs.data(), type, comm.handle(),
                                &hap_mpi_req_));
  }
}

// Block r of `send` (laid out by `sl`) goes to rank r; block s of `recv` (laid out by `rl`)
// comes from rank s.
void exchange_alltoall(const Communicator& comm, const Tensor& send, const Layout& sl,
                       const Tensor& recv, const Layout& rl, CollectiveMethod method) {
  MPI_Datatype type = mpi_datatype(send.dtype());
  if (method == CollectiveMethod::Padded) {
    HAP_ASSERT(sl.slot == rl.slot, "padded all-to-all with slots ", sl.slot, " and ", rl.slot);
    HAP_MPI_RUN(MPI_Ialltoall(send.raw_data(), sl.slot, type, recv.raw_data(), rl.slot, type,
                              comm.handle(), &hap_mpi_req_));
  } else {
    HAP_MPI_RUN(MPI_Ialltoallv(send.raw_data(), sl.counts.data(), sl.displs.data(), type,
                               recv.raw_data(), rl.counts.data(), rl.displs.data(), type,
                               comm.handle(), &hap_mpi_req_));
  }
}

}  // namespace

// x_local: [..., lengths[rank], ...] -> out: [..., sum(lengths), ...]
Tensor all_gather(const Communicator& comm, const Tensor& x_local, int64_t dim,
                  const std::vector<int64_t>& lengths, CollectiveMethod method) {
  const char* op = "all_gather";
  check_tensor(x_local, op);
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
  const Layout l = make_layout(method, numels, max_of(lengths) * row_elems, op);
  const bool padded = method == CollectiveMethod::Padded;

  Tensor out = Tensor::empty(with_dim(local, dim, sum_of(lengths)),
                             TensorOptions{}.with_dtype(x_local.dtype()));
  const bool leading = shape_numel(Shape(local.begin(), local.begin() + dim)) == 1;
  Tensor send = padded ? pack({x_local}, padded_layout(1, l.slot, op), x_local.dtype(), true)
                       : x_local.contiguous();
  if (!padded && leading) {
    // Shards along the outermost non-trivial dim are consecutive in the output: gather in place.
    exchange_allgather(comm, send, out, l, method, op);
    return out;
  }
  Tensor recv = new_buffer(l.total, x_local.dtype(), false);
  exchange_allgather(comm, send, recv, l, method, op);
  const std::vector<int64_t> offsets = shard_offsets(lengths);
  for (size_t r = 0; r < lengths.size(); ++r)
    strided_copy(narrow_view(out, dim, offsets[r], lengths[r]),
                 block_view(recv, with_dim(local, dim, lengths[r]), l.displs[r]));
  return out;
}

// x_partial: [..., sum(lengths), ...] -> out: [..., lengths[rank], ...]
Tensor reduce_scatter(const Communicator& comm, const Tensor& x_partial, int64_t dim,
                      const std::vector<int64_t>& lengths, CollectiveMethod method) {
  const char* op = "reduce_scatter";
  check_tensor(x_partial, op);
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
  const int64_t slot = max_of(lengths) * row_elems;

  std::vector<int64_t> send_numels, recv_numels;
  for (int64_t len : lengths) {
    send_numels.push_back(len * row_elems);
    recv_numels.push_back(lengths[me] * row_elems);
  }
  const Layout sl = make_layout(method, send_numels, slot, op);
  const Layout rl = make_layout(method, recv_numels, slot, op);

  const bool leading = shape_numel(Shape(full.begin(), full.begin() + dim)) == 1;
  Tensor send;
  if (!padded && leading) {
    send = x_partial.contiguous();  // blocks for ranks 0, 1, ... are already back to back
  } else {
    const std::vector<int64_t> offsets = shard_offsets(lengths);
    std::vector<Tensor> blocks;
    for (size_t r = 0; r < lengths.size(); ++r)
      blocks.push_back(narrow_view(x_partial, dim, offsets[r], lengths[r]));
    send = pack(blocks, sl, x_partial.dtype(), padded);
  }
  Tensor recv = new_buffer(rl.total, x_partial.dtype(), false);
  exchange_alltoall(comm, send, sl, recv, rl, method);
  return sum_blocks_in_rank_order(recv, rl, with_dim(full, dim, lengths[me]));
}

Tensor all_reduce(const Communicator& comm, const Tensor& x_partial, CollectiveMethod method) {
  const char* op = "all_reduce";
  check_tensor(x_partial, op);
  const Timed timed(CollectiveStat::AllReduce, tensor_bytes(x_partial));
  check_reducible(x_partial.dtype(), op);
  const Shape& shape = x_partial.shape();
  const int64_t n = x_partial.numel();
  Tensor flat = x_partial.contiguous();
  flat = flat.as_strided({n}, {1}, flat.offset());
  const std::vector<int64_t> lengths = shard_lengths(n, even_ratios(comm.size()));
  Tensor mine = reduce_scatter(comm, flat, 0, lengths, method);
  Tensor full = all_gather(comm, mine, 0, lengths, method);
  return full.as_strided(shape, contiguous_strides(shape), full.offset());
}

// x_local: Sharded(concat_dim), full in split_dim -> Sharded(split_dim), full in concat_dim.
Tensor all_to_all(const Communicator& comm, const Tensor& x_local, int64_t split_dim,
                  int64_t concat_dim, const std::vector<int64_t>& lengths_split,
                  const std::vector<int64_t>& lengths_concat, CollectiveMethod method) {
  const char* op = "all_to_all";
  check_tensor(x_local, op);
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
  const Layout sl = make_layout(method, send_numels, slot, op);
  const Layout rl = make_layout(method, recv_numels, slot, op);

  const std::vector<int64_t> split_offsets = shard_offsets(lengths_split);
  std::vector<Tensor> blocks;
  for (size_t r = 0; r < lengths_split.size(); ++r)
    blocks.push_back(narrow_view(x_local, split_dim, split_offsets[r], lengths_split[r]));
  Tensor send = pack(blocks, sl, x_local.dtype(), padded);
  Tensor recv = new_buffer(rl.total, x_local.dtype(), false);
  exchange_alltoall(comm, send, sl, recv, rl, method);

  Shape out_shape =
      with_dim(with_dim(local, split_dim, lengths_split[me]), concat_dim, sum_of(lengths_concat));
  Tensor out = Tensor::empty(out_shape, TensorOptions{}.with_dtype(x_local.dtype()));
  const std::vector<int64_t> concat_offsets = shard_offsets(lengths_concat);
  for (size_t r = 0; r < lengths_concat.size(); ++r)
    strided_copy(
        narrow_view(out, concat_dim, concat_offsets[r], lengths_concat[r]),
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
      check_tensor(x, op);
      header = {static_cast<int64_t>(x.dtype()), x.dim()};
      header.insert(header.end(), x.shape().begin(), x.shape().end());
    } catch (const Error& e) {
      root_error = e.what();
      header = {-1, 0};
    }
  }
  int64_t header_len = static_cast<int64_t>(header.size());
  HAP_MPI_RUN(MPI_Ibcast(&header_len, 1, MPI_INT64_T, root, comm.handle(), &hap_mpi_req_));
  header.resize(static_cast<size_t>(header_len));
  HAP_MPI_RUN(MPI_Ibcast(header.data(), mpi_count(header_len, op), MPI_INT64_T, root, comm.handle(),
                         &hap_mpi_req_));
  HAP_CHECK(header[0] >= 0, is_root ? root_error
                                    : std::string(op) + ": the root rank " + std::to_string(root) +
                                          "'s tensor is unusable");
  const DType dtype = static_cast<DType>(header[0]);
  const Shape shape(header.begin() + 2, header.end());

  Tensor out = is_root ? x.clone() : Tensor::empty(shape, TensorOptions{}.with_dtype(dtype));
  HAP_MPI_RUN(MPI_Ibcast(out.raw_data(), mpi_count(out.numel(), op), mpi_datatype(dtype), root,
                         comm.handle(), &hap_mpi_req_));
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

}  // namespace hap::parallel
