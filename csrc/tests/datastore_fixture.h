// Building small datastore files from documents for the tests, and raw file access for crafting
// corrupt ones.
#pragma once
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/datastore.h"

namespace sssd_test {

using Docs = std::vector<std::vector<int32_t>>;

inline void build_file(const std::string& path, const Docs& docs, uint64_t vocab_size,
                       const std::string& fingerprint = "", bool force_sa64 = false) {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};
  for (const auto& d : docs) {
    tokens.insert(tokens.end(), d.begin(), d.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  sssd::DatastoreBuilder b(vocab_size, fingerprint, force_sa64);
  b.add_documents(tokens.data(), static_cast<int64_t>(tokens.size()), offsets.data(),
                  static_cast<int64_t>(docs.size()));
  b.finish(path, nullptr);
}

inline std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(n));
}

}  // namespace sssd_test
