#include "parallel/mpi.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/strided_copy.h"
#include "core/tensor.h"
#include "core/timeline.h"

namespace hap::parallel {

namespace detail {

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
    std::snprintf(text, sizeof text, "code %d", code);
  std::ostringstream os;
  os << "MPI error in " << call << " at " << file << ":" << line << ": " << text;
  throw MpiError(os.str());
}

}  // namespace detail

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return MPI_FLOAT;
    case DType::F64:
      return MPI_DOUBLE;
    case DType::BF16:
      return MPI_UINT16_T;
    case DType::I64:
      return MPI_INT64_T;
    case DType::U8:
      return MPI_UINT8_T;
  }
  HAP_ASSERT(false, "unknown dtype");
  return MPI_DATATYPE_NULL;
}

// ---- MpiSession ----

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialised = 0;
  HAP_MPI_CHECK(MPI_Initialized(&initialised));
  if (initialised) return;
  int provided = 0;
  HAP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  owns_ = true;
  HAP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  if (provided < MPI_THREAD_FUNNELED) {
    MPI_Finalize();
    owns_ = false;
    HAP_CHECK(false, "MPI provides thread level ", provided, " but HAP needs MPI_THREAD_FUNNELED (",
              MPI_THREAD_FUNNELED, ")");
  }
}

MpiSession::~MpiSession() {
  if (owns_ && active()) MPI_Finalize();
}

bool MpiSession::active() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}

int launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == 0) continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    if (*end == 0 && r >= 0 && r <= INT32_MAX) return static_cast<int>(r);
  }
  return -1;
}

// ---- waiting ----

namespace {
WaitPolicy policy_from_env() {
  const char* v = std::getenv("HAP_COMM_WAIT");
  if (v == nullptr || *v == 0 || std::strcmp(v, "spin") == 0) return WaitPolicy::Spin;
  if (std::strcmp(v, "sleep") == 0) return WaitPolicy::Sleep;
  HAP_CHECK(false, "HAP_COMM_WAIT='", v, "': expected spin or sleep");
}
std::atomic<int> g_wait_policy{-1};
}  // namespace

WaitPolicy wait_policy() {
  int p = g_wait_policy.load();
  if (p < 0) {
    p = static_cast<int>(policy_from_env());
    g_wait_policy.store(p);
  }
  return static_cast<WaitPolicy>(p);
}

void set_wait_policy(WaitPolicy policy) { g_wait_policy.store(static_cast<int>(policy)); }

namespace {
std::atomic<double> g_collective_timeout{0.0};
std::string format_seconds(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}
std::atomic<std::int64_t> g_current_step{-1};
}  // namespace

void set_collective_timeout(double seconds) { g_collective_timeout.store(seconds); }
double collective_timeout() { return g_collective_timeout.load(); }
void set_current_step(std::int64_t step) { g_current_step.store(step); }

void wait_until(const std::function<bool()>& done, const std::string& what) {
  const double timeout = g_collective_timeout.load();
  const bool sleep = wait_policy() == WaitPolicy::Sleep;
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  for (int64_t polls = 0;; ++polls) {
    if (done()) return;
    if (sleep) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(100));
    }
    if (timeout > 0 && polls % 256 == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout) {
      const std::int64_t step = g_current_step.load();
      int rank = -1, initialized = 0;
      MPI_Initialized(&initialized);
      if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      throw CollectiveTimeout(
          what + (rank >= 0 ? " on rank " + std::to_string(rank) : std::string()) +
          " did not complete within parallel.collective_timeout_s = " + format_seconds(timeout) +
          (step >= 0 ? " at step " + std::to_string(step) : std::string()) +
          ": another rank is stopped, hung or dead (or the timeout is too short for this step)");
    }
  }
}

