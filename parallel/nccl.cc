#include "parallel/nccl.h"

#include "core/error.h"

#ifdef HAP_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "core/cuda/backend.h"
#include "core/cuda/check.h"
#include "core/cuda/library.h"
#include "parallel/mpi.h"
#endif

namespace hap::parallel {

#ifndef HAP_HAVE_CUDA

std::string nccl_unavailable_reason() { return "this build has no CUDA backend"; }

std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Backend>, int) {
  HAP_CHECK(false, "NCCL: this build has no CUDA backend (build with the CUDA toolkit present)");
  return nullptr;
}

#else

namespace {

// NCCL's functions, from the library opened on first use.
struct Nccl {
  ncclResult_t (*get_unique_id)(ncclUniqueId*);
  ncclResult_t (*comm_init_rank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*comm_destroy)(ncclComm_t);
  ncclResult_t (*comm_abort)(ncclComm_t);
  ncclResult_t (*comm_get_async_error)(ncclComm_t, ncclResult_t*);
  const char* (*error_string)(ncclResult_t);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t);
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         cudaStream_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                 ncclComm_t, cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)();
  ncclResult_t (*group_end)();
};

struct Loaded {
  Nccl fns{};
  std::string error;  // why it cannot be used ("" when it can)
};

template <typename F>
bool resolve(void* lib, const char* name, F* fn, std::string* error) {
  return cuda::resolve_function(lib, "libnccl.so.2", name, fn, error, "an NCCL older than 2.7?");
}

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r;
    std::string why;
    void* lib =
        cuda::open_library(cuda::library_candidates("HAP_NCCL_LIBRARY", "libnccl.so.2"), &why);
    if (lib == nullptr) {
      r.error = "cannot open libnccl.so.2 (" + why +
                "): install NCCL, put its folder on LD_LIBRARY_PATH or name the file in "
                "HAP_NCCL_LIBRARY";
      return r;
    }
    Nccl& n = r.fns;
    const bool ok = resolve(lib, "ncclGetUniqueId", &n.get_unique_id, &r.error) &&
                    resolve(lib, "ncclCommInitRank", &n.comm_init_rank, &r.error) &&
                    resolve(lib, "ncclCommDestroy", &n.comm_destroy, &r.error) &&
                    resolve(lib, "ncclCommAbort", &n.comm_abort, &r.error) &&
                    resolve(lib, "ncclCommGetAsyncError", &n.comm_get_async_error, &r.error) &&
                    resolve(lib, "ncclGetErrorString", &n.error_string, &r.error) &&
                    resolve(lib, "ncclAllReduce", &n.all_reduce, &r.error) &&
                    resolve(lib, "ncclBroadcast", &n.broadcast, &r.error) &&
                    resolve(lib, "ncclReduce", &n.reduce, &r.error) &&
                    resolve(lib, "ncclAllGather", &n.all_gather, &r.error) &&
                    resolve(lib, "ncclReduceScatter", &n.reduce_scatter, &r.error) &&
                    resolve(lib, "ncclSend", &n.send, &r.error) &&
                    resolve(lib, "ncclRecv", &n.recv, &r.error) &&
                    resolve(lib, "ncclGroupStart", &n.group_start, &r.error) &&
                    resolve(lib, "ncclGroupEnd", &n.group_end, &r.error);
    if (!ok) r.fns = Nccl{};
    return r;
  }();
  return l;
}

const Nccl& nccl() {
  const Loaded& l = loaded();
  HAP_CHECK(l.error.empty(), "NCCL: ", l.error);
  return l.fns;
}

// An NCCL call that fails becomes a hap::Error naming the call and NCCL's words.
#define HAP_NCCL_CHECK(call)                                                                       \
  do {                                                                                             \
    const ncclResult_t hap_nccl_r_ = (call);                                                       \
    if (hap_nccl_r_ != ncclSuccess)                                                                \
      throw ::hap::Error(::hap::detail::concat("NCCL: ", #call, " failed at ", __FILE__, ":",      \
                                               __LINE__, ": ", nccl().error_string(hap_nccl_r_))); \
  } while (0)

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I64:
      return ncclInt64;
    case DType::U8:
      return ncclUint8;
  }
  HAP_ASSERT(false, "unknown dtype");
  return ncclFloat32;
}

// The address of element `at` of a contiguous tensor.
void* at(const Tensor& t, int64_t element) {
  return static_cast<char*>(t.raw_data()) + element * static_cast<int64_t>(dtype_size(t.dtype()));
}

