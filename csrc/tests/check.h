// A tiny test harness (no external framework): TEST(name) registers a case, CHECK* record failures with
// file:line and keep going, main.cpp runs the cases whose name starts with the prefix given on the
// command line. Test names start with their group (suffix_array_..., format_..., ...).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace sssd_test {

struct Case {
  const char* name;
  void (*fn)();
};
std::vector<Case>& registry();
void fail(const char* file, int line, const std::string& what);

struct Register {
  Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

// A fresh directory under the system temp dir, removed with everything in it.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  size_t count_entries() const;

 private:
  std::filesystem::path path_;
};

// Deterministic pseudo-random numbers (splitmix64) so every run tests the same inputs.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t s_;
};

}  // namespace sssd_test

#define TEST(name)                                                \
  static void name();                                             \
  static const sssd_test::Register name##_registration(#name, name); \
  static void name()

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) sssd_test::fail(__FILE__, __LINE__, "CHECK(" #cond ")"); \
  } while (0)

#define CHECK_EQ(a, b)                                                                        \
  do {                                                                                        \
    const auto& check_a_ = (a);                                                               \
    const auto& check_b_ = (b);                                                               \
    if (!(check_a_ == check_b_)) {                                                            \
      sssd_test::fail(__FILE__, __LINE__,                                                     \
                      "CHECK_EQ(" #a ", " #b "): " + std::to_string(check_a_) + " != " +      \
                          std::to_string(check_b_));                                          \
    }                                                                                         \
  } while (0)

// expr must throw exactly a Type (or subclass); anything else, or nothing, is a failure.
#define CHECK_THROWS(expr, Type)                                                              \
  do {                                                                                        \
    bool check_caught_ = false;                                                               \
    std::string check_other_ = "nothing";                                                     \
    try {                                                                                     \
      expr;                                                                                   \
    } catch (const Type&) {                                                                   \
      check_caught_ = true;                                                                   \
    } catch (const std::exception& e) {                                                       \
      check_other_ = e.what();                                                                \
    } catch (...) {                                                                           \
      check_other_ = "a non-std exception";                                                   \
    }                                                                                         \
    if (!check_caught_) {                                                                     \
      sssd_test::fail(__FILE__, __LINE__, "CHECK_THROWS(" #expr ", " #Type "): got " + check_other_); \
    }                                                                                         \
  } while (0)