void complete(MPI_Request& request, const char* call) {
  std::optional<timeline::Scope> span;  // time blocked on the other ranks, in --trace timelines
  const std::string name(call, std::strcspn(call, "("));  // "MPI_Iallgather"
  if (timeline::recording()) span.emplace("wait", name);
  int rc = MPI_SUCCESS;
  if (wait_policy() == WaitPolicy::Spin && g_collective_timeout.load() <= 0) {
    rc = MPI_Wait(&request, MPI_STATUS_IGNORE);
  } else {
    wait_until(
        [&] {
          int done = 0;
          rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
          return rc != MPI_SUCCESS || done != 0;
        },
        name);
  }
  if (rc != MPI_SUCCESS) detail::throw_mpi_error(rc, call, __FILE__, __LINE__);
}

// ---- the MPI backend ----

namespace {

int mpi_count(int64_t n, const char* op) {
  HAP_CHECK(n >= 0 && n <= INT_MAX, op, ": a block of ", n,
            " elements exceeds MPI's int count limit (", INT_MAX, "); split the tensor");
  return static_cast<int>(n);
}

std::vector<int> mpi_counts(const std::vector<int64_t>& v, const char* op) {
  std::vector<int> out;
  out.reserve(v.size());
  for (int64_t x : v) out.push_back(mpi_count(x, op));
  return out;
}

void check_buffer(const Tensor& t, const char* op) {
  HAP_CHECK(t.defined() && t.has_storage(), op, ": got an undefined or shape-only tensor");
  HAP_CHECK(t.device().is_cpu(), op, ": tensor ", t.str(),
            " is not on the CPU; the MPI backend moves CPU tensors");
  HAP_CHECK(t.is_contiguous(), op, ": tensor ", t.str(), " is not contiguous");
}

void check_layout(const BlockLayout& l, int size, const Tensor& buffer, const char* op) {
  HAP_CHECK(static_cast<int>(l.counts.size()) == size && l.displs.size() == l.counts.size(), op,
            ": a block layout needs one block per rank (", size, "), got ", l.counts.size());
  HAP_CHECK(l.total() <= buffer.numel(), op, ": the block layout spans ", l.total(),
            " elements but the buffer has ", buffer.numel());
}

void check_reducible(DType dtype, const char* op) {
  HAP_CHECK(dtype != DType::U8, op, ": cannot sum u8 tensors (masks); cast them first");
}

void check_all_gather(const Tensor& in, const Tensor& out, const BlockLayout& layout, int rank,
                      int size) {
  const char* op = "all_gather";
  check_buffer(in, op);
  check_buffer(out, op);
  check_layout(layout, size, out, op);
  HAP_CHECK(in.numel() >= layout.counts[rank], op, ": rank ", rank, " sends ", layout.counts[rank],
            " elements from a tensor of ", in.numel());
}

// out = block_0 + block_1 + ... in rank order, block r being `n` elements at displs[r] of `recv`.
void sum_in_rank_order(const Tensor& recv, const std::vector<int64_t>& displs, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_all_types(recv.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, uint8_t>) {
      using Acc = std::conditional_t<std::is_same_v<T, bf16>, float, T>;
      const T* in = static_cast<const T*>(recv.raw_data());
      T* o = static_cast<T*>(out.raw_data());
      const size_t ranks = displs.size();
      // Each element's sum runs in rank order whatever the thread split: deterministic.
#pragma omp parallel for if (n * static_cast <int64_t>(ranks) > (int64_t{1} << 18))
      for (int64_t i = 0; i < n; ++i) {
        Acc acc = convert<Acc>(in[displs[0] + i]);
        for (size_t r = 1; r < ranks; ++r) acc = acc + convert<Acc>(in[displs[r] + i]);
        o[i] = convert<T>(acc);
      }
    }
  });
}

}  // namespace

int64_t BlockLayout::total() const {
  int64_t t = 0;
  for (size_t r = 0; r < counts.size(); ++r) t = std::max(t, displs[r] + counts[r]);
  return t;
}

bool BlockLayout::regular() const {
  for (size_t r = 0; r < counts.size(); ++r)
    if (counts[r] != counts[0] || displs[r] != static_cast<int64_t>(r) * counts[0]) return false;
  return true;
}

