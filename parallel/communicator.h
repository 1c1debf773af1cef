// MPI: the session (init/finalize), the communicator used by CPU collectives and by the NCCL
// bootstrap, and the checking macro every MPI call goes through.
//
// Thread level is MPI_THREAD_FUNNELED: only the thread that created the MpiSession calls MPI
// (OpenMP threads inside kernels never do). Communicators return MPI errors instead of aborting
// (MPI_ERRORS_RETURN), so HAP_MPI_CHECK can turn them into an MpiError naming the call; wrap a
// rank's main work in run_or_abort_all so that any error on one rank ends every rank promptly
// instead of leaving the others blocked in a collective.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace hap::parallel {

// A failed MPI call: the message names the MPI function, the call site and MPI's error string.
class MpiError : public std::runtime_error {
 public:
  explicit MpiError(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);
}  // namespace detail

}  // namespace hap::parallel

// Starts a nonblocking MPI call whose last argument is `&hap_mpi_req_` and completes it under
// the wait policy: HAP_MPI_RUN(MPI_Ibcast(buf, n, type, root, comm, &hap_mpi_req_)).
#define HAP_MPI_RUN(call)                           \
  do {                                              \
    MPI_Request hap_mpi_req_ = MPI_REQUEST_NULL;    \
    HAP_MPI_CHECK(call);                            \
    ::hap::parallel::complete(hap_mpi_req_, #call); \
  } while (0)

#define HAP_MPI_CHECK(call)                                                             \
  do {                                                                                  \
    int hap_mpi_rc_ = (call);                                                           \
    if (hap_mpi_rc_ != MPI_SUCCESS)                                                     \
      ::hap::parallel::detail::throw_mpi_error(hap_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

namespace hap::parallel {

// The MPI datatype a tensor of `dtype` travels as. bf16 travels as MPI_UINT16_T (its bits):
// reductions never run inside MPI, so no MPI arithmetic on bf16 is needed.
MPI_Datatype mpi_datatype(DType dtype);

// Initialises MPI (thread level funneled) for the lifetime of the object and finalises it after.
// If MPI was already initialised by someone else, neither initialises nor finalises.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  MpiSession() : MpiSession(nullptr, nullptr) {}
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  static bool active();  // MPI is initialised and not yet finalised

 private:
  bool owns_ = false;
};

enum class ReduceOp { Sum, Max, Min };

// How a rank waits for its collectives to complete. Spin waits inside MPI (lowest latency, keeps
// the core busy). Sleep polls the request and sleeps between polls (20 us, doubling to 1 ms), so
// a rank waiting for a slower one leaves the core to others: scripts/hap-emulate uses it so that
// waiting does not spend the CPU quota a rank's device is emulated with (a GPU rank waits on its
// GPU, not on a core). The default comes from HAP_COMM_WAIT=spin|sleep (unset: spin).
enum class WaitPolicy { Spin, Sleep };
WaitPolicy wait_policy();
void set_wait_policy(WaitPolicy policy);

// Completes a started nonblocking MPI operation under the wait policy; `call` names it in errors.
void complete(MPI_Request& request, const char* call);

// A group of ranks. Copies share one MPI communicator (handle semantics); communicators made by
// split() are freed when the last copy goes (or left alone once MPI is finalised).
class Communicator {
 public:
  Communicator() = default;  // invalid (e.g. split with a negative colour)
  static Communicator world();

  bool valid() const { return state_ != nullptr; }
  int rank() const;
  int size() const;
  MPI_Comm handle() const;

  void barrier() const;
  // Ranks with the same colour form one new communicator, ordered by (key, old rank). A negative
  // colour takes no part and gets an invalid Communicator. Collective over this communicator.
  Communicator split(int colour, int key = 0) const;
  // The ranks sharing a node (shared memory), ordered by their rank here.
  Communicator split_by_node() const;

  // Root's bytes on every rank (non-roots' buffers are resized to match).
  void broadcast_bytes(std::vector<uint8_t>& bytes, int root = 0) const;
  std::string broadcast_string(const std::string& s, int root = 0) const;

  // Every rank's value, in rank order.
  std::vector<double> allgather(double value) const;
  std::vector<int64_t> allgather(int64_t value) const;
  // Reductions of one scalar (losses, global norms, flags). The sum of doubles is taken in rank
  // order after an allgather, so every rank gets bitwise the same result on every run.
  double allreduce(double value, ReduceOp op = ReduceOp::Sum) const;
  int64_t allreduce(int64_t value, ReduceOp op = ReduceOp::Sum) const;

  // Ends every rank of the job with `code` (MPI_Abort). For errors one rank cannot recover from.
  [[noreturn]] void abort_all(int code) const;

 private:
  struct State;
  explicit Communicator(std::shared_ptr<State> state) : state_(std::move(state)) {}
  static Communicator adopt(MPI_Comm comm);  // takes ownership of a new communicator
  const State& state() const;
  std::shared_ptr<State> state_;
};

// Runs fn(); if it throws, prints "rank R: <what>" to stderr and aborts every rank with
// `abort_code`, so one rank's error never leaves the others waiting in a collective.
void run_or_abort_all(const Communicator& comm, const std::function<void()>& fn,
                      int abort_code = 1);

}  // namespace hap::parallel
