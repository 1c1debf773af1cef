// Communicator: a group of ranks and the backend that carries its collectives
// (parallel/backend.h). Copies share one backend (handle semantics); a communicator made by
// split() frees its backend when the last copy goes. The scalar helpers here (losses, norms,
// flags, plan hashes) are written against the backend like everything else.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/backend.h"
#include "parallel/mpi.h"

namespace hap::parallel {

enum class ReduceOp { Sum, Max, Min };

struct NodeGroups;  // parallel/hierarchical.h

class Communicator {
 public:
  Communicator() = default;  // invalid (e.g. split with a negative colour)
  explicit Communicator(std::shared_ptr<Backend> backend) : backend_(std::move(backend)) {}
  // Every rank of the job, over MPI (MPI must be initialised: see MpiSession).
  static Communicator world();

  bool valid() const { return backend_ != nullptr; }
  int rank() const;
  int size() const;
  Backend& backend() const;
  const std::shared_ptr<Backend>& backend_ptr() const { return backend_; }

  void barrier() const;
  // Ranks with the same colour form one new communicator, ordered by (key, old rank). A negative
  // colour takes no part and gets an invalid Communicator. Collective over this communicator.
  Communicator split(int colour, int key = 0) const;
  // The ranks sharing a node (shared memory), ordered by their rank here.
  Communicator split_by_node() const;

  // The grouping of this communicator's ranks by node that its hierarchical all-reduces run
  // over (parallel/hierarchical.h: group_by_node), or null. with_node_groups() returns a copy
  // (same backend) carrying `groups`; split() does not pass them on.
  const std::shared_ptr<const NodeGroups>& node_groups() const { return node_groups_; }
  Communicator with_node_groups(std::shared_ptr<const NodeGroups> groups) const {
    Communicator c = *this;
    c.node_groups_ = std::move(groups);
    return c;
  }

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

  // Ends every rank of the job with `code`. For errors one rank cannot recover from.
  [[noreturn]] void abort_all(int code) const;

 private:
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const NodeGroups> node_groups_;
};

// The MPI communicator under `comm`, for code that calls MPI itself (the NCCL bootstrap); throws
// if its backend is not MPI.
MPI_Comm mpi_handle(const Communicator& comm);

// Runs fn(); if it throws, prints "rank R: <what>" to stderr and aborts every rank with
// `abort_code`, so one rank's error never leaves the others waiting in a collective.
void run_or_abort_all(const Communicator& comm, const std::function<void()>& fn,
                      int abort_code = 1);

}  // namespace hap::parallel
