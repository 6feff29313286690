// The search index stored in the datastore file: written by the builder, loaded on the first search,
// identical to the index built in memory, and every corruption of the section (bit flips, truncation,
// crafted sections with a valid checksum) is a DatastoreError or leaves the results unchanged: never a
// crash, an out-of-bounds read (ASan) or a silently different search.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "core/search.h"
#include "core/search_index.h"
#include "datastore_fixture.h"

namespace {

using sssd::DatastoreError;
using sssd::DatastoreHeader;
using sssd_test::read_bytes;
using sssd_test::write_bytes;

void build_indexed(const std::string& path, const sssd_test::Docs& docs, uint64_t vocab, uint64_t stride,
                   bool sa64 = false) {
  std::vector<int32_t> tokens;
  std::vector<int64_t> offsets{0};
  for (const auto& d : docs) {
    tokens.insert(tokens.end(), d.begin(), d.end());
    offsets.push_back(static_cast<int64_t>(tokens.size()));
  }
  sssd::DatastoreBuilder b(vocab, "", sa64);
  b.set_search_index(stride, 0);
  b.add_documents(tokens.data(), static_cast<int64_t>(tokens.size()), offsets.data(),
                  static_cast<int64_t>(docs.size()));
  b.finish(path, nullptr);
}

sssd_test::Docs random_docs(uint64_t seed, int n_docs, uint64_t alphabet) {
  sssd_test::Rng rng(seed);
  sssd_test::Docs docs(static_cast<size_t>(n_docs));
  for (auto& d : docs) {
    const uint64_t len = rng.below(80);
    for (uint64_t i = 0; i < len; ++i) d.push_back(static_cast<int32_t>(rng.below(alphabet)));
  }
  docs[0].push_back(1);
  return docs;
}

sssd::SearchParams params() {
  sssd::SearchParams p;
  p.max_query_len = 12;
  p.min_query_len = 1;
  p.min_occurrences = 4;
  p.max_samples = 7;
  p.max_depth = 5;
  return p;
}

// All tries of a fixed set of contexts (taken from the corpus, plus random ones), flattened. Throws
// what search throws.
std::vector<int32_t> search_all(const std::string& path, const sssd_test::Docs& docs, uint64_t alphabet) {
  sssd::Datastore ds(path);
  std::vector<std::vector<int32_t>> contexts;
  for (size_t i = 0; i < docs.size(); i += 3) {
    for (size_t j : {1, 2, 5, 13}) {
      if (j <= docs[i].size()) contexts.emplace_back(docs[i].begin(), docs[i].begin() + static_cast<long>(j));
    }
  }
  sssd_test::Rng rng(99);
  for (int i = 0; i < 20; ++i) {
    std::vector<int32_t> c;
    for (uint64_t k = 0, n = 1 + rng.below(6); k < n; ++k) c.push_back(static_cast<int32_t>(rng.below(alphabet)));
    contexts.push_back(c);
  }
  std::vector<sssd::TokenSpan> spans;
  for (const auto& c : contexts) spans.push_back({c.data(), static_cast<int64_t>(c.size())});
  std::vector<sssd::CandidateTrie> tries;
  sssd::search_batch({ds.view()}, spans, params(), tries);
  std::vector<int32_t> flat;
  for (const auto& t : tries) {
    flat.push_back(-7);
    for (auto* f : {&t.tokens, &t.parents, &t.counts, &t.depth, &t.match_len}) flat.insert(flat.end(), f->begin(), f->end());
  }
  return flat;
}

std::vector<int32_t> search_without_index(const std::string& path, const sssd_test::Docs& docs, uint64_t alphabet) {
  setenv("SSSD_SEARCH_INDEX", "off", 1);
  auto out = search_all(path, docs, alphabet);
  unsetenv("SSSD_SEARCH_INDEX");
  return out;
}

DatastoreHeader header_of(const std::vector<unsigned char>& bytes) {
  DatastoreHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  return h;
}

// Rewrites the section's checksum in the header (and reseals it), as a crafted file would.
void fix_checksum(std::vector<unsigned char>& bytes) {
  DatastoreHeader h = header_of(bytes);
  try {
    h.index_checksum = sssd::stored_index_checksum(bytes.data() + h.index_offset, h.index_bytes);
  } catch (const DatastoreError&) {  // the edit changed the section's shape: its checksum cannot be made
  }
  sssd::seal_header(h);
  std::memcpy(bytes.data(), &h, sizeof h);
}

bool search_rejects(const std::string& path, const sssd_test::Docs& docs, uint64_t alphabet) {
  try {
    search_all(path, docs, alphabet);
  } catch (const DatastoreError&) {
    return true;
  }
  return false;
}

}  // namespace

