// A driver for a fuzz target where libFuzzer is not available (the GCC build; the CI smoke test).
// It runs every seed file, then mutations of them (bit flips, byte and integer overwrites,
// truncations, erasures, insertions, duplications, splices of two seeds, JSON/YAML tokens) drawn
// from a seeded PRNG, so that a run is reproducible: the same seeds and --seed give the same
// inputs. It stops after --runs mutated inputs or --max-seconds, whichever comes first.
//
//   fuzz_plan [--runs N] [--max-seconds S] [--seed K] [--max-len BYTES] [--expect-read]
//             [--timeout S] [--rss-limit-mb MB] [--artifact-prefix P] PATH...
//
// As under libFuzzer, an input may take at most --timeout seconds (default 10) and the process
// at most --rss-limit-mb of address space (default 4096; an allocation beyond it throws
// std::bad_alloc, which escapes the target): a reader that hangs or allocates without end fails
// the test instead of holding it until ctest's timeout or the machine out of memory.
//
// PATH: seed files, or folders of them. Exit codes: 0 every input ended as the target expects;
// 1 an exception escaped the target or an input ran over --timeout (the input is saved as
// P<target>-crash-<hash> or P<target>-timeout-<hash>, or with HAP_FUZZ_KEEP_GOING=DIR an
// exception lets the run go on and DIR keeps one input per kind); 2 a usage
// error or no seed file; 3 --expect-read and no seed file was read (the seeds no longer fit the
// reader, e.g. after a format change: regenerate them). A crash input replays with --runs 0 FILE.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::uint8_t>;

// SplitMix64: small, fast, and the same sequence on every platform (unlike std:: distributions).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n >= 1 (the modulo bias is irrelevant here).
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }

 private:
  std::uint64_t state_;
};

// Integers that sit on the edges readers check: sizes, counts, offsets, dims.
constexpr std::array<std::uint64_t, 16> kInterestingIntegers = {0,
                                                                1,
                                                                2,
                                                                7,
                                                                8,
                                                                0x7f,
                                                                0x80,
                                                                0xff,
                                                                0x7fff,
                                                                0xffff,
                                                                0x7fffffff,
                                                                0x80000000ull,
                                                                0xffffffffull,
                                                                0x7fffffffffffffffull,
                                                                0x8000000000000000ull,
                                                                0xffffffffffffffffull};
// Tokens of the text formats (YAML, JSON, numbers) that random bytes rarely produce.
constexpr std::array<std::string_view, 24> kTextTokens = {
    "{",  "}",  "[",      "]",   "\"",     ":",          ",",
    "\n", " ",  "-",      "&a ", "*a",     "!!",         "'",
    "0",  "-1", "1e308",  "nan", "1e-320", "2147483648", "9223372036854775808",
    "~",  "\t", "\\u0000"};

