// parallel_for: every index once, on the team asked for; exceptions from worker threads rethrown on the
// caller's thread.
#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "core/parallel.h"

#if SSSD_HAVE_OPENMP
#include <omp.h>
#endif

namespace {

struct Custom {
  int index;
};

}  // namespace

TEST(parallel_every_index_once) {
#if SSSD_HAVE_OPENMP
  omp_set_num_threads(4);  // more threads than cores is fine, and exercises the parallel path
#endif
  for (int64_t n : {0, 1, 2, 3, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    sssd::parallel_for(n, [&](int64_t i) { hits[static_cast<size_t>(i)]++; });
    for (const auto& h : hits) CHECK_EQ(h.load(), 1);
  }
}

TEST(parallel_uses_the_team_asked_for) {
#if SSSD_HAVE_OPENMP
  omp_set_num_threads(1);  // the OpenMP default is one thread; `threads` overrides it for one call
#endif
  for (int threads : {1, 3}) {
    std::vector<std::atomic<int>> hits(200);
    std::atomic<int> top{0};  // the largest thread_index() seen: work buffers are indexed by it
    sssd::parallel_for(
        200,
        [&](int64_t i) {
          hits[static_cast<size_t>(i)]++;
          int seen = top.load();
          while (sssd::thread_index() > seen && !top.compare_exchange_weak(seen, sssd::thread_index())) {
          }
        },
        2, threads);
    for (const auto& h : hits) CHECK_EQ(h.load(), 1);
    CHECK(top.load() < sssd::team_size(threads));
  }
  CHECK_EQ(sssd::team_size(0), sssd::max_threads());
  CHECK_EQ(sssd::team_size(5), 5);
}

TEST(parallel_exception_propagates) {
#if SSSD_HAVE_OPENMP
  omp_set_num_threads(4);
#endif
  for (int64_t min_parallel : {1, 2, 1 << 20}) {  // parallel and serial paths
    CHECK_THROWS(sssd::parallel_for(
                     100, [](int64_t i) { if (i == 37) throw std::out_of_range("item 37"); }, min_parallel),
                 std::out_of_range);
    bool caught = false;
    try {
      sssd::parallel_for(
          100, [](int64_t i) { if (i % 10 == 3) throw Custom{static_cast<int>(i)}; }, min_parallel);
    } catch (const Custom& c) {
      caught = c.index % 10 == 3;  // one of the failures, intact
    }
    CHECK(caught);
  }
  // the pool still works after a failed region
  std::atomic<int64_t> sum{0};
  sssd::parallel_for(100, [&](int64_t i) { sum += i; });
  CHECK_EQ(sum.load(), int64_t{4950});
}