TEST(stored_index_equals_built_and_no_index) {
  unsetenv("SSSD_SEARCH_INDEX");
  sssd_test::TempDir dir;
  int case_no = 0;
  for (uint64_t stride : {2, 4, 64}) {
    for (uint64_t vocab : {6, 70000}) {
      for (bool sa64 : {false, true}) {
        const auto docs = random_docs(stride * 31 + vocab + sa64, 60, vocab == 6 ? 6 : 9);
        const std::string path = dir.file("d" + std::to_string(case_no++) + ".sssd");
        build_indexed(path, docs, vocab, stride, sa64);
        sssd::Datastore ds(path);
        CHECK(ds.header().flags & sssd::kFlagSearchIndex);
        CHECK_EQ(sssd::stored_index_stride(ds.view()), stride);
        const auto stored = sssd::SearchIndex::load(ds.view());
        CHECK(stored->same_as(sssd::SearchIndex(ds.view(), stride)));
        ds.verify(nullptr);
        const uint64_t alphabet = vocab == 6 ? 6 : 9;
        const auto want = search_without_index(path, docs, alphabet);
        CHECK(search_all(path, docs, alphabet) == want);  // the stored index
        setenv("SSSD_SEARCH_INDEX", (std::to_string(stride * 2) + ",1").c_str(), 1);
        CHECK(search_all(path, docs, alphabet) == want);  // another stride: built in memory, stored one ignored
        unsetenv("SSSD_SEARCH_INDEX");
      }
    }
  }
}

TEST(stored_index_min_tokens_and_none) {
  sssd_test::TempDir dir;
  const auto docs = random_docs(5, 20, 5);
  sssd::DatastoreBuilder b(5, "", false);
  CHECK_THROWS(b.set_search_index(3, 0), std::invalid_argument);
  CHECK_THROWS(b.set_search_index(1, 0), std::invalid_argument);
  build_indexed(dir.file("none.sssd"), docs, 5, 0);
  sssd_test::build_file(dir.file("small.sssd"), docs, 5);  // default: below 65,536 tokens, no index
  for (const char* name : {"none.sssd", "small.sssd"}) {
    sssd::Datastore ds(dir.file(name));
    CHECK_EQ(ds.header().flags & sssd::kFlagSearchIndex, 0u);
    CHECK_EQ(ds.header().index_offset, 0u);
    CHECK_EQ(sssd::stored_index_stride(ds.view()), 0u);
  }
}

TEST(stored_index_every_bit_flip_is_caught_or_harmless) {
  unsetenv("SSSD_SEARCH_INDEX");
  sssd_test::TempDir dir;
  const auto docs = random_docs(7, 30, 5);
  const std::string path = dir.file("a.sssd"), bad = dir.file("bad.sssd");
  build_indexed(path, docs, 5, 2);
  const auto want = search_without_index(path, docs, 5);
  const auto bytes = read_bytes(path);
  const DatastoreHeader h = header_of(bytes);
  int rejected = 0, harmless = 0;
  sssd_test::Rng rng(3);
  for (uint64_t at = h.index_offset; at < h.file_size; at += 1 + (at >= h.index_offset + 64 ? rng.below(8) : 0)) {
    // Every byte of the section header, then about one in 4.5 (the test maps a file per flip).
    auto copy = bytes;
    copy[at] ^= static_cast<unsigned char>(1u << (at % 8));
    write_bytes(bad, copy, copy.size());
    try {
      if (search_all(bad, docs, 5) == want) {
        // The version fields (bytes 8..15: the section is then ignored and the index built in memory)
        // or the zero padding between parts.
        const uint64_t rel = at - h.index_offset;
        if (rel < 8 || rel >= 16) ++harmless;
      } else {
        CHECK(false);  // silently different: never
      }
    } catch (const DatastoreError&) {
      ++rejected;
    }
  }
  CHECK(rejected > 0);
  CHECK(harmless < 16);  // only the zero padding between parts is outside the checksum
}

TEST(stored_index_truncations_are_rejected_at_open) {
  sssd_test::TempDir dir;
  const auto docs = random_docs(8, 30, 5);
  const std::string path = dir.file("a.sssd"), bad = dir.file("bad.sssd");
  build_indexed(path, docs, 5, 4);
  const auto bytes = read_bytes(path);
  const DatastoreHeader h = header_of(bytes);
  for (uint64_t n = h.index_offset - 64; n < h.file_size; n += 5) {
    write_bytes(bad, bytes, static_cast<size_t>(n));
    CHECK_THROWS(sssd::Datastore d(bad), DatastoreError);
  }
}

