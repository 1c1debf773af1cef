// Byte counts as cluster files and HAP_CUDA_MEMORY_CAP write them.
#include <gtest/gtest.h>

#include "core/byte_size.h"

namespace hap {
namespace {

TEST(ByteSize, PlainNumbersAndUnits) {
  EXPECT_EQ(parse_byte_size("34359738368"), int64_t{34359738368});
  EXPECT_EQ(parse_byte_size("4e9"), int64_t{4000000000});
  EXPECT_EQ(parse_byte_size("32GiB"), int64_t{32} << 30);
  EXPECT_EQ(parse_byte_size("1.5 GB"), int64_t{1500000000});
  EXPECT_EQ(parse_byte_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(parse_byte_size("1kB"), int64_t{1000});
}

TEST(ByteSize, MalformedOrOutOfRangeIsNothing) {
  for (const char* bad : {"", "GiB", "12X", "1.5", "0", "-3MB", "2e15", "nan", "1 2MB", "3M"})
    EXPECT_FALSE(parse_byte_size(bad).has_value()) << bad;
}

}  // namespace
}  // namespace hap
