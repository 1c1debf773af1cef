// MPI: the session (init/finalize), the checking macro every MPI call goes through, and the MPI
// backend of the communicator interface (parallel/backend.h): CPU tensors, device tensors through
// the staging backend (staging.h), and the bootstrap of NCCL (nccl.h).
//
// Thread level is MPI_THREAD_FUNNELED: only the thread that created the MpiSession calls MPI
// (OpenMP threads inside kernels never do). Communicators return MPI errors instead of aborting
// (MPI_ERRORS_RETURN), so HAP_MPI_CHECK can turn them into an MpiError naming the call; wrap a
// rank's main work in run_or_abort_all (communicator.h) so that any error on one rank ends every
// rank promptly instead of leaving the others blocked in a collective.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "parallel/backend.h"

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

// The rank the launcher gave this process, read from its environment before MPI starts:
// mpirun's OMPI_COMM_WORLD_RANK, then PMIX_RANK (OpenMPI under `srun --mpi=pmix`), then srun's
// SLURM_PROCID (last: ranks mpirun starts inside an sbatch allocation all see SLURM_PROCID=0).
// -1 when the process was not launched as a rank.
int launcher_rank();

// How a rank waits for its collectives to complete. Spin waits inside MPI (lowest latency, keeps
// the core busy). Sleep polls the request and sleeps between polls (10 us, doubling to 100 us), so
// a rank waiting for a slower one leaves the core to others: scripts/hap-emulate uses it so that
// waiting does not spend the CPU quota a rank's device is emulated with (a GPU rank waits on its
// GPU, not on a core). The default comes from HAP_COMM_WAIT=spin|sleep (unset: spin).
enum class WaitPolicy { Spin, Sleep };
WaitPolicy wait_policy();
void set_wait_policy(WaitPolicy policy);

// Completes a started nonblocking MPI operation under the wait policy; `call` names it in errors.
// With a collective timeout set, a collective that has not completed by then throws
// CollectiveTimeout (a rank stopped, hung or dead would otherwise hang the others forever).
void complete(MPI_Request& request, const char* call);

// Waits until `done()` says an operation outside MPI has completed (NCCL's, parallel/nccl.cc),
// polling as complete() polls: under the wait policy (Spin: without pausing), and with the
// collective timeout, after which it throws CollectiveTimeout naming `what`, the rank and the
// step. `done` may throw (an asynchronous error): that propagates.
void wait_until(const std::function<bool()>& done, const std::string& what);

// The watchdog: seconds a collective may take before complete() gives up (0: wait forever), and
// the training step for its message (-1: none).
void set_collective_timeout(double seconds);
double collective_timeout();
void set_current_step(std::int64_t step);

class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

// The MPI backend over one MPI communicator (MPI_COMM_WORLD or one split from it): CPU tensors,
// sums in rank order on the rank that owns the result (a reduce-scatter moves each addend to its
// owner with one all-to-all, as many bytes as a ring reduce-scatter, then adds them up there).
class MpiBackend : public Backend {
 public:
  // `owned`: free the communicator with the backend (one made by a split).
  MpiBackend(MPI_Comm comm, bool owned);
  ~MpiBackend() override;
  MpiBackend(const MpiBackend&) = delete;
  MpiBackend& operator=(const MpiBackend&) = delete;

  // The backend over MPI_COMM_WORLD (MPI must be initialised: see MpiSession).
  static std::shared_ptr<MpiBackend> world();

  MPI_Comm comm() const { return comm_; }
  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool supports(const Device& device) const override { return device.is_cpu(); }

  std::shared_ptr<Backend> split(int colour, int key) override;
  std::shared_ptr<Backend> split_by_node() override;
  void barrier() override;
  [[noreturn]] void abort(int code) override;

  void send(const Tensor& t, int peer) override;
  void recv(const Tensor& t, int peer) override;
  void broadcast(const Tensor& t, int root) override;
  void reduce(const Tensor& in, const Tensor& out, int root) override;
  void all_gather(const Tensor& in, const Tensor& out, const BlockLayout& layout) override;
  void reduce_scatter(const Tensor& in, const BlockLayout& layout, const Tensor& out) override;
  void all_reduce(const Tensor& in, const Tensor& out) override;
  void all_to_all(const Tensor& in, const BlockLayout& send, const Tensor& out,
                  const BlockLayout& recv) override;
  // The all-reduce's two phases (an all-to-all of even blocks, the sums in rank order, an
  // all-gather) as nonblocking MPI calls, advanced by test() and wait().
  bool nonblocking_all_reduce() const override { return true; }
  std::unique_ptr<PendingCollective> start_all_reduce(const Tensor& in, const Tensor& out) override;
  // MPI_Ialltoallv of the addends (the sums in rank order once they have arrived);
  // MPI_Iallgather(v).
  std::unique_ptr<PendingCollective> start_reduce_scatter(const Tensor& in,
                                                          const BlockLayout& layout,
                                                          const Tensor& out) override;
  std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, const Tensor& out,
                                                      const BlockLayout& layout) override;

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 0;
};

}  // namespace hap::parallel
