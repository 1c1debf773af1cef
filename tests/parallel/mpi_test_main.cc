// GoogleTest main for tests run under mpirun: initialises MPI, runs every test on every rank,
// and makes the ranks agree on the outcome. Rank 0 prints the usual report; other ranks print
// only their failures, prefixed with the rank. After each test the ranks exchange pass/fail, so
// a test that failed on any rank is reported by rank 0 and fails the whole run; the process
// exits non-zero on every rank if any rank failed. An exception escaping a test body on one rank
// would leave the other ranks waiting in that test's next collective, so it aborts the job at
// once (after printing it). A watchdog ends a rank that hangs anyway (a mismatched collective)
// with a message naming the test, instead of waiting for ctest's timeout; it is re-armed at the
// start of every test, so it bounds one test, not the whole run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "parallel/communicator.h"
#ifdef HAP_HAVE_CUDA
#include "core/cuda/backend.h"
#endif

namespace {

using hap::parallel::Communicator;
using hap::parallel::ReduceOp;

constexpr unsigned kWatchdogSeconds = 60;  // per test
char g_current_test[256] = "(none)";

void on_watchdog(int) {
  const char prefix[] = "mpi_test_main: watchdog expired (a collective hung?) in test ";
  ssize_t ignored = write(STDERR_FILENO, prefix, sizeof prefix - 1);
  ignored = write(STDERR_FILENO, g_current_test, std::strlen(g_current_test));
  ignored = write(STDERR_FILENO, "\n", 1);
  (void)ignored;
  _exit(124);
}

// Prints what a non-zero rank must not lose: failed assertions, with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }

 private:
  int rank_;
};

// After every test: all ranks agree whether it passed anywhere; rank 0 reports other ranks'
// failures. Also keeps the ranks in step between tests.
class RankAgreement : public ::testing::EmptyTestEventListener {
 public:
  explicit RankAgreement(Communicator comm) : comm_(std::move(comm)) {}
  void OnTestStart(const ::testing::TestInfo& info) override {
    std::snprintf(g_current_test, sizeof g_current_test, "%s.%s", info.test_suite_name(),
                  info.name());
    alarm(kWatchdogSeconds);
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed() || std::strstr(r.message(), "thrown in the test body") == nullptr) return;
    std::fprintf(stderr, "[rank %d] exception in %s: aborting every rank\n", comm_.rank(),
                 g_current_test);
    comm_.abort_all(2);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int64_t failed_here = info.result()->Failed() ? 1 : 0;
    const std::vector<int64_t> failed = comm_.allgather(failed_here);
    std::string ranks;
    for (size_t r = 0; r < failed.size(); ++r)
      if (failed[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (!ranks.empty()) {
      any_failed_ = true;
      if (comm_.rank() == 0)
        std::printf("[  FAILED  ] %s.%s failed on rank(s) %s\n", info.test_suite_name(),
                    info.name(), ranks.c_str());
    }
  }
  bool any_failed() const { return any_failed_; }

 private:
  Communicator comm_;
  bool any_failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  hap::parallel::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  Communicator world = Communicator::world();
  // Exactness on GPU ranks (HAP_TEST_DEVICE=cuda...) without a visible GPU: the whole run is
  // skipped (exit 77, which ctest reports as Skipped), on every rank alike.
  if (const char* env = std::getenv("HAP_TEST_DEVICE"); env && std::strncmp(env, "cuda", 4) == 0) {
#ifdef HAP_HAVE_CUDA
    const bool gpu = hap::cuda::device_count() > 0;
#else
    const bool gpu = false;
#endif
    if (!gpu) {
      if (world.rank() == 0)
        std::printf("SKIPPED: HAP_TEST_DEVICE=%s but no GPU is visible to this process\n", env);
      return 77;
    }
  }

  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (world.rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world.rank()));
  }
  auto* agreement = new RankAgreement(world);
  listeners.Append(agreement);  // owned by gtest

  std::signal(SIGALRM, on_watchdog);
  alarm(kWatchdogSeconds);
  const int local = RUN_ALL_TESTS();
  alarm(0);

  const bool failed_anywhere =
      world.allreduce(static_cast<int64_t>(local != 0 || agreement->any_failed()), ReduceOp::Max) !=
      0;
  if (world.rank() == 0)
    std::printf("%s on all %d ranks\n", failed_anywhere ? "FAILED" : "PASSED", world.size());
  std::fflush(stdout);
  return failed_anywhere ? 1 : 0;
}