// Runs `body` inside one NCCL group.
template <typename F>
void grouped(F body) {
  HAP_NCCL_CHECK(nccl().group_start());
  try {
    body();
  } catch (...) {
    nccl().group_end();
    throw;
  }
  HAP_NCCL_CHECK(nccl().group_end());
}

class NcclBackend : public Backend {
 public:
  NcclBackend(std::shared_ptr<Backend> host, int device) : host_(std::move(host)), device_(device) {
    HAP_CHECK(host_ != nullptr && host_->supports(Device::cpu()),
              "NCCL: the bootstrap backend must carry CPU tensors");
    // Every rank checks its device and NCCL, and learns whether every other rank could: a rank
    // that cannot makes every rank throw instead of leaving the others waiting in the init.
    std::string why = nccl_unavailable_reason();
    if (why.empty()) {
      try {
        cuda::check_device(device_);
      } catch (const Error& e) {
        why = e.what();
      }
    }
    Tensor mine = Tensor::from_vector(std::vector<int64_t>{why.empty() ? device_ : -1}, {1});
    Tensor all = Tensor::empty({host_->size()}, TensorOptions{}.with_dtype(DType::I64));
    host_->all_gather(mine, all, BlockLayout::packed(std::vector<int64_t>(host_->size(), 1)));
    HAP_CHECK(why.empty(), "NCCL: rank ", host_->rank(), ": ", why);
    const std::vector<double> devices = all.to_vector();
    for (int r = 0; r < host_->size(); ++r)
      HAP_CHECK(devices[static_cast<size_t>(r)] >= 0, "NCCL: rank ", r,
                " cannot use NCCL or its GPU (its own error says why)");
    // Two ranks on one GPU of one node: NCCL cannot run them.
    std::shared_ptr<Backend> node = host_->split_by_node();
    Tensor node_mine = Tensor::from_vector(std::vector<int64_t>{device_}, {1});
    Tensor node_all = Tensor::empty({node->size()}, TensorOptions{}.with_dtype(DType::I64));
    node->all_gather(node_mine, node_all,
                     BlockLayout::packed(std::vector<int64_t>(node->size(), 1)));
    const std::vector<double> on_node = node_all.to_vector();
    for (int r = 0; r < node->size(); ++r)
      HAP_CHECK(r == node->rank() || on_node[static_cast<size_t>(r)] != device_, "NCCL: rank ",
                host_->rank(), " and another rank of its node both use cuda:", device_,
                "; NCCL needs one GPU per rank (use the MPI backend, which stages "
                "through the host, for ranks sharing a GPU)");
    // The unique id: made by rank 0, broadcast by the host backend.
    ncclUniqueId id{};
    if (host_->rank() == 0) HAP_NCCL_CHECK(nccl().get_unique_id(&id));
    Tensor id_bytes =
        Tensor::empty({static_cast<int64_t>(sizeof id)}, TensorOptions{}.with_dtype(DType::U8));
    std::memcpy(id_bytes.raw_data(), &id, sizeof id);
    host_->broadcast(id_bytes, 0);
    std::memcpy(&id, id_bytes.raw_data(), sizeof id);
    ::hap::cuda::set_device(device_);
    HAP_NCCL_CHECK(nccl().comm_init_rank(&comm_, host_->size(), id, host_->rank()));
  }
  ~NcclBackend() override {
    try {
      ::hap::cuda::set_device(device_);  // (its resources are the device's; errors ignored)
    } catch (...) {
    }
    if (comm_ != nullptr) nccl().comm_destroy(comm_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (inputs_ready_ != nullptr) cudaEventDestroy(inputs_ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  bool supports(const Device& d) const override {
    return d.is_cpu() || (d.is_cuda() && d.index == device_);
  }

  std::shared_ptr<Backend> split(int colour, int key) override {
    std::shared_ptr<Backend> part = host_->split(colour, key);
    return part ? std::make_shared<NcclBackend>(std::move(part), device_) : nullptr;
  }
  std::shared_ptr<Backend> split_by_node() override {
    return std::make_shared<NcclBackend>(host_->split_by_node(), device_);
  }
  void barrier() override {
    ::hap::cuda::set_device(device_);
    HAP_CUDA_CHECK(cudaDeviceSynchronize());
    host_->barrier();
  }
  [[noreturn]] void abort(int code) override {
    if (comm_ != nullptr) nccl().comm_abort(comm_);
    comm_ = nullptr;
    host_->abort(code);
    std::abort();  // the host backend's abort does not return either
  }

  void send(const Tensor& t, int peer) override {
    if (on_host(t)) return host_->send(t, peer);
    HAP_NCCL_CHECK(nccl().send(t.raw_data(), count(t), nccl_type(t.dtype()), peer, comm_, 0));
    finish("send");
  }
  void recv(const Tensor& t, int peer) override {
    if (on_host(t)) return host_->recv(t, peer);
    HAP_NCCL_CHECK(nccl().recv(t.raw_data(), count(t), nccl_type(t.dtype()), peer, comm_, 0));
    finish("recv");
  }
  void broadcast(const Tensor& t, int root) override {
    if (on_host(t)) return host_->broadcast(t, root);
    HAP_NCCL_CHECK(nccl().broadcast(t.raw_data(), t.raw_data(), count(t), nccl_type(t.dtype()),
                                    root, comm_, 0));
    finish("broadcast");
  }
  void reduce(const Tensor& in, const Tensor& out, int root) override {
    if (on_host(in, out)) return host_->reduce(in, out, root);
    summable(in, "reduce");
    HAP_NCCL_CHECK(nccl().reduce(in.raw_data(), rank() == root ? out.raw_data() : nullptr,
                                 count(in), nccl_type(in.dtype()), ncclSum, root, comm_, 0));
    finish("reduce");
  }
  void all_gather(const Tensor& in, const Tensor& out, const BlockLayout& layout) override {
    if (on_host(in, out)) return host_->all_gather(in, out, layout);
    finish(issue_all_gather(in, out, layout, 0));
  }
  void reduce_scatter(const Tensor& in, const BlockLayout& layout, const Tensor& out) override {
    if (on_host(in, out)) return host_->reduce_scatter(in, layout, out);
    finish(issue_reduce_scatter(in, layout, out, 0));
  }
  void all_reduce(const Tensor& in, const Tensor& out) override {
    if (on_host(in, out)) return host_->all_reduce(in, out);
    finish(issue_all_reduce(in, out, 0));
  }

  // ---- nonblocking: on the communication stream ----
  // The collective is queued on this backend's own stream (non-blocking with respect to the
  // legacy default stream our kernels run on), after an event recorded on the compute stream (so
  // it reads what the kernels before it wrote), and returns at once: the compute stream goes on
  // with the next kernels while NCCL runs. Completing it (test() true, or wait()) makes the
  // compute stream wait for its end event, so every later kernel, copy or reuse of a freed block
  // comes after it, without the host waiting for the GPU beyond polling the event.
  bool nonblocking_all_reduce() const override { return true; }
  std::unique_ptr<PendingCollective> start_all_reduce(const Tensor& in,
                                                      const Tensor& out) override {
    if (on_host(in, out)) return host_->start_all_reduce(in, out);
    return on_comm_stream({in, out}, [&](cudaStream_t s) { return issue_all_reduce(in, out, s); });
  }
  std::unique_ptr<PendingCollective> start_reduce_scatter(const Tensor& in,
                                                          const BlockLayout& layout,
                                                          const Tensor& out) override {
    if (on_host(in, out)) return host_->start_reduce_scatter(in, layout, out);
    return on_comm_stream({in, out},
                          [&](cudaStream_t s) { return issue_reduce_scatter(in, layout, out, s); });
  }
  std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, const Tensor& out,
                                                      const BlockLayout& layout) override {
    if (on_host(in, out)) return host_->start_all_gather(in, out, layout);
    return on_comm_stream({in, out},
                          [&](cudaStream_t s) { return issue_all_gather(in, out, layout, s); });
  }
  void all_to_all(const Tensor& in, const BlockLayout& send, const Tensor& out,
                  const BlockLayout& recv) override {
    if (on_host(in, out)) return host_->all_to_all(in, send, out, recv);
    const ncclDataType_t type = nccl_type(in.dtype());
    grouped([&] {
      for (int r = 0; r < size(); ++r) {
        const size_t i = static_cast<size_t>(r);
        if (send.counts[i] > 0)
          HAP_NCCL_CHECK(nccl().send(at(in, send.displs[i]), static_cast<size_t>(send.counts[i]),
                                     type, r, comm_, 0));
        if (recv.counts[i] > 0)
          HAP_NCCL_CHECK(nccl().recv(at(out, recv.displs[i]), static_cast<size_t>(recv.counts[i]),
                                     type, r, comm_, 0));
      }
    });
    finish("all_to_all");
  }

 private:
  // Queue the collectives on stream `s`; each returns what it queued, for errors.
  const char* issue_all_reduce(const Tensor& in, const Tensor& out, cudaStream_t s) {
    summable(in, "all_reduce");
    HAP_NCCL_CHECK(nccl().all_reduce(in.raw_data(), out.raw_data(), count(in),
                                     nccl_type(in.dtype()), ncclSum, comm_, s));
    return "all_reduce";
  }
  const char* issue_all_gather(const Tensor& in, const Tensor& out, const BlockLayout& layout,
                               cudaStream_t s) {
    const ncclDataType_t type = nccl_type(in.dtype());
    if (layout.regular() && layout.total() == out.numel()) {
      HAP_NCCL_CHECK(nccl().all_gather(in.raw_data(), out.raw_data(),
                                       static_cast<size_t>(layout.counts[0]), type, comm_, s));
      return "all_gather";
    }
    grouped([&] {  // one broadcast per block, from its rank
      for (int r = 0; r < size(); ++r) {
        const int64_t n = layout.counts[static_cast<size_t>(r)];
        if (n == 0) continue;
        HAP_NCCL_CHECK(nccl().broadcast(in.raw_data(),
                                        at(out, layout.displs[static_cast<size_t>(r)]),
                                        static_cast<size_t>(n), type, r, comm_, s));
      }
    });
    return "all_gather (grouped broadcasts)";
  }
  const char* issue_reduce_scatter(const Tensor& in, const BlockLayout& layout, const Tensor& out,
                                   cudaStream_t s) {
    summable(in, "reduce_scatter");
    const ncclDataType_t type = nccl_type(in.dtype());
    if (layout.regular() && layout.total() == in.numel()) {
      HAP_NCCL_CHECK(nccl().reduce_scatter(in.raw_data(), out.raw_data(),
                                           static_cast<size_t>(layout.counts[0]), type, ncclSum,
                                           comm_, s));
      return "reduce_scatter";
    }
    grouped([&] {  // one reduce per block, to its rank
      for (int r = 0; r < size(); ++r) {
        const int64_t n = layout.counts[static_cast<size_t>(r)];
        if (n == 0) continue;
        HAP_NCCL_CHECK(nccl().reduce(at(in, layout.displs[static_cast<size_t>(r)]),
                                     r == rank() ? out.raw_data() : nullptr, static_cast<size_t>(n),
                                     type, ncclSum, r, comm_, s));
      }
    });
    return "reduce_scatter (grouped reduces)";
  }

  // A collective queued on the communication stream: completes when its end event has been
  // reached, polling NCCL's asynchronous errors meanwhile (as finish() does).
  class Pending final : public PendingCollective {
   public:
    Pending(NcclBackend* b, cudaEvent_t end, std::vector<Tensor> keep, const char* what)
        : b_(b), end_(end), keep_(std::move(keep)), what_(what) {}
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
    ~Pending() override {
      // Not completed: the compute stream still waits for it, so the tensors' blocks are reused
      // only after it (errors ignored: a destructor must not throw).
      if (end_ == nullptr) return;
      try {
        ::hap::cuda::set_device(b_->device_);
      } catch (...) {
        return;  // (no device to order on: nothing can run after it either)
      }
      cudaStreamWaitEvent(0, end_, 0);
      cudaEventDestroy(end_);
    }
    bool test() override {
      if (end_ == nullptr) return true;
      ::hap::cuda::set_device(b_->device_);
      if (!b_->reached(end_, what_)) return false;
      HAP_CUDA_CHECK(cudaStreamWaitEvent(0, end_, 0));  // later kernels come after it
      HAP_CUDA_CHECK(cudaEventDestroy(end_));
      end_ = nullptr;
      keep_.clear();
      return true;
    }
    void wait() override {
      b_->poll_until([&] { return test(); }, what_);
    }

   private:
    NcclBackend* b_;
    cudaEvent_t end_;
    std::vector<Tensor> keep_;
    const char* what_;
  };

  template <typename Issue>
  std::unique_ptr<PendingCollective> on_comm_stream(std::vector<Tensor> keep, Issue issue) {
    if (stream_ == nullptr) {
      HAP_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      HAP_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready_, cudaEventDisableTiming));
    }
    HAP_CUDA_CHECK(cudaEventRecord(inputs_ready_, 0));  // the kernels that wrote the inputs
    HAP_CUDA_CHECK(cudaStreamWaitEvent(stream_, inputs_ready_, 0));
    const char* what = issue(stream_);
    cudaEvent_t end = nullptr;
    HAP_CUDA_CHECK(cudaEventCreateWithFlags(&end, cudaEventDisableTiming));
    HAP_CUDA_CHECK(cudaEventRecord(end, stream_));
    return std::make_unique<Pending>(this, end, std::move(keep), what);
  }

