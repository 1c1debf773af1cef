// The IR the synthesizer works on: the single-device graph of a model's forward pass, captured by
// tracing (shape-only tensors, no data). Nodes are op calls with the module they came from;
// tensors carry shape, dtype and role. A tensor the forward creates itself (a mask, a position
// index) is a Constant and keeps its data, so that every rank can read its part. A module's
// buffer (a running statistic) is a State: read like a constant, but its value lives with the
// executor and changes after each training forward by the graph's state updates.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "ops/op.h"

namespace hap::synth {

enum class TensorRole : uint8_t { Input, Parameter, Constant, Activation, Loss, State };
const char* role_name(TensorRole r);

struct GraphTensor {
  int id = -1;
  std::string name;  // parameter or input name; empty for activations
  Shape shape;
  DType dtype = DType::F32;
  TensorRole role = TensorRole::Activation;
  int producer = -1;  // node id, -1 for inputs, parameters and constants
  int output_index = 0;
  std::vector<int> consumers;  // node ids, in program order
  Tensor value;  // Constant: its data, captured when traced (undefined if it had none)
  int64_t bytes() const { return shape_numel(shape) * static_cast<int64_t>(dtype_size(dtype)); }
};

struct GraphNode {
  int id = -1;
  ops::OpKind kind{};
  ops::Attrs attrs;
  std::vector<int> inputs;  // tensor ids; -1 for an omitted optional input
  std::vector<int> outputs;
  std::string module;  // dotted module path ("blocks.0.attn"), empty at top level
  double flops = 0;    // forward FLOPs
  double bytes = 0;    // bytes read and written by the forward kernel
};

// After a training forward, state <- keep * state + take * value (value: a tensor the forward
// computed, with the state's number of elements), as ops' update_running_average recorded it.
struct StateUpdate {
  int state = -1;  // a State tensor
  int value = -1;
  double keep = 0;
  double take = 0;
};

struct Graph {
  std::vector<GraphTensor> tensors;
  std::vector<GraphNode> nodes;  // in program (topological) order
  int loss = -1;
  std::vector<StateUpdate> state_updates;  // in the order the forward made them

  double total_flops() const;
  int64_t parameter_count() const;
  // A readable listing: one line per node with its module, inputs, outputs, FLOPs.
  std::string str() const;
};

// A topological order of the nodes that keeps few tensors live at once, the order in which the
// program search visits them (the states it tells apart grow with the product of the properties
// of the tensors live together). List scheduling: among the nodes whose inputs are all computed,
// run the one that adds the fewest live tensors (outputs someone reads; leaves read again later)
// net of those it frees (last reads), ties in program order. Any topological order is a valid
// program order: the executor runs instructions as listed.
std::vector<int> narrow_order(const Graph& graph);

// The sharding signatures of a node, from its op's registry entry at the graph's shapes (the
// all-Replicated one is implicit and not listed).
std::vector<ops::ShardSignature> signatures_of(const Graph& graph, const GraphNode& node);
// The collectives a node's op makes itself under one of its signatures (OpDef::own_collectives at
// the graph's shapes; empty where the op declares none).
std::vector<ops::OwnCollective> own_collectives_of(const Graph& graph, const GraphNode& node,
                                                   const ops::ShardSignature& sig);

// Runs `forward` with tracing on and returns its graph. `parameters`, `inputs` and `states` (a
// model's buffers) name the leaf tensors forward reads (their data is never touched, so
// shape-only tensors work); any other tensor that appears as an op input becomes a Constant, with
// a copy of its data. forward returns the loss, a scalar. A state update of a tensor not passed
// in `states`, or of a value no traced op computed, is an error.
Graph trace(const std::function<Tensor()>& forward,
            const std::vector<std::pair<std::string, Tensor>>& parameters,
            const std::vector<std::pair<std::string, Tensor>>& inputs,
            const std::vector<std::pair<std::string, Tensor>>& states = {});

}  // namespace hap::synth
