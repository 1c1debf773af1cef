#include "parallel/communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <thread>

#include "core/error.h"

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

void complete(MPI_Request& request, const char* call) {
  int rc = MPI_SUCCESS;
  if (wait_policy() == WaitPolicy::Spin) {
    rc = MPI_Wait(&request, MPI_STATUS_IGNORE);
  } else {
    int done = 0;
    auto pause = std::chrono::microseconds(10);
    for (;;) {
      rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS || done) break;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(100));
    }
  }
  if (rc != MPI_SUCCESS) detail::throw_mpi_error(rc, call, __FILE__, __LINE__);
}

// ---- Communicator ----

struct Communicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  int rank = 0;
  int size = 0;
  ~State() {
    if (owned && comm != MPI_COMM_NULL && MpiSession::active()) MPI_Comm_free(&comm);
  }
};

const Communicator::State& Communicator::state() const {
  HAP_CHECK(state_ != nullptr,
            "using an invalid Communicator (a rank that split() left out, or "
            "a default-constructed one)");
  return *state_;
}

Communicator Communicator::world() {
  HAP_CHECK(MpiSession::active(),
            "MPI is not initialised: create a hap::parallel::MpiSession in "
            "main() before using communicators");
  static std::shared_ptr<State> world_state = [] {
    auto s = std::make_shared<State>();
    s->comm = MPI_COMM_WORLD;
    // Also when someone else initialised MPI: errors must reach HAP_MPI_CHECK.
    HAP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    HAP_MPI_CHECK(MPI_Comm_rank(s->comm, &s->rank));
    HAP_MPI_CHECK(MPI_Comm_size(s->comm, &s->size));
    return s;
  }();
  return Communicator(world_state);
}

int Communicator::rank() const { return state().rank; }
int Communicator::size() const { return state().size; }
MPI_Comm Communicator::handle() const { return state().comm; }

void Communicator::barrier() const { HAP_MPI_RUN(MPI_Ibarrier(handle(), &hap_mpi_req_)); }

Communicator Communicator::adopt(MPI_Comm comm) {
  auto s = std::make_shared<State>();
  s->comm = comm;
  s->owned = true;
  HAP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  HAP_MPI_CHECK(MPI_Comm_rank(comm, &s->rank));
  HAP_MPI_CHECK(MPI_Comm_size(comm, &s->size));
  return Communicator(s);
}

Communicator Communicator::split(int colour, int key) const {
  MPI_Comm out = MPI_COMM_NULL;
  HAP_MPI_CHECK(MPI_Comm_split(handle(), colour < 0 ? MPI_UNDEFINED : colour, key, &out));
  return out == MPI_COMM_NULL ? Communicator() : adopt(out);
}

Communicator Communicator::split_by_node() const {
  MPI_Comm out = MPI_COMM_NULL;
  HAP_MPI_CHECK(MPI_Comm_split_type(handle(), MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &out));
  return adopt(out);
}

void Communicator::broadcast_bytes(std::vector<uint8_t>& bytes, int root) const {
  HAP_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " out of range for ", size(),
            " ranks");
  int64_t n = static_cast<int64_t>(bytes.size());
  HAP_MPI_RUN(MPI_Ibcast(&n, 1, MPI_INT64_T, root, handle(), &hap_mpi_req_));
  bytes.resize(static_cast<size_t>(n));
  // Chunks keep every count within MPI's int range.
  constexpr int64_t kChunk = int64_t{1} << 30;
  for (int64_t at = 0; at < n; at += kChunk) {
    int count = static_cast<int>(std::min(kChunk, n - at));
    HAP_MPI_RUN(MPI_Ibcast(bytes.data() + at, count, MPI_BYTE, root, handle(), &hap_mpi_req_));
  }
}

std::string Communicator::broadcast_string(const std::string& s, int root) const {
  std::vector<uint8_t> bytes(s.begin(), s.end());
  broadcast_bytes(bytes, root);
  return std::string(bytes.begin(), bytes.end());
}

std::vector<double> Communicator::allgather(double value) const {
  std::vector<double> all(static_cast<size_t>(size()));
  HAP_MPI_RUN(
      MPI_Iallgather(&value, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, handle(), &hap_mpi_req_));
  return all;
}

std::vector<int64_t> Communicator::allgather(int64_t value) const {
  std::vector<int64_t> all(static_cast<size_t>(size()));
  HAP_MPI_RUN(
      MPI_Iallgather(&value, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, handle(), &hap_mpi_req_));
  return all;
}

namespace {
template <typename T>
T reduce_in_rank_order(const std::vector<T>& all, ReduceOp op) {
  T acc = all[0];
  for (size_t i = 1; i < all.size(); ++i) {
    switch (op) {
      case ReduceOp::Sum:
        acc = acc + all[i];
        break;
      case ReduceOp::Max:
        acc = all[i] > acc ? all[i] : acc;
        break;
      case ReduceOp::Min:
        acc = all[i] < acc ? all[i] : acc;
        break;
    }
  }
  return acc;
}
}  // namespace

double Communicator::allreduce(double value, ReduceOp op) const {
  return reduce_in_rank_order(allgather(value), op);
}

int64_t Communicator::allreduce(int64_t value, ReduceOp op) const {
  return reduce_in_rank_order(allgather(value), op);
}

void Communicator::abort_all(int code) const {
  std::fflush(stdout);
  std::fflush(stderr);
  if (MpiSession::active()) MPI_Abort(state_ ? state_->comm : MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; if MPI is gone, still end this rank
}

void run_or_abort_all(const Communicator& comm, const std::function<void()>& fn, int abort_code) {
  try {
    fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
    comm.abort_all(abort_code);
  } catch (...) {
    std::fprintf(stderr, "rank %d: unknown exception\n", comm.rank());
    comm.abort_all(abort_code);
  }
}

}  // namespace hap::parallel
