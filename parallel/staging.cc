#include "parallel/staging.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"

namespace hap::parallel {
namespace {

// A host tensor of `t`'s shape and dtype in pinned memory (where a backend provides it: the
// copies to and from the device then run at the link's full rate; core/allocator.h).
Tensor pinned_like(const Tensor& t) {
  return Tensor::empty(t.shape(), TensorOptions{}.with_dtype(t.dtype()).with_pinned(true));
}

// `t` itself on the host, else a pinned host copy of its values (packed on the device first, then
// its bytes copied straight into the pinned block).
Tensor on_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  const Tensor packed = t.contiguous();
  Tensor h = pinned_like(t);
  copy_bytes(h.raw_data(), Device::cpu(), packed.raw_data(), packed.device(), h.nbytes());
  return h;
}

// Where the host backend writes a result for `out`: `out` itself on the host, else a pinned host
// tensor of its shape and dtype holding its current values when `keep` (a collective that writes
// only some of the elements must leave the others as they were).
Tensor host_result(const Tensor& out, bool keep) {
  if (out.device().is_cpu()) return out;
  return keep ? on_host(out) : pinned_like(out);
}

// Whether the blocks of `layout` tile all `n` elements (no gaps, no overlaps).
bool tiles(const BlockLayout& layout, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> blocks;
  for (size_t r = 0; r < layout.counts.size(); ++r)
    if (layout.counts[r] > 0) blocks.emplace_back(layout.displs[r], layout.counts[r]);
  std::sort(blocks.begin(), blocks.end());
  int64_t at = 0;
  for (const auto& [displ, count] : blocks) {
    if (displ != at) return false;
    at += count;
  }
  return at == n;
}

// The host result back into the device tensor.
void write_back(const Tensor& out, const Tensor& host) {
  if (!out.device().is_cpu()) out.copy_from(host);
}

}  // namespace

StagingBackend::StagingBackend(std::shared_ptr<Backend> host) : host_(std::move(host)) {
  HAP_CHECK(host_ != nullptr && host_->supports(Device::cpu()),
            "StagingBackend: the host backend must carry CPU tensors");
}

std::string StagingBackend::name() const { return host_->name() + " staged through the host"; }

bool StagingBackend::supports(const Device& device) const {
  return device.is_cpu() || (has_allocator(device.kind) && registered_device_copy(device.kind));
}

std::shared_ptr<Backend> StagingBackend::split(int colour, int key) {
  std::shared_ptr<Backend> part = host_->split(colour, key);
  return part ? std::make_shared<StagingBackend>(std::move(part)) : nullptr;
}

std::shared_ptr<Backend> StagingBackend::split_by_node() {
  return std::make_shared<StagingBackend>(host_->split_by_node());
}

void StagingBackend::abort(int code) {
  host_->abort(code);
  std::abort();  // the host backend's abort does not return either
}

void StagingBackend::send(const Tensor& t, int peer) { host_->send(on_host(t), peer); }

void StagingBackend::recv(const Tensor& t, int peer) {
  const Tensor h = host_result(t, false);
  host_->recv(h, peer);
  write_back(t, h);
}

void StagingBackend::broadcast(const Tensor& t, int root) {
  const Tensor h = host_result(t, rank() == root);
  host_->broadcast(h, root);
  if (rank() != root) write_back(t, h);
}

void StagingBackend::reduce(const Tensor& in, const Tensor& out, int root) {
  const Tensor h = host_result(out, false);
  host_->reduce(on_host(in), h, root);
  if (rank() == root) write_back(out, h);
}

void StagingBackend::all_gather(const Tensor& in, const Tensor& out, const BlockLayout& layout) {
  const Tensor h = host_result(out, !tiles(layout, out.numel()));
  host_->all_gather(on_host(in), h, layout);
  write_back(out, h);
}

void StagingBackend::reduce_scatter(const Tensor& in, const BlockLayout& layout,
                                    const Tensor& out) {
  const Tensor h = host_result(out, false);
  host_->reduce_scatter(on_host(in), layout, h);
  write_back(out, h);
}

void StagingBackend::all_reduce(const Tensor& in, const Tensor& out) {
  const Tensor hin = on_host(in);
  // In place on a device (one buffer): one host copy serves as both.
  const bool in_place =
      !out.device().is_cpu() && in.device() == out.device() && in.raw_data() == out.raw_data();
  const Tensor h = in_place ? hin : host_result(out, false);
  host_->all_reduce(hin, h);
  write_back(out, h);
}

void StagingBackend::all_to_all(const Tensor& in, const BlockLayout& send, const Tensor& out,
                                const BlockLayout& recv) {
  const Tensor h = host_result(out, !tiles(recv, out.numel()));
  host_->all_to_all(on_host(in), send, h, recv);
  write_back(out, h);
}

}  // namespace hap::parallel
