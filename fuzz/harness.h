// What every fuzz target shares. The readers take paths, so the fuzzer's input is first written to
// a file of this process; and one rule is checked on every input: a reader returns, or throws
// hap::Error (ConfigError included) for input it refuses. Any other exception (an InternalError,
// std::bad_alloc, a yaml-cpp or nlohmann exception, ...) escapes to the driver as a finding:
// libFuzzer reports it as a crash (std::terminate), the standalone driver as a failure.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace hap::fuzz {

// How the inputs of this process ended so far.
struct Outcomes {
  std::uint64_t read = 0;      // the reader returned (and the target's checks held)
  std::uint64_t refused = 0;   // the reader threw hap::Error
  std::uint64_t findings = 0;  // another exception escaped (counted under HAP_FUZZ_KEEP_GOING)
};
Outcomes& outcomes();

// A file of this process named after `name` (in /dev/shm when it exists, else the temporary
// folder), removed when the process exits normally.
std::string scratch_path(std::string_view name);

// Writes `size` bytes to scratch_path(name) and returns its path.
std::string write_scratch(std::string_view name, const std::uint8_t* data, std::size_t size);

// Writes the input to scratch_path(name) and calls read(path). hap::Error is the expected refusal
// and is swallowed; any other exception is printed with its type and rethrown, unless the
// environment variable HAP_FUZZ_KEEP_GOING names a folder: then the first input of each kind of
// exception is kept there (finding-<hash>, with a .txt naming the exception) and the run goes on.
void read_input(std::string_view name, const std::uint8_t* data, std::size_t size,
                const std::function<void(const std::string& path)>& read);

// A property of a read input that does not hold (a round trip that changes what was read): throws
// hap::InternalError, which read_input lets escape.
[[noreturn]] void property_failed(const std::string& what);

}  // namespace hap::fuzz