Bytes read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void mutate_once(Bytes& x, const std::vector<Bytes>& seeds, Rng& rng) {
  switch (rng.below(9)) {
    case 0:  // flip a bit
      if (!x.empty()) {
        x[rng.below(x.size())] ^= static_cast<std::uint8_t>(1u << rng.below(8));
      }
      break;
    case 1:  // overwrite a byte
      if (!x.empty()) {
        x[rng.below(x.size())] = static_cast<std::uint8_t>(rng.next());
      }
      break;
    case 2: {  // overwrite 1, 2, 4 or 8 bytes with an interesting little-endian integer
      const std::size_t width = std::size_t{1} << rng.below(4);
      if (x.size() >= width) {
        const std::uint64_t v = kInterestingIntegers[rng.below(kInterestingIntegers.size())];
        const std::size_t at = rng.below(x.size() - width + 1);
        for (std::size_t i = 0; i < width; ++i) {
          x[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
        }
      }
      break;
    }
    case 3:  // truncate
      x.resize(rng.below(x.size() + 1));
      break;
    case 4: {  // erase a range
      if (!x.empty()) {
        const std::size_t at = rng.below(x.size());
        const std::size_t n = 1 + rng.below(std::min<std::size_t>(x.size() - at, 64));
        x.erase(x.begin() + static_cast<std::ptrdiff_t>(at),
                x.begin() + static_cast<std::ptrdiff_t>(at + n));
      }
      break;
    }
    case 5: {  // insert random bytes
      const std::size_t at = rng.below(x.size() + 1);
      const std::size_t n = 1 + rng.below(16);
      x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), n, 0);
      for (std::size_t i = at; i < at + n; ++i) x[i] = static_cast<std::uint8_t>(rng.next());
      break;
    }
    case 6: {  // duplicate a range of the input somewhere else in it
      if (!x.empty()) {
        const std::size_t from = rng.below(x.size());
        const std::size_t n = 1 + rng.below(std::min<std::size_t>(x.size() - from, 256));
        const Bytes part(x.begin() + static_cast<std::ptrdiff_t>(from),
                         x.begin() + static_cast<std::ptrdiff_t>(from + n));
        const std::size_t at = rng.below(x.size() + 1);
        x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), part.begin(), part.end());
      }
      break;
    }
    case 7: {  // splice: a prefix of this input, then a suffix of a seed
      const Bytes& other = seeds[rng.below(seeds.size())];
      const std::size_t keep = rng.below(x.size() + 1);
      const std::size_t from = rng.below(other.size() + 1);
      x.resize(keep);
      x.insert(x.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
      break;
    }
    default: {  // insert or overwrite with a token of the text formats
      const std::string_view token = kTextTokens[rng.below(kTextTokens.size())];
      const std::size_t at = rng.below(x.size() + 1);
      if (rng.below(2) == 0 || at + token.size() > x.size()) {
        x.insert(x.begin() + static_cast<std::ptrdiff_t>(at), token.begin(), token.end());
      } else {
        std::copy(token.begin(), token.end(), x.begin() + static_cast<std::ptrdiff_t>(at));
      }
      break;
    }
  }
}

Bytes mutate(const std::vector<Bytes>& seeds, Rng& rng, std::size_t max_len) {
  Bytes x = seeds[rng.below(seeds.size())];
  const std::size_t n = 1 + rng.below(4);
  for (std::size_t i = 0; i < n; ++i) mutate_once(x, seeds, rng);
  if (x.size() > max_len) x.resize(max_len);
  return x;
}

std::uint64_t fnv1a(const std::uint8_t* data, std::size_t size) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}
std::uint64_t fnv1a(const Bytes& x) { return fnv1a(x.data(), x.size()); }

// The input being run, for the timeout handler (which may only call async-signal-safe functions:
// it formats the file name itself and writes with open/write).
struct Running {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::string prefix;  // <artifact prefix><target>-timeout-
  unsigned timeout_s = 10;
};
Running running;

void write_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return;
    c += w;
    n -= static_cast<std::size_t>(w);
  }
}

extern "C" void on_timeout(int) {
  char path[4096];
  const std::size_t len = std::min(running.prefix.size(), sizeof path - 17);
  std::copy_n(running.prefix.data(), len, path);
  const std::uint64_t h = fnv1a(running.data, running.size);
  for (int i = 0; i < 16; ++i) path[len + i] = "0123456789abcdef"[(h >> (60 - 4 * i)) & 15];
  path[len + 16] = '\0';
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) {
    write_all(fd, running.data, running.size);
    ::close(fd);
  }
  constexpr char kMessage[] = "fuzz: an input ran over --timeout; it is saved as ";
  write_all(2, kMessage, sizeof kMessage - 1);
  write_all(2, path, len + 16);
  write_all(2, "\n", 1);
  ::_exit(1);
}

// Runs one input; on an escaping exception saves it and exits 1.
void run_one(const Bytes& x, const std::string& artifact_prefix, const std::string& target,
             const std::string& origin) {
  running.data = x.data();
  running.size = x.size();
  try {
    ::alarm(running.timeout_s);
    LLVMFuzzerTestOneInput(x.data(), x.size());
    ::alarm(0);
  } catch (...) {
    ::alarm(0);
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(x)));
    const std::string path = artifact_prefix + target + "-crash-" + hash;
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(x.data()), static_cast<std::streamsize>(x.size()));
    std::fprintf(stderr, "%s: FAILED on %s (%zu bytes); the input is saved as %s\n", target.c_str(),
                 origin.c_str(), x.size(), path.c_str());
    std::exit(1);
  }
}

