// parallel_for: OpenMP over an index range with exceptions captured per thread and rethrown after the
// region (an exception must never escape an OpenMP region: that would call std::terminate).
#pragma once
#include <cstdint>
#include <exception>
#include <atomic>
#include <mutex>
#if SSSD_HAVE_OPENMP
#include <omp.h>
#endif

namespace sssd {

inline bool have_openmp() { return SSSD_HAVE_OPENMP != 0; }

inline int max_threads() {
#if SSSD_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// The calling thread's index in the current parallel_for team: [0, max_threads()); 0 outside one.
inline int thread_index() {
#if SSSD_HAVE_OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Threads a parallel_for asked for `threads` uses: `threads` itself, or the OpenMP default when it is 0.
inline int team_size(int threads) { return threads > 0 ? threads : max_threads(); }

// Calls fn(i) for i in [0, n) on team_size(threads) threads (thread_index() < that). Runs serially, with
// no OpenMP region at all, when n < min_parallel (thread start-up costs more than the work for tiny
// batches) or the team is one thread. The first exception thrown by any iteration is rethrown on the
// caller's thread; remaining iterations are skipped once one failed.
template <class Fn>
void parallel_for(int64_t n, Fn&& fn, int64_t min_parallel = 2, int threads = 0) {
  if (n <= 0) return;
#if SSSD_HAVE_OPENMP
  const int team = team_size(threads);
  if (n >= min_parallel && team > 1) {
    std::exception_ptr error;
    std::mutex error_mutex;
    std::atomic<bool> failed{false};
#pragma omp parallel for num_threads(team) schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      if (failed.load(std::memory_order_relaxed)) continue;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return;
  }
#endif
  (void)min_parallel;
  (void)threads;
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace sssd
