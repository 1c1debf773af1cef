// The communication backend: what carries a collective between the ranks of one group (MPI,
// NCCL, or MPI staged through the host for device tensors: mpi.h, nccl.h, staging.h). Everything
// above it (the Communicator's scalar helpers, the uneven padded and grouped collectives of
// collectives.h, their autograd adjoints, the executor) is written against this interface only, and
// never sums or moves tensor data itself.
//
// Conventions, for every call:
//  - collective calls are made by every rank of the group, in the same order;
//  - tensors are contiguous, on a device the backend supports (supports()), and every rank passes
//    the same dtype; sizes, counts and displacements are in elements;
//  - a BlockLayout places one block per rank in a flat buffer: rank r's block has counts[r]
//    elements starting at displs[r]. Equal counts at displs r * count are a regular layout, which
//    a backend may carry with its regular (non-v) collective;
//  - sums are the backend's: MpiBackend sums every element in rank order,
//    ((x_0 + x_1) + x_2) + ..., bf16 accumulated in f32, so results are bitwise reproducible and
//    identical on every rank that holds them. u8 tensors cannot be summed.
// Errors throw (MpiError for a failed MPI call, hap::Error for bad arguments).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace hap::parallel {

struct BlockLayout {
  std::vector<int64_t> counts;
  std::vector<int64_t> displs;
  int64_t total() const;  // the buffer's elements: max over r of displs[r] + counts[r]
  bool regular() const;   // equal counts at displs r * count
  // Blocks of `counts` back to back.
  static BlockLayout packed(const std::vector<int64_t>& counts);
  // `ranks` blocks of `slot` elements back to back (the padded methods' layout).
  static BlockLayout slots(size_t ranks, int64_t slot);
};

// A collective started by Backend::start_all_reduce. test() advances it without blocking and
// says whether it has completed; wait() completes it (under the wait policy and the collective
// timeout, parallel/mpi.h). The tensors it was started with must stay alive until it completes;
// one destroyed before then keeps them alive (a started MPI collective cannot be cancelled).
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// A collective made of phases run one after another: each phase is started (returning its own
// pending collective) once the one before has completed; test() and wait() advance them.
class PhasedCollective final : public PendingCollective {
 public:
  using Phase = std::function<std::unique_ptr<PendingCollective>()>;
  explicit PhasedCollective(std::vector<Phase> phases) : phases_(std::move(phases)) { advance(); }

  bool test() override {
    while (current_) {
      if (!current_->test()) return false;
      advance();
    }
    return true;
  }
  void wait() override {
    while (current_) {
      current_->wait();
      advance();
    }
  }

 private:
  void advance() { current_ = next_ < phases_.size() ? phases_[next_++]() : nullptr; }

  std::vector<Phase> phases_;
  size_t next_ = 0;
  std::unique_ptr<PendingCollective> current_;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;  // "mpi"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual bool supports(const Device& device) const = 0;

  // ---- groups ----
  // The ranks with the same colour, ordered by (key, rank here); null for a negative colour.
  virtual std::shared_ptr<Backend> split(int colour, int key) = 0;
  // The ranks that share this rank's node (shared memory), in rank order.
  virtual std::shared_ptr<Backend> split_by_node() = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with `code`; for errors a rank cannot recover from.
  [[noreturn]] virtual void abort(int code) = 0;

  // ---- point to point ----
  virtual void send(const Tensor& t, int peer) = 0;
  virtual void recv(const Tensor& t, int peer) = 0;

  // ---- collectives ----
  // Root's `t` into every rank's `t` (same shape on every rank).
  virtual void broadcast(const Tensor& t, int root) = 0;
  // The sum over ranks of `in` into root's `out` (same size; `out` is ignored elsewhere).
  virtual void reduce(const Tensor& in, const Tensor& out, int root) = 0;
  // Rank r's `in` (layout.counts[r] elements) into every rank's `out` at layout.displs[r].
  virtual void all_gather(const Tensor& in, const Tensor& out, const BlockLayout& layout) = 0;
  // Block r of every rank's `in` (layout.counts[r] elements at layout.displs[r]), summed over
  // ranks, into rank r's `out` (layout.counts[r] elements).
  virtual void reduce_scatter(const Tensor& in, const BlockLayout& layout, const Tensor& out) = 0;
  // The sum over ranks of `in` into every rank's `out` (same size).
  virtual void all_reduce(const Tensor& in, const Tensor& out) = 0;
  // Block r of `in` (send layout) to rank r; block s of `out` (recv layout) from rank s.
  virtual void all_to_all(const Tensor& in, const BlockLayout& send, const Tensor& out,
                          const BlockLayout& recv) = 0;

  // ---- nonblocking ----
  // Starts all_reduce(in, out) and returns at once; the sums are all_reduce's, bit for bit. Every
  // rank starts the same collectives in the same order and completes each before starting the
  // next, and calls no other collective of this backend while one is pending (give it a backend
  // of its own: split(0, rank)). This default runs the all-reduce to completion here (a backend
  // with no nonblocking form: the overlap is then lost, never the result).
  virtual bool nonblocking_all_reduce() const { return false; }
  virtual std::unique_ptr<PendingCollective> start_all_reduce(const Tensor& in, const Tensor& out) {
    all_reduce(in, out);
    return completed();
  }
  // reduce_scatter and all_gather started the same way, under the same rules, for collectives
  // made of several phases (the hierarchical all-reduce, parallel/hierarchical.h). The defaults
  // run them to completion here.
  virtual std::unique_ptr<PendingCollective> start_reduce_scatter(const Tensor& in,
                                                                  const BlockLayout& layout,
                                                                  const Tensor& out) {
    reduce_scatter(in, layout, out);
    return completed();
  }
  virtual std::unique_ptr<PendingCollective> start_all_gather(const Tensor& in, const Tensor& out,
                                                              const BlockLayout& layout) {
    all_gather(in, out, layout);
    return completed();
  }

  // A collective that has already completed.
  static std::unique_ptr<PendingCollective> completed() {
    struct Done final : PendingCollective {
      bool test() override { return true; }
      void wait() override {}
    };
    return std::make_unique<Done>();
  }
};

}  // namespace hap::parallel
