// Sharding signatures: how an op may run on shards. For each valid way of holding the inputs on
// the ranks (Replicated, Sharded(dim), Partial) an op declares the property its outputs then have.
// The all-Replicated signature is always valid and is not listed. The synthesizer reads these;
// it never hard-codes knowledge of an op.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace hap::ops {

enum class PropKind : uint8_t { Replicated, Sharded, Partial };

struct Prop {
  PropKind kind = PropKind::Replicated;
  int64_t dim = -1;  // for Sharded
  static Prop replicated() { return {PropKind::Replicated, -1}; }
  static Prop sharded(int64_t d) { return {PropKind::Sharded, d}; }
  static Prop partial() { return {PropKind::Partial, -1}; }
  bool operator==(const Prop& o) const { return kind == o.kind && dim == o.dim; }
  std::string str() const;
};

// How an uneven collective moves its shards (DESIGN.md glossary): padded to the largest shard
// and carried by the regular collective, or grouped (each shard with its exact size inside one
// group call). None marks an instruction that moves nothing. Hierarchical is a form of all-reduce
// only (parallel/hierarchical.h): a reduce-scatter inside each node, an all-reduce across nodes,
// an all-gather inside each node.
enum class CollectiveMethod : uint8_t { None, Padded, Grouped, Hierarchical };
// "-", "padded", "grouped", "hierarchical"
const char* method_name(CollectiveMethod m);

struct ShardSignature {
  std::vector<Prop> inputs;
  std::vector<Prop> outputs;
};

struct TensorMeta {
  Shape shape;
  DType dtype = DType::F32;
  bool defined = true;  // false for an omitted optional input (e.g. no bias)
};

}  // namespace hap::ops
