// Numbers and byte counts as configs and the environment write them.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace hap {

// Parses a whole finite decimal number (1, 0.5, 1e-3, +2); false for anything else.
bool parse_number(std::string_view text, double& value);

// A byte count: "4e9", "34359738368", "32GiB", "1.5 GB" (units B, KB, kB, MB, GB, TB, KiB, MiB,
// GiB, TiB; a plain number must be whole); nullopt when malformed or outside [1, 1e15] (1 PB:
// beyond any device, and exact in doubles).
std::optional<std::int64_t> parse_byte_size(std::string_view text);

inline constexpr std::string_view kByteSizeExpectation =
    "a whole number of bytes in [1, 1e15], or a number with a unit B, KB, MB, GB, TB, KiB, MiB, "
    "GiB or TiB (e.g. 32GiB)";

}  // namespace hap
