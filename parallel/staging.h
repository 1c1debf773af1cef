// A backend for device tensors over a backend of host tensors: each call copies its device
// operands into host tensors, runs the host backend's collective on them, and copies the results
// back into the device tensors. This is how ranks that share one GPU communicate (NCCL refuses
// two ranks on one device): the MPI backend carries their tensors through host memory. Host
// tensors pass straight through, and the sums are the host backend's (so results are what the
// same collective gives on CPU tensors, bit for bit). The copies are pageable and synchronous.
#pragma once
#include <memory>
#include <string>

#include "parallel/backend.h"

namespace hap::parallel {

class StagingBackend : public Backend {
 public:
  // `host` must support CPU tensors.
  explicit StagingBackend(std::shared_ptr<Backend> host);

  const Backend& host() const { return *host_; }
  std::string name() const override;  // "<host's name> staged through the host"
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  // CPU tensors, and tensors of any device type whose backend is built in (an allocator and
  // copies are registered: core/allocator.h).
  bool supports(const Device& device) const override;

  std::shared_ptr<Backend> split(int colour, int key) override;
  std::shared_ptr<Backend> split_by_node() override;
  void barrier() override { host_->barrier(); }
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

 private:
  std::shared_ptr<Backend> host_;
};

}  // namespace hap::parallel
