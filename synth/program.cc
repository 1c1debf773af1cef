#include "synth/program.h"

#include <algorithm>
#include <cstring>

namespace hap::synth {

namespace {

class Fnv64 {
 public:
  template <typename T>
  void add(const T& value) {
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    for (unsigned char b : bytes) {
      h_ ^= b;
      h_ *= 1099511628211ull;
    }
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

void add_prop(Fnv64& h, const Prop& p) {
  h.add(static_cast<uint8_t>(p.kind));
  h.add(static_cast<int64_t>(p.dim));
}

}  // namespace

uint64_t program_hash(const DistributedProgram& p) {
  Fnv64 h;
  h.add(p.instructions.size());
  for (const Instruction& in : p.instructions) {
    h.add(static_cast<uint8_t>(in.kind));
    h.add(in.node);
    h.add(in.signature);
    h.add(in.tensor);
    add_prop(h, in.from);
    add_prop(h, in.to);
    h.add(in.segment);
    h.add(in.from_segment);
    h.add(static_cast<uint8_t>(in.method));
  }
  h.add(p.ratios.size());
  for (const auto& r : p.ratios) {
    h.add(r.size());
    for (double x : r) h.add(x);  // the exact bits
  }
  h.add(p.node_segment.size());
  for (int s : p.node_segment) h.add(s);
  h.add(p.storage.size());
  for (const Prop& s : p.storage) add_prop(h, s);
  // Programs that recompute nothing hash as before recomputation was recorded.
  if (std::find(p.recompute.begin(), p.recompute.end(), true) != p.recompute.end()) {
    h.add(p.recompute.size());
    for (bool r : p.recompute) h.add(r ? 1 : 0);
  }
  // Programs that gather no parameter again in backward hash as before regathers were recorded.
  for (size_t i = 0; i < p.instructions.size(); ++i)
    if (p.instructions[i].regather) h.add(i + 1);
  // Programs on all devices hash as before devices were recorded.
  if (!p.devices.empty()) {
    h.add(p.devices.size());
    for (int d : p.devices) h.add(d);
  }
  // Programs without hierarchical all-reduces hash as before nodes were recorded.
  if (!p.nodes.empty()) {
    h.add(p.nodes.size());
    for (int n : p.nodes) h.add(n + 1);
  }
  return h.value();
}

}  // namespace hap::synth