BlockLayout BlockLayout::packed(const std::vector<int64_t>& counts) {
  BlockLayout l;
  l.counts = counts;
  int64_t at = 0;
  for (int64_t c : counts) {
    l.displs.push_back(at);
    at += c;
  }
  return l;
}

BlockLayout BlockLayout::slots(size_t ranks, int64_t slot) {
  return packed(std::vector<int64_t>(ranks, slot));
}

MpiBackend::MpiBackend(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  // Also when someone else initialised MPI: errors must reach HAP_MPI_CHECK.
  HAP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  HAP_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  HAP_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiBackend::~MpiBackend() {
  if (owned_ && comm_ != MPI_COMM_NULL && MpiSession::active()) MPI_Comm_free(&comm_);
}

std::shared_ptr<MpiBackend> MpiBackend::world() {
  HAP_CHECK(MpiSession::active(),
            "MPI is not initialised: create a hap::parallel::MpiSession in main() before using "
            "communicators");
  static std::shared_ptr<MpiBackend> w = std::make_shared<MpiBackend>(MPI_COMM_WORLD, false);
  return w;
}

std::shared_ptr<Backend> MpiBackend::split(int colour, int key) {
  MPI_Comm out = MPI_COMM_NULL;
  HAP_MPI_CHECK(MPI_Comm_split(comm_, colour < 0 ? MPI_UNDEFINED : colour, key, &out));
  if (out == MPI_COMM_NULL) return nullptr;
  return std::make_shared<MpiBackend>(out, true);
}

std::shared_ptr<Backend> MpiBackend::split_by_node() {
  MPI_Comm out = MPI_COMM_NULL;
  HAP_MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out));
  return std::make_shared<MpiBackend>(out, true);
}

void MpiBackend::barrier() { HAP_MPI_RUN(MPI_Ibarrier(comm_, &hap_mpi_req_)); }

void MpiBackend::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (MpiSession::active()) MPI_Abort(comm_, code);
  std::_Exit(code);  // MPI_Abort does not return; if MPI is gone, still end this rank
}

void MpiBackend::send(const Tensor& t, int peer) {
  check_buffer(t, "send");
  HAP_MPI_RUN(MPI_Isend(t.raw_data(), mpi_count(t.numel(), "send"), mpi_datatype(t.dtype()), peer,
                        0, comm_, &hap_mpi_req_));
}

void MpiBackend::recv(const Tensor& t, int peer) {
  check_buffer(t, "recv");
  HAP_MPI_RUN(MPI_Irecv(t.raw_data(), mpi_count(t.numel(), "recv"), mpi_datatype(t.dtype()), peer,
                        0, comm_, &hap_mpi_req_));
}

void MpiBackend::broadcast(const Tensor& t, int root) {
  check_buffer(t, "broadcast");
  HAP_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " out of range for ", size_,
            " ranks");
  // Chunks keep every count within MPI's int range.
  constexpr int64_t kChunk = int64_t{1} << 30;
  const int64_t n = t.numel();
  const size_t elem = dtype_size(t.dtype());
  for (int64_t at = 0; at < n; at += kChunk)
    HAP_MPI_RUN(MPI_Ibcast(static_cast<char*>(t.raw_data()) + at * static_cast<int64_t>(elem),
                           static_cast<int>(std::min(kChunk, n - at)), mpi_datatype(t.dtype()),
                           root, comm_, &hap_mpi_req_));
}

void MpiBackend::reduce(const Tensor& in, const Tensor& out, int root) {
  check_buffer(in, "reduce");
  check_reducible(in.dtype(), "reduce");
  HAP_CHECK(root >= 0 && root < size_, "reduce: root ", root, " out of range for ", size_,
            " ranks");
  const bool is_root = rank_ == root;
  if (is_root) {
    check_buffer(out, "reduce");
    HAP_CHECK(out.numel() == in.numel() && out.dtype() == in.dtype(), "reduce: out ", out.str(),
              " does not match in ", in.str());
  }
  const int64_t n = in.numel();
  Tensor all =
      is_root ? Tensor::empty({n * size_}, TensorOptions{}.with_dtype(in.dtype())) : Tensor();
  const MPI_Datatype type = mpi_datatype(in.dtype());
  HAP_MPI_RUN(MPI_Igather(in.raw_data(), mpi_count(n, "reduce"), type,
                          is_root ? all.raw_data() : nullptr, mpi_count(n, "reduce"), type, root,
                          comm_, &hap_mpi_req_));
  if (is_root)
    sum_in_rank_order(all, BlockLayout::slots(static_cast<size_t>(size_), n).displs, out);
}

