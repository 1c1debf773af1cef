# Included by ctest before it runs the tests (TEST_INCLUDE_FILES, tests/CMakeLists.txt).
#
# Cluster files in cores (the emulated ones) take one CPU core's FLOP/s from HAP_CORE_FLOPS, else
# from a measurement cached per machine (train/core_rate.h). Tests fix it, so that every test plans
# with the same figure whatever ran before and on whichever CPU; tests of the measurement unset it.
if(NOT DEFINED ENV{HAP_CORE_FLOPS})
  set(ENV{HAP_CORE_FLOPS} 1.6e11)
endif()
