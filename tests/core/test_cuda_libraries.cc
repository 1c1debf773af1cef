// The CUDA libraries HAP opens on first use, as far as a machine without a GPU can check them:
// cuDNN loads from the toolkit (its convolutions need a GPU: tests/gpu/test_cuda_conv.cc), can be
// turned off, and a handle without a GPU is a clear error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#include "core/cuda/cudnn.h"
#endif

namespace hap {
namespace {

#ifdef HAP_HAVE_CUDA
TEST(CudnnLibrary, LoadsFromTheToolkitWithoutAGpuAndCanBeTurnedOff) {
  const char* env = std::getenv("HAP_CUDNN");
  const bool off_by_env = env != nullptr && std::string(env) == "0";
  if (cuda::cudnn() == nullptr) {
    // Only where no cuDNN 9 is installed; the build machines' toolkit has one.
    EXPECT_FALSE(std::filesystem::exists("/usr/local/cuda/lib64/libcudnn.so.9"))
        << "the toolkit's cuDNN did not load: " << cuda::cudnn_unavailable_reason();
    const std::string why = cuda::cudnn_unavailable_reason();
    EXPECT_NE(why.find("libcudnn.so.9"), std::string::npos) << why;
    EXPECT_NE(why.find("HAP_CUDNN_LIBRARY"), std::string::npos) << why;
    EXPECT_FALSE(cuda::cudnn_enabled());
    return;
  }
  EXPECT_EQ(cuda::cudnn_unavailable_reason(), "");
  EXPECT_GE(cuda::cudnn()->version, 90000u);
  EXPECT_EQ(cuda::cudnn_enabled(), !off_by_env);
  cuda::set_cudnn_enabled(false);
  EXPECT_FALSE(cuda::cudnn_enabled());
  cuda::set_cudnn_enabled(true);
  EXPECT_TRUE(cuda::cudnn_enabled());
  if (cuda::device_count() == 0) {
    try {
      cuda::cudnn_handle(0);
      ADD_FAILURE() << "a cuDNN handle without a GPU";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    }
  }
}
#endif

}  // namespace
}  // namespace hap