void MpiBackend::all_gather(const Tensor& in, const Tensor& out, const BlockLayout& layout) {
  const char* op = "all_gather";
  check_all_gather(in, out, layout, rank_, size_);
  const MPI_Datatype type = mpi_datatype(in.dtype());
  if (layout.regular()) {
    const int count = mpi_count(layout.counts[0], op);
    HAP_MPI_RUN(MPI_Iallgather(in.raw_data(), count, type, out.raw_data(), count, type, comm_,
                               &hap_mpi_req_));
    return;
  }
  const std::vector<int> counts = mpi_counts(layout.counts, op),
                         displs = mpi_counts(layout.displs, op);
  HAP_MPI_RUN(MPI_Iallgatherv(in.raw_data(), counts[rank_], type, out.raw_data(), counts.data(),
                              displs.data(), type, comm_, &hap_mpi_req_));
}

void MpiBackend::all_to_all(const Tensor& in, const BlockLayout& send, const Tensor& out,
                            const BlockLayout& recv) {
  const char* op = "all_to_all";
  check_buffer(in, op);
  check_buffer(out, op);
  check_layout(send, size_, in, op);
  check_layout(recv, size_, out, op);
  const MPI_Datatype type = mpi_datatype(in.dtype());
  if (send.regular() && recv.regular() && send.counts[0] == recv.counts[0]) {
    const int count = mpi_count(send.counts[0], op);
    HAP_MPI_RUN(MPI_Ialltoall(in.raw_data(), count, type, out.raw_data(), count, type, comm_,
                              &hap_mpi_req_));
    return;
  }
  const std::vector<int> sc = mpi_counts(send.counts, op), sd = mpi_counts(send.displs, op);
  const std::vector<int> rc = mpi_counts(recv.counts, op), rd = mpi_counts(recv.displs, op);
  HAP_MPI_RUN(MPI_Ialltoallv(in.raw_data(), sc.data(), sd.data(), type, out.raw_data(), rc.data(),
                             rd.data(), type, comm_, &hap_mpi_req_));
}

void MpiBackend::reduce_scatter(const Tensor& in, const BlockLayout& layout, const Tensor& out) {
  // Every addend of my block comes to me, then I add them up in rank order.
  start_reduce_scatter(in, layout, out)->wait();
}

void MpiBackend::all_reduce(const Tensor& in, const Tensor& out) {
  start_all_reduce(in, out)->wait();
}

}  // namespace hap::parallel

namespace hap::parallel {

namespace {

// One nonblocking MPI call and, once it has completed, a local step (`then`). Keeps the tensors
// and the count arrays the call reads alive until then (MPI may read them until it completes).
class MpiPendingCall final : public PendingCollective {
 public:
  MpiPendingCall(const char* call, std::vector<Tensor> keep, std::function<void()> then = {})
      : call_(call), keep_(std::move(keep)), then_(std::move(then)) {}
  ~MpiPendingCall() override {
    // MPI cannot cancel a started collective: its buffers must outlive it (this happens only on
    // an error path, where the job is ending).
    if (!done_) new std::vector<Tensor>(std::move(keep_));  // NOLINT: deliberately kept alive
  }

  MPI_Request* request() { return &request_; }
  std::vector<int>& ints(size_t i) { return ints_[i]; }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    HAP_MPI_CHECK(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
    if (!flag) return false;
    finish();
    return true;
  }

  void wait() override {
    if (done_) return;
    complete(request_, call_);
    finish();
  }

 private:
  void finish() {
    done_ = true;
    if (then_) then_();
  }

