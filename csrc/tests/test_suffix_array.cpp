// SA-IS against a naive sort of all suffixes, on random and adversarial texts, for every
// (symbol width, index width) combination.
#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "core/suffix_array.h"

namespace {

// Suffix i < suffix j in plain lexicographic order (a proper prefix first): the virtual-sentinel order.
template <class Char>
std::vector<int64_t> naive_suffix_array(const std::vector<Char>& s) {
  std::vector<int64_t> sa(s.size());
  std::iota(sa.begin(), sa.end(), int64_t{0});
  std::sort(sa.begin(), sa.end(), [&](int64_t a, int64_t b) {
    return std::lexicographical_compare(s.begin() + a, s.end(), s.begin() + b, s.end());
  });
  return sa;
}

template <class Char, class Idx>
bool matches_naive(const std::vector<Char>& s, int64_t alphabet) {
  std::vector<Idx> sa(s.size(), Idx{-7});
  sssd::build_suffix_array(s.data(), sa.data(), static_cast<int64_t>(s.size()), alphabet);
  const auto want = naive_suffix_array(s);
  for (size_t i = 0; i < s.size(); ++i) {
    if (static_cast<int64_t>(sa[i]) != want[i]) return false;
  }
  return true;
}

template <class Char>
void check_all_index_widths(const std::vector<Char>& s, int64_t alphabet) {
  CHECK((matches_naive<Char, int32_t>(s, alphabet)));
  CHECK((matches_naive<Char, int64_t>(s, alphabet)));
}

template <class Char>
std::vector<Char> random_text(sssd_test::Rng& rng, size_t n, uint64_t alphabet) {
  std::vector<Char> s(n);
  for (auto& c : s) c = static_cast<Char>(rng.below(alphabet));
  return s;
}

}  // namespace

TEST(suffix_array_random_small_alphabets) {
  sssd_test::Rng rng(1);
  for (int round = 0; round < 400; ++round) {
    const size_t n = rng.below(120);
    const uint64_t alphabet = 1 + rng.below(round % 3 == 0 ? 2 : 5);
    check_all_index_widths(random_text<uint16_t>(rng, n, alphabet), static_cast<int64_t>(alphabet));
    check_all_index_widths(random_text<uint32_t>(rng, n, alphabet), static_cast<int64_t>(alphabet));
  }
}

TEST(suffix_array_random_large_alphabets) {
  sssd_test::Rng rng(2);
  for (int round = 0; round < 60; ++round) {
    const size_t n = 1 + rng.below(2000);
    check_all_index_widths(random_text<uint16_t>(rng, n, 65536), 65536);
    check_all_index_widths(random_text<uint32_t>(rng, n, 70001), 70001);
  }
  // an alphabet much larger than the text, symbols at its top
  std::vector<uint32_t> s = {70000, 69999, 70000, 1, 70000};
  check_all_index_widths(s, 70001);
}

TEST(suffix_array_stream_with_separators) {
  // The datastore's use: documents of symbols >= 1, each followed by a separator 0.
  sssd_test::Rng rng(3);
  for (int round = 0; round < 200; ++round) {
    std::vector<uint16_t> s;
    const size_t docs = 1 + rng.below(8);
    for (size_t d = 0; d < docs; ++d) {
      const size_t len = rng.below(12);
      for (size_t i = 0; i < len; ++i) s.push_back(static_cast<uint16_t>(1 + rng.below(3)));
      s.push_back(0);
    }
    check_all_index_widths(s, 4);
  }
}

TEST(suffix_array_edge_cases) {
  check_all_index_widths(std::vector<uint16_t>{}, 1);
  check_all_index_widths(std::vector<uint16_t>{0}, 1);
  check_all_index_widths(std::vector<uint16_t>{5}, 6);
  check_all_index_widths(std::vector<uint16_t>(1000, 7), 8);  // one repeated symbol
  std::vector<uint32_t> inc(300), dec(300), ab(301), fib = {1};
  for (uint32_t i = 0; i < 300; ++i) {
    inc[i] = i;
    dec[i] = 299 - i;
  }
  for (uint32_t i = 0; i < 301; ++i) ab[i] = i % 2;
  check_all_index_widths(inc, 300);
  check_all_index_widths(dec, 300);
  check_all_index_widths(ab, 2);
  // Fibonacci word: many repeated LMS substrings, deep recursion.
  std::vector<uint32_t> prev = {0};
  while (fib.size() < 1000) {
    std::vector<uint32_t> next = fib;
    next.insert(next.end(), prev.begin(), prev.end());
    prev = fib;
    fib = next;
  }
  check_all_index_widths(fib, 2);
  std::vector<uint16_t> periodic;
  for (int i = 0; i < 500; ++i) periodic.push_back(static_cast<uint16_t>(i % 3 == 2 ? 0 : 1 + i % 3));
  check_all_index_widths(periodic, 4);
}

TEST(suffix_array_bad_arguments) {
  std::vector<uint32_t> s = {1, 2, 3};
  std::vector<int32_t> sa32(3);
  std::vector<int64_t> sa64(3);
  CHECK_THROWS(sssd::build_suffix_array(s.data(), sa32.data(), 3, 0), std::invalid_argument);
  CHECK_THROWS(sssd::build_suffix_array(s.data(), sa32.data(), -1, 4), std::invalid_argument);
  // an alphabet the index type cannot count
  CHECK_THROWS(sssd::build_suffix_array(s.data(), sa32.data(), 3, int64_t{1} << 31), std::length_error);
  sssd::build_suffix_array(s.data(), sa64.data(), 3, 4);
  CHECK(sa64[0] == 0 && sa64[1] == 1 && sa64[2] == 2);
}
