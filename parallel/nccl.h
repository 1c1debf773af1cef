// The NCCL backend (parallel/backend.h): collectives on CUDA tensors through NCCL, one GPU per
// rank, bootstrapped over a host backend (MPI): rank 0 makes NCCL's unique id, the host backend
// broadcasts it, every rank joins. CPU tensors (the scalar helpers' losses and flags) go through
// the host backend. NCCL is opened on first use (dlopen of libnccl.so.2: HAP_NCCL_LIBRARY, the
// library path, the CUDA toolkit's folders), so a build or run that never asks for it does not
// need it. Operations are queued on the default stream, ordered with the kernels; sums are
// NCCL's (not the rank-order sums of the MPI backend: equal to rounding). Uneven layouts run as
// one NCCL group: a broadcast per block (all-gather), a reduce per block (reduce-scatter), or
// sends and receives (all-to-all). Built with the CUDA backend; elsewhere making one is an error.
#pragma once
#include <memory>
#include <string>

#include "parallel/backend.h"

namespace hap::parallel {

// Why NCCL cannot be used by this process ("" when it can: the library opens and has every
// function the backend calls).
std::string nccl_unavailable_reason();

// The NCCL backend over the ranks of `host` (which must carry CPU tensors), this rank on GPU
// `device`. Collective over `host`: every rank calls it. Throws naming the reason when NCCL
// cannot be opened or a rank's device is not a visible GPU; two ranks on one GPU are refused
// (NCCL cannot run them: use the MPI backend staged through the host).
std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Backend> host, int device);

}  // namespace hap::parallel