  const char* call_;
  std::vector<Tensor> keep_;
  std::function<void()> then_;
  std::array<std::vector<int>, 4> ints_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<PendingCollective> MpiBackend::start_reduce_scatter(const Tensor& in,
                                                                    const BlockLayout& layout,
                                                                    const Tensor& out) {
  const char* op = "reduce_scatter";
  check_buffer(in, op);
  check_buffer(out, op);
  check_reducible(in.dtype(), op);
  check_layout(layout, size_, in, op);
  const int64_t mine = layout.counts[rank_];
  HAP_CHECK(out.numel() == mine, op, ": rank ", rank_, "'s output has ", out.numel(),
            " elements, its block ", mine);
  // Every addend of my block comes to me, then I add them up in rank order.
  const BlockLayout recv = BlockLayout::slots(static_cast<size_t>(size_), mine);
  Tensor addends = Tensor::empty({recv.total()}, TensorOptions{}.with_dtype(in.dtype()));
  auto call = std::make_unique<MpiPendingCall>(
      "MPI_Ialltoallv(reduce_scatter)", std::vector<Tensor>{in, out, addends},
      [addends, displs = recv.displs, out] { sum_in_rank_order(addends, displs, out); });
  call->ints(0) = mpi_counts(layout.counts, op);
  call->ints(1) = mpi_counts(layout.displs, op);
  call->ints(2) = mpi_counts(recv.counts, op);
  call->ints(3) = mpi_counts(recv.displs, op);
  const MPI_Datatype type = mpi_datatype(in.dtype());
  HAP_MPI_CHECK(MPI_Ialltoallv(in.raw_data(), call->ints(0).data(), call->ints(1).data(), type,
                               addends.raw_data(), call->ints(2).data(), call->ints(3).data(), type,
                               comm_, call->request()));
  return call;
}

std::unique_ptr<PendingCollective> MpiBackend::start_all_gather(const Tensor& in, const Tensor& out,
                                                                const BlockLayout& layout) {
  const char* op = "all_gather";
  check_all_gather(in, out, layout, rank_, size_);
  auto call =
      std::make_unique<MpiPendingCall>("MPI_Iallgatherv(all_gather)", std::vector<Tensor>{in, out});
  call->ints(0) = mpi_counts(layout.counts, op);
  call->ints(1) = mpi_counts(layout.displs, op);
  const MPI_Datatype type = mpi_datatype(in.dtype());
  HAP_MPI_CHECK(MPI_Iallgatherv(in.raw_data(), call->ints(0)[static_cast<size_t>(rank_)], type,
                                out.raw_data(), call->ints(0).data(), call->ints(1).data(), type,
                                comm_, call->request()));
  return call;
}

std::unique_ptr<PendingCollective> MpiBackend::start_all_reduce(const Tensor& in,
                                                                const Tensor& out) {
  const char* op = "all_reduce";
  check_buffer(in, op);
  check_buffer(out, op);
  check_reducible(in.dtype(), op);
  HAP_CHECK(out.numel() == in.numel() && out.dtype() == in.dtype(), op, ": out ", out.str(),
            " does not match in ", in.str());
  // A reduce-scatter over even blocks (every addend of rank r's block to rank r, summed there in
  // rank order), then an all-gather of the sums.
  const int64_t n = in.numel();
  std::vector<int64_t> counts(static_cast<size_t>(size_), n / size_);
  for (int64_t r = 0; r < n % size_; ++r) counts[static_cast<size_t>(r)] += 1;
  const BlockLayout layout = BlockLayout::packed(counts);
  Tensor mine =
      Tensor::empty({counts[static_cast<size_t>(rank_)]}, TensorOptions{}.with_dtype(in.dtype()));
  return std::make_unique<PhasedCollective>(std::vector<PhasedCollective::Phase>{
      [this, in, layout, mine] { return start_reduce_scatter(in, layout, mine); },
      [this, mine, out, layout] { return start_all_gather(mine, out, layout); }});
}

}  // namespace hap::parallel
