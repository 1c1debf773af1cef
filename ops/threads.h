// Thread count for the CPU kernels (OpenMP) and for OpenBLAS GEMM.
#pragma once

namespace hap {

// n <= 0 means all cores. Sets OpenMP's and OpenBLAS's thread counts together.
void set_num_threads(int n);
int num_threads();

}  // namespace hap
