#include "core/datastore_format.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.h"

namespace sssd {

uint64_t fnv1a64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64 offset basis
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;  // FNV 64 prime
  }
  return h;
}

namespace {
inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull;
}  // namespace

uint64_t checksum64(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {kP1 + kP2, kP2, 0, 0 - kP1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * static_cast<size_t>(l), 8);
      lane[l] = rotl64(lane[l] + w * kP2, 31) * kP1;
    }
  }
  uint64_t h = rotl64(lane[0], 1) + rotl64(lane[1], 7) + rotl64(lane[2], 12) + rotl64(lane[3], 18);
  h += static_cast<uint64_t>(n);
  for (; i < n; ++i) h = rotl64(h ^ (p[i] * kP3), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

uint32_t token_width_for_vocab(uint64_t vocab_size) {
  if (vocab_size == 0) throw std::invalid_argument("vocab_size must be at least 1");
  if (vocab_size > kMaxVocab) {
    throw std::invalid_argument("vocab_size " + std::to_string(vocab_size) +
                                " is too large: token ids must fit int32 (vocab_size <= 2^31)");
  }
  return vocab_size <= kMaxVocabUint16 ? 2 : 4;
}

uint64_t align_section(uint64_t x) { return (x + kSectionAlign - 1) / kSectionAlign * kSectionAlign; }

uint64_t content_end(const DatastoreHeader& h) {
  return (h.flags & kFlagSearchIndex) ? h.index_offset : h.file_size;
}

uint64_t content_checksum(const unsigned char* file, const DatastoreHeader& h) {
  constexpr uint64_t kBlock = uint64_t{1} << 24;
  const uint64_t begin = h.stream_offset, end = content_end(h);
  const uint64_t bytes = end > begin ? end - begin : 0;
  std::vector<uint64_t> blocks(static_cast<size_t>((bytes + kBlock - 1) / kBlock));
  parallel_for(static_cast<int64_t>(blocks.size()), [&](int64_t k) {
    const uint64_t at = static_cast<uint64_t>(k) * kBlock;
    blocks[static_cast<size_t>(k)] = checksum64(file + begin + at, static_cast<size_t>(std::min(kBlock, bytes - at)));
  });
  return checksum64(blocks.data(), blocks.size() * sizeof(uint64_t));
}

namespace {

uint64_t align_up(uint64_t x) { return align_section(x); }

// a + b and a * b with overflow detection (header fields are untrusted).
bool add_ok(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_add_overflow(a, b, out); }
bool mul_ok(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

void check_section(const char* name, uint64_t offset, uint64_t count, uint64_t width, uint64_t file_size) {
  uint64_t bytes = 0, end = 0;
  if (offset < sizeof(DatastoreHeader) || offset % kSectionAlign != 0) {
    throw DatastoreError(std::string("datastore header: ") + name + " section offset is invalid");
  }
  if (!mul_ok(count, width, &bytes) || !add_ok(offset, bytes, &end) || end > file_size) {
    throw DatastoreError(std::string("datastore is truncated or corrupt: the ") + name +
                         " section runs past the end of the file");
  }
}

}  // namespace

DatastoreHeader make_header(uint64_t vocab_size, uint64_t num_tokens, uint64_t num_documents,
                            const std::string& fingerprint, bool force_sa64) {
  if (fingerprint.size() >= kFingerprintBytes) {
    throw std::invalid_argument("tokenizer fingerprint is longer than 119 bytes");
  }
  DatastoreHeader h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kDatastoreMagic, sizeof h.magic);
  h.version = kDatastoreVersion;
  h.token_width = token_width_for_vocab(vocab_size);
  h.vocab_size = vocab_size;
  h.num_tokens = num_tokens;
  h.num_documents = num_documents;
  h.stream_length = num_tokens + num_documents;
  const bool small = h.stream_length < static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  h.sa_width = (small && !force_sa64) ? 4 : 8;
  h.stream_offset = align_up(sizeof(DatastoreHeader));
  h.doc_offsets_offset = align_up(h.stream_offset + h.stream_length * h.token_width);
  h.sa_offset = align_up(h.doc_offsets_offset + (num_documents + 1) * 8);
  h.file_size = h.sa_offset + num_tokens * h.sa_width;
  std::memcpy(h.fingerprint, fingerprint.data(), fingerprint.size());
  seal_header(h);
  return h;
}

void seal_header(DatastoreHeader& h) {
  h.header_checksum = fnv1a64(&h, offsetof(DatastoreHeader, header_checksum));
}

void validate_header(const DatastoreHeader& h, uint64_t actual_file_size) {
  if (std::memcmp(h.magic, kDatastoreMagic, sizeof h.magic) != 0) {
    throw DatastoreError("not an sssd datastore (bad magic bytes)");
  }
  if (h.version != kDatastoreVersion) {
    throw DatastoreError("unsupported datastore format version " + std::to_string(h.version) +
                         " (this sssd reads version " + std::to_string(kDatastoreVersion) +
                         "); rebuild it with build-datastore");
  }
  if (h.header_checksum != fnv1a64(&h, offsetof(DatastoreHeader, header_checksum))) {
    throw DatastoreError("datastore header checksum mismatch: the file is corrupt");
  }
  if (h.file_size != actual_file_size) {
    throw DatastoreError("datastore is truncated or corrupt: header says " + std::to_string(h.file_size) +
                         " bytes, file has " + std::to_string(actual_file_size));
  }
  if (h.vocab_size == 0 || h.vocab_size > kMaxVocab) {
    throw DatastoreError("datastore header: invalid vocab_size");
  }
  if (h.token_width != token_width_for_vocab(h.vocab_size)) {
    throw DatastoreError("datastore header: token width does not match the vocabulary size");
  }
  if (h.sa_width != 4 && h.sa_width != 8) throw DatastoreError("datastore header: invalid sa_width");
  uint64_t stream_length = 0, docs_plus_one = 0;
  if (!add_ok(h.num_tokens, h.num_documents, &stream_length) || stream_length != h.stream_length ||
      !add_ok(h.num_documents, 1, &docs_plus_one)) {
    throw DatastoreError("datastore header: inconsistent token and document counts");
  }
  if (h.sa_width == 4 && h.stream_length >= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    throw DatastoreError("datastore header: int32 suffix array for a stream past 2^31 symbols");
  }
  if (h.num_tokens > 0 && h.num_documents == 0) {
    throw DatastoreError("datastore header: tokens without documents");
  }
  if (h.fingerprint[kFingerprintBytes - 1] != '\0') {
    throw DatastoreError("datastore header: tokenizer fingerprint is not terminated");
  }
  check_section("token stream", h.stream_offset, h.stream_length, h.token_width, actual_file_size);
  check_section("document offsets", h.doc_offsets_offset, docs_plus_one, 8, actual_file_size);
  check_section("suffix array", h.sa_offset, h.num_tokens, h.sa_width, actual_file_size);
  if (h.flags & kFlagSearchIndex) {
    // The suffix array's end cannot overflow: check_section just bounded it by the file size.
    if (h.index_offset < h.sa_offset + h.num_tokens * h.sa_width) {
      throw DatastoreError("datastore header: the search index section overlaps the suffix array");
    }
    check_section("search index", h.index_offset, h.index_bytes, 1, actual_file_size);
  }
}

}  // namespace sssd
