// Exercised by ctest (check_abort.cmake): the last rank throws while every other rank waits in
// a collective. run_or_abort_all must end the whole job promptly with a non-zero exit code.
#include <cstdio>

#include "core/error.h"
#include "parallel/communicator.h"

int main(int argc, char** argv) {
  hap::parallel::MpiSession mpi(&argc, &argv);
  hap::parallel::Communicator world = hap::parallel::Communicator::world();
  hap::parallel::run_or_abort_all(
      world,
      [&] {
        if (world.rank() == world.size() - 1)
          HAP_CHECK(false, "abort_one_rank: deliberate error on rank ", world.rank());
        world.barrier();  // never completes: the failing rank does not arrive
      },
      3);
  std::printf("abort_one_rank: rank %d was not aborted\n", world.rank());
  return 0;
}