[[noreturn]] void usage(const char* prog, const std::string& problem) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [--runs N] [--max-seconds S] [--seed K] [--max-len BYTES] "
               "[--expect-read] [--timeout S] [--rss-limit-mb MB] [--artifact-prefix P] "
               "PATH...\n",
               prog, problem.c_str(), prog);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string target = fs::path(argv[0]).filename().string();
  std::uint64_t runs = 2000, seed = 1;
  double max_seconds = 5;
  std::size_t max_len = 64 * 1024;
  bool expect_read = false;
  std::uint64_t rss_limit_mb = 4096;
  std::string artifact_prefix;
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], arg + " needs a value");
      return argv[++i];
    };
    try {
      if (arg == "--runs") {
        runs = std::stoull(value());
      } else if (arg == "--max-seconds") {
        max_seconds = std::stod(value());
      } else if (arg == "--seed") {
        seed = std::stoull(value());
      } else if (arg == "--max-len") {
        max_len = std::stoull(value());
      } else if (arg == "--expect-read") {
        expect_read = true;
      } else if (arg == "--timeout") {
        running.timeout_s = static_cast<unsigned>(std::stoul(value()));
      } else if (arg == "--rss-limit-mb") {
        rss_limit_mb = std::stoull(value());
      } else if (arg == "--artifact-prefix") {
        artifact_prefix = value();
      } else if (arg.starts_with("--")) {
        usage(argv[0], "unknown option " + arg);
      } else if (fs::is_directory(arg)) {
        for (const auto& e : fs::directory_iterator(arg)) {
          if (e.is_regular_file()) files.push_back(e.path());
        }
      } else if (fs::is_regular_file(arg)) {
        files.push_back(arg);
      } else {
        usage(argv[0], "'" + arg + "' is neither a file nor a folder");
      }
    } catch (const std::logic_error&) {  // stoull / stod on a malformed number
      usage(argv[0], "bad value for " + arg);
    }
  }
  if (files.empty()) usage(argv[0], "no seed files");
  std::sort(files.begin(), files.end());  // directory order differs between file systems
  running.prefix = artifact_prefix + target + "-timeout-";
  std::signal(SIGALRM, on_timeout);
  if (rss_limit_mb > 0) {
    const rlimit limit{rss_limit_mb << 20, rss_limit_mb << 20};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) std::perror("fuzz: setrlimit(RLIMIT_AS)");
  }

  const auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<Bytes> seeds;
  for (const fs::path& f : files) {
    seeds.push_back(read_file(f));
    run_one(seeds.back(), artifact_prefix, target, f.string());
  }
  const hap::fuzz::Outcomes from_seeds = hap::fuzz::outcomes();
  Rng rng(seed);
  std::uint64_t done = 0;
  while (done < runs && seconds() < max_seconds) {
    const Bytes x = mutate(seeds, rng, max_len);
    run_one(x, artifact_prefix, target,
            "mutation " + std::to_string(done) + " (--seed " + std::to_string(seed) + ")");
    ++done;
  }
  const hap::fuzz::Outcomes all = hap::fuzz::outcomes();
  std::printf(
      "%s: %zu seeds (%llu read, %llu refused), %llu mutations (%llu read, %llu refused) in "
      "%.2f s; %llu inputs let an exception other than hap::Error escape\n",
      target.c_str(), seeds.size(), static_cast<unsigned long long>(from_seeds.read),
      static_cast<unsigned long long>(from_seeds.refused), static_cast<unsigned long long>(done),
      static_cast<unsigned long long>(all.read - from_seeds.read),
      static_cast<unsigned long long>(all.refused - from_seeds.refused), seconds(),
      static_cast<unsigned long long>(all.findings));
  if (all.findings > 0) return 1;  // kept under HAP_FUZZ_KEEP_GOING
  if (expect_read && from_seeds.read == 0) {
    std::fprintf(stderr,
                 "%s: no seed file was read: the seed corpus no longer fits the reader "
                 "(regenerate it with fuzz_write_seeds)\n",
                 target.c_str());
    return 3;
  }
  return 0;
}