  // Whether `event` has been reached; throws (after aborting the communicator) on NCCL's
  // asynchronous error.
  bool reached(cudaEvent_t event, const char* what) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) HAP_CUDA_CHECK(q);
    // The runtime also keeps "not ready" as this thread's last error, which the next kernel's
    // launch check (cudaGetLastError) would then report as its own failure: cleared here.
    (void)cudaGetLastError();
    HAP_CHECK(comm_ != nullptr, "NCCL ", what, " on rank ", rank(),
              ": the communicator was aborted after an earlier error");
    ncclResult_t async = ncclSuccess;
    HAP_NCCL_CHECK(nccl().comm_get_async_error(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      nccl().comm_abort(comm_);
      comm_ = nullptr;
      HAP_CHECK(false, "NCCL ", what, " on rank ", rank(), " failed: ", nccl().error_string(async),
                " (an asynchronous error: a rank failed or a link broke)");
    }
    return false;
  }

  // Polls `done` under the collective timeout (wait_until); a timeout or error aborts the
  // communicator, which frees the GPU's NCCL kernels.
  void poll_until(const std::function<bool()>& done, const char* what) {
    try {
      wait_until(done, std::string("NCCL ") + what);
    } catch (...) {
      if (comm_ != nullptr) nccl().comm_abort(comm_);
      comm_ = nullptr;
      throw;
    }
  }

  // Waits for the NCCL call just queued (and the kernels before it) by polling, rather than
  // blocking in the driver: between polls it asks NCCL for an asynchronous error (a peer that
  // failed, a broken link), and the collective timeout bounds the wait (parallel.collective_
  // timeout_s), so a failed or hung rank stops this one with the reason instead of leaving it in
  // the collective forever; the communicator is aborted first, which frees the GPU's NCCL
  // kernels.
  void finish(const char* what) {
    if (done_ == nullptr) HAP_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    HAP_CUDA_CHECK(cudaEventRecord(done_, 0));
    poll_until([&] { return reached(done_, what); }, what);
  }

  // Whether the operands are host tensors (carried by the host backend); device operands must be
  // on this rank's GPU and contiguous.
  bool on_host(const Tensor& a, const Tensor& b = Tensor()) const {
    const bool host = a.device().is_cpu();
    for (const Tensor* t : {&a, &b}) {
      if (!t->defined()) continue;
      HAP_CHECK(t->device().is_cpu() == host && (host || t->device().index == device_),
                "NCCL backend: ", t->str(), " is not on this rank's ",
                host ? std::string("host") : "cuda:" + std::to_string(device_),
                " like the other operand");
      HAP_CHECK(t->is_contiguous(), "NCCL backend: ", t->str(), " must be contiguous");
    }
    if (!host) {
      HAP_CHECK(comm_ != nullptr, "NCCL backend: rank ", rank(),
                "'s communicator was aborted after an earlier error");
      ::hap::cuda::set_device(device_);
    }
    return host;
  }
  static size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }
  static void summable(const Tensor& t, const char* op) {
    HAP_CHECK(t.dtype() != DType::U8, "NCCL backend: ", op, " cannot sum u8 tensors");
  }

  std::shared_ptr<Backend> host_;
  int device_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t done_ = nullptr;  // recorded after each call; finish() polls it
  // The communication stream of started collectives, and the event that orders it after the
  // compute stream's kernels (made on the first start).
  cudaStream_t stream_ = nullptr;
  cudaEvent_t inputs_ready_ = nullptr;
};

}  // namespace

std::string nccl_unavailable_reason() { return loaded().error; }

std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Backend> host, int device) {
  return std::make_shared<NcclBackend>(std::move(host), device);
}

#endif  // HAP_HAVE_CUDA

}  // namespace hap::parallel
