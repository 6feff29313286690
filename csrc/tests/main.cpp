// Runs the registered test cases whose name starts with argv[1] (all without an argument).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "check.h"

namespace sssd_test {
namespace {
int g_failures = 0;
}

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

void fail(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "%s:%d: FAILED %s\n", file, line, what.c_str());
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "sssd-test-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

size_t TempDir::count_entries() const {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    (void)entry;
    ++n;
  }
  return n;
}

}  // namespace sssd_test

int main(int argc, char** argv) {
  const char* prefix = argc > 1 ? argv[1] : "";
  int ran = 0;
  for (const auto& c : sssd_test::registry()) {
    if (std::strncmp(c.name, prefix, std::strlen(prefix)) != 0) continue;
    const int before = sssd_test::g_failures;
    try {
      c.fn();
    } catch (const std::exception& e) {
      sssd_test::fail(c.name, 0, std::string("uncaught exception: ") + e.what());
    }
    std::printf("%s %s\n", sssd_test::g_failures == before ? "ok  " : "FAIL", c.name);
    ++ran;
  }
  if (ran == 0) {
    std::fprintf(stderr, "no test matches '%s'\n", prefix);
    return 2;
  }
  std::printf("%d case(s), %d failure(s)\n", ran, sssd_test::g_failures);
  return sssd_test::g_failures == 0 ? 0 : 1;
}
