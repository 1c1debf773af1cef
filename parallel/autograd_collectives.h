// Differentiable collectives: the communication instructions of a DistributedProgram, each with
// its adjoint as backward, so that loss.backward() on every rank yields correct local gradients.
//
// THE GRADIENT CONVENTION (the executor relies on it)
// ---------------------------------------------------
// On every rank, the gradient of a local tensor x_r is dL/dx_r: the derivative of the logical
// loss L with respect to that rank's local value, treating the local values on different ranks
// as independent variables. Consequently the gradient of a tensor has the dual property:
//
//     property of the tensor        property of its gradient
//     Replicated                    Partial     (each replica's share; their sum is dL/dX)
//     Sharded(d)                    Sharded(d)  (rank r holds exactly its slice of dL/dX)
//     Partial                       Replicated  (every addend sees all of dL/dX)
//
// Every backward here is the exact transpose of its forward map, so the convention holds through
// any program without knowing who consumes a tensor, and every op's local backward already obeys
// it (an op signature {pre} op {post} transposes to {dual post} op^T {dual pre}):
//
//     forward                                    backward (adjoint)
//     all_gather         Sharded(d) -> Repl.     reduce_scatter  Partial -> Sharded(d)
//     reduce_scatter     Partial -> Sharded(d)   all_gather      Sharded(d) -> Replicated
//     all_reduce         Partial -> Replicated   all_reduce      Partial -> Replicated
//     all_to_all         Sharded(c) -> Sh.(s)    all_to_all      Sharded(s) -> Sharded(c)
//     shard_slice        Replicated -> Sh.(d)    zero-embed      Sharded(d) -> Partial   (local)
//     to_partial         Replicated -> Partial   to_partial      Replicated -> Partial   (local)
//     replicate          Tied -> Replicated      all_reduce      Partial -> Tied         (see
//     below)
//
// Note what this means where intuition (Megatron's f/g operators) says otherwise:
//  - all_reduce's backward is an all_reduce, not the identity: its output is Replicated, so the
//    gradient arriving is Partial. (Identity would be right only if every rank already held the
//    full gradient, which this convention never assumes.)
//  - shard_slice's backward is free (each rank embeds its slice's gradient in zeros); no
//    all-gather is needed because the gradient of the Replicated input is Partial.
//
// What the executor must do:
//  1. Seed backward with the gradient of the loss in the dual of the loss's property: a Partial
//     loss (local losses sum to L, e.g. a batch-sharded mean with global counts) is seeded with 1
//     on every rank (plain loss.backward()); a Replicated loss must first go through
//     to_partial(), which keeps it on one rank and zeroes it elsewhere (or equivalently seed 1 on
//     one rank and 0 on the others). Seeding 1 on every rank of a Replicated loss would scale
//     every gradient by the number of ranks.
//  2. Replicated parameters ("Tied": one logical tensor whose replicas must stay identical) get
//     a Partial gradient. Either pass each through replicate() once when it is read (its
//     backward all-reduces, so .grad holds the full dL/dW, identical on every rank), or
//     all-reduce their .grad after backward. Sharded(d) parameters' .grad is already final.
//     The global gradient norm then counts every Replicated parameter once and sums the
//     Sharded ones' squares over ranks.
//  3. Run the same program on every rank: the same collectives in the same order, with
//     requires_grad agreeing on every rank, so the backward issues matching collectives
//     everywhere (the engine orders nodes by creation, which is the same on every rank). Every
//     backward here returns a defined gradient (zeros where nothing flows), never an undefined
//     one on only some ranks.
//
// Backward collectives use the forward's method and lengths. Double backward is not supported.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"

namespace hap::parallel::functional {

// Sharded(dim) -> Replicated. Backward: reduce_scatter of the (Partial) output gradient.
Tensor all_gather(const Communicator& comm, const Tensor& x_local, int64_t dim,
                  const std::vector<int64_t>& lengths, CollectiveMethod method);

// all_gather whose output the ops reading it do not keep for their backward: each gathers it
// again from x_local when its backward runs (autograd::rematerializable; ZeRO-3 storage of a
// parameter, x_local its shard, which must not change before the backward pass is over).
Tensor all_gather_regathered(const Communicator& comm, const Tensor& x_local, int64_t dim,
                             const std::vector<int64_t>& lengths, CollectiveMethod method);

// Partial -> Sharded(dim). Backward: all_gather of the (Sharded) output gradient.
Tensor reduce_scatter(const Communicator& comm, const Tensor& x_partial, int64_t dim,
                      const std::vector<int64_t>& lengths, CollectiveMethod method);

// Partial -> Replicated. Backward: all_reduce of the (Partial) output gradient.
Tensor all_reduce(const Communicator& comm, const Tensor& x_partial,
                  CollectiveMethod method = CollectiveMethod::Grouped);

// Sharded(concat_dim) -> Sharded(split_dim). Backward: the reverse all_to_all.
Tensor all_to_all(const Communicator& comm, const Tensor& x_local, int64_t split_dim,
                  int64_t concat_dim, const std::vector<int64_t>& lengths_split,
                  const std::vector<int64_t>& lengths_concat,
                  CollectiveMethod method = CollectiveMethod::Grouped);

// Replicated -> Sharded(dim): this rank's slice, no communication (HAP's dynamic slice).
// Backward: the slice's gradient embedded in zeros of the full shape (Partial), no communication.
Tensor shard_slice(const Communicator& comm, const Tensor& x, int64_t dim,
                   const std::vector<int64_t>& lengths);

// Replicated -> Partial: x on rank `root`, zeros elsewhere (a Replicated loss before backward, a
// Replicated bias added to a Partial output). Backward: the same map (gradient on root only).
Tensor to_partial(const Communicator& comm, const Tensor& x, int root = 0);

// Tied -> Replicated for a tensor whose replicas are one logical tensor (a Replicated parameter):
// identity forward; backward all-reduces the Partial gradient, so the input's gradient is the
// full dL/dx on every rank.
Tensor replicate(const Communicator& comm, const Tensor& x,
                 CollectiveMethod method = CollectiveMethod::Grouped);

}  // namespace hap::parallel::functional