TEST(stored_index_crafted_sections_with_valid_checksums) {
  unsetenv("SSSD_SEARCH_INDEX");
  sssd_test::TempDir dir;
  const auto docs = random_docs(9, 40, 6);
  const std::string path = dir.file("a.sssd"), bad = dir.file("bad.sssd");
  build_indexed(path, docs, 6, 2);
  const auto bytes = read_bytes(path);
  const DatastoreHeader h = header_of(bytes);
  sssd::StoredIndexHeader sh;
  std::memcpy(&sh, bytes.data() + h.index_offset, sizeof sh);
  const uint64_t keys = h.index_offset + sizeof sh;
  const uint64_t buckets = (keys + sh.num_samples * 16 * 2 + 7) / 8 * 8;
  const uint64_t pairs = (buckets + 4 * sh.num_buckets + 7) / 8 * 8;
  CHECK_EQ(pairs + 16 * sh.num_pair_slots, h.file_size);
  auto expect_rejected = [&](auto edit, const char* what) {
    auto copy = bytes;
    edit(copy);
    fix_checksum(copy);
    write_bytes(bad, copy, copy.size());
    sssd::Datastore ds(bad);  // open stays O(1): the section is checked on the first search
    if (!search_rejects(bad, docs, 6)) sssd_test::fail(__FILE__, __LINE__, std::string("accepted: ") + what);
  };
  auto put32 = [](std::vector<unsigned char>& b, uint64_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); };
  auto put64 = [](std::vector<unsigned char>& b, uint64_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); };
  const uint64_t n = sh.num_samples;
  expect_rejected([&](auto& b) { put32(b, buckets + 4 * 3, static_cast<uint32_t>(n + 5)); }, "bucket past the end");
  expect_rejected([&](auto& b) { put32(b, buckets + 4 * 2, static_cast<uint32_t>(n)); }, "buckets out of order");
  expect_rejected([&](auto& b) { b[keys + 2 * 16 * (n / 2)] ^= 1; }, "a wrong key");
  expect_rejected([&](auto& b) { put64(b, h.index_offset + 24, 8); }, "another stride");
  expect_rejected([&](auto& b) { put64(b, h.index_offset + 32, n + 1); }, "sample count");
  expect_rejected(
      [&](auto& b) {
        for (uint64_t s = 0; s < sh.num_pair_slots; ++s) put64(b, pairs + 16 * s, 0x100000001ull + s);
      },
      "a pair table without an empty slot");
  expect_rejected(
      [&](auto& b) {
        for (uint64_t s = 0; s < sh.num_pair_slots; ++s) {
          uint64_t key;
          std::memcpy(&key, b.data() + pairs + 16 * s, 8);
          if (key != 0) put32(b, pairs + 16 * s + 12, static_cast<uint32_t>(n + 3));
        }
      },
      "a pair range past the end");
}

TEST(stored_index_of_another_version_is_ignored) {
  // A section of an unknown version (a later sssd): searched with an index built in memory instead.
  unsetenv("SSSD_SEARCH_INDEX");
  sssd_test::TempDir dir;
  const auto docs = random_docs(11, 40, 6);
  const std::string path = dir.file("a.sssd"), other = dir.file("other.sssd");
  build_indexed(path, docs, 6, 2);
  auto bytes = read_bytes(path);
  const DatastoreHeader h = header_of(bytes);
  bytes[h.index_offset + 8] = 9;  // version 9
  fix_checksum(bytes);
  write_bytes(other, bytes, bytes.size());
  sssd::Datastore ds(other);
  CHECK_EQ(sssd::stored_index_stride(ds.view()), 0u);
  CHECK(search_all(other, docs, 6) == search_without_index(path, docs, 6));
}

TEST(stored_index_header_fields_are_checked_at_open) {
  sssd_test::TempDir dir;
  const std::string path = dir.file("a.sssd"), bad = dir.file("bad.sssd");
  build_indexed(path, random_docs(10, 30, 5), 5, 2);
  const auto bytes = read_bytes(path);
  auto reject = [&](auto edit) {
    auto copy = bytes;
    DatastoreHeader h = header_of(copy);
    edit(h);
    sssd::seal_header(h);
    std::memcpy(copy.data(), &h, sizeof h);
    write_bytes(bad, copy, copy.size());
    CHECK_THROWS(sssd::Datastore d(bad), DatastoreError);
  };
  reject([](DatastoreHeader& h) { h.index_offset = h.sa_offset; });          // overlaps the suffix array
  reject([](DatastoreHeader& h) { h.index_offset += 1; });                   // misaligned
  reject([](DatastoreHeader& h) { h.index_bytes += 64; });                   // past the end
  reject([](DatastoreHeader& h) { h.index_offset = ~uint64_t{0} - 63; });   // overflow
  {
    auto copy = bytes;  // a valid header whose section is smaller than its own header: search rejects
    DatastoreHeader h = header_of(copy);
    h.index_bytes = 32;
    sssd::seal_header(h);
    std::memcpy(copy.data(), &h, sizeof h);
    write_bytes(bad, copy, copy.size());
    sssd::Datastore ds(bad);
    CHECK_THROWS(sssd::stored_index_stride(ds.view()), DatastoreError);
  }
}
