// The file format: checksum, width rules, header validation of crafted and truncated buffers, and
// opening every truncation of a real file (under ASan: never an out-of-bounds read).
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>

#include "check.h"
#include "core/datastore.h"
#include "core/datastore_format.h"
#include "datastore_fixture.h"

namespace {

using sssd::DatastoreError;
using sssd::DatastoreHeader;

// validate_header(h) for a header mutated by `edit` and resealed (so the field check is reached).
template <class Edit>
bool rejected_after(Edit edit) {
  DatastoreHeader h = sssd::make_header(100, 40, 3, "tok:0123456789abcdef", false);
  edit(h);
  sssd::seal_header(h);
  try {
    sssd::validate_header(h, h.file_size);
  } catch (const DatastoreError&) {
    return true;
  }
  return false;
}

}  // namespace

TEST(format_fnv1a64_test_vectors) {
  CHECK(sssd::fnv1a64("", 0) == 0xcbf29ce484222325ull);  // the offset basis
  CHECK(sssd::fnv1a64("a", 1) == 0xaf63dc4c8601ec8cull);
  CHECK(sssd::fnv1a64("foobar", 6) == 0x85944171f73967e8ull);
}

TEST(format_token_width_rule) {
  CHECK_EQ(sssd::token_width_for_vocab(1), 2u);
  CHECK_EQ(sssd::token_width_for_vocab(65535), 2u);  // ids 0..65534 stored as 1..65535
  CHECK_EQ(sssd::token_width_for_vocab(65536), 4u);  // id 65535 is stored as 65536
  CHECK_EQ(sssd::token_width_for_vocab(sssd::kMaxVocab), 4u);
  CHECK_THROWS(sssd::token_width_for_vocab(0), std::invalid_argument);
  CHECK_THROWS(sssd::token_width_for_vocab(sssd::kMaxVocab + 1), std::invalid_argument);
}

TEST(format_make_header_layout) {
  const DatastoreHeader h = sssd::make_header(70000, 10, 2, "x:1", false);
  CHECK_EQ(h.token_width, 4u);
  CHECK_EQ(h.sa_width, 4u);
  CHECK_EQ(h.stream_length, 12u);
  CHECK(h.stream_offset >= sizeof(DatastoreHeader) && h.stream_offset % 64 == 0);
  CHECK(h.doc_offsets_offset >= h.stream_offset + 12 * 4 && h.doc_offsets_offset % 64 == 0);
  CHECK(h.sa_offset >= h.doc_offsets_offset + 3 * 8 && h.sa_offset % 64 == 0);
  CHECK_EQ(h.file_size, h.sa_offset + 10 * 4);
  CHECK_EQ(sssd::make_header(70000, 10, 2, "", true).sa_width, 8u);
  sssd::validate_header(h, h.file_size);  // a fresh header is valid
  CHECK_THROWS(sssd::make_header(10, 1, 1, std::string(120, 'x'), false), std::invalid_argument);
}

TEST(format_crafted_headers_are_rejected) {
  CHECK(rejected_after([](DatastoreHeader& h) { h.magic[0] = 'X'; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.version = 2; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.vocab_size = 0; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.vocab_size = 70000; }));  // width disagrees
  CHECK(rejected_after([](DatastoreHeader& h) { h.token_width = 4; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.sa_width = 2; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.num_tokens += 1; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.stream_length -= 1; }));
  CHECK(rejected_after([](DatastoreHeader& h) {
    h.num_documents = std::numeric_limits<uint64_t>::max();
    h.stream_length = h.num_tokens + h.num_documents;  // wraps around
  }));
  CHECK(rejected_after([](DatastoreHeader& h) {
    h.num_tokens = uint64_t{1} << 62;
    h.stream_length = h.num_tokens + h.num_documents;
    h.sa_width = 8;  // count * width overflows 64 bits
  }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.num_tokens = h.stream_length; h.num_documents = 0; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.stream_offset = 0; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.stream_offset = 257; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.sa_offset = uint64_t{1} << 40; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.doc_offsets_offset = ~uint64_t{63}; }));
  CHECK(rejected_after([](DatastoreHeader& h) { h.sa_offset += 64; }));  // runs past file_size
  CHECK(rejected_after([](DatastoreHeader& h) { std::memset(h.fingerprint, 'x', sizeof h.fingerprint); }));
  // not resealed: the checksum catches it
  DatastoreHeader h = sssd::make_header(100, 40, 3, "", false);
  h.flags = 1;
  CHECK_THROWS(sssd::validate_header(h, h.file_size), DatastoreError);
  // a file size that differs from the header's
  h = sssd::make_header(100, 40, 3, "", false);
  CHECK_THROWS(sssd::validate_header(h, h.file_size - 1), DatastoreError);
  CHECK_THROWS(sssd::validate_header(h, h.file_size + 1), DatastoreError);
}

TEST(format_every_truncation_of_a_real_file) {
  sssd_test::TempDir dir;
  const std::string path = dir.file("a.sssd"), cut = dir.file("cut.sssd");
  sssd_test::build_file(path, {{1, 2, 3}, {}, {3, 2, 1, 2}}, 5, "tok:1");
  const auto bytes = sssd_test::read_bytes(path);
  sssd::Datastore whole(path);
  CHECK_EQ(whole.header().num_tokens, 7u);
  for (size_t n = 0; n < bytes.size(); ++n) {
    sssd_test::write_bytes(cut, bytes, n);
    CHECK_THROWS(sssd::Datastore d(cut), DatastoreError);
  }
}

TEST(format_open_errors) {
  sssd_test::TempDir dir;
  CHECK_THROWS(sssd::Datastore d(dir.file("missing.sssd")), std::system_error);
  CHECK_THROWS(sssd::Datastore d(dir.file("")), DatastoreError);  // a directory
}

TEST(format_corrupt_sections_found_by_open_and_verify) {
  sssd_test::TempDir dir;
  const std::string path = dir.file("a.sssd");
  sssd_test::build_file(path, {{1, 2, 3}, {3, 2, 1, 2}}, 5);
  auto bytes = sssd_test::read_bytes(path);
  DatastoreHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  {  // the stream must end with a separator
    auto b = bytes;
    b[h.stream_offset + 2 * (h.stream_length - 1)] = 1;
    sssd_test::write_bytes(path, b, b.size());
    CHECK_THROWS(sssd::Datastore d(path), DatastoreError);
  }
  {  // the document table must span the stream
    auto b = bytes;
    b[h.doc_offsets_offset + 8 * h.num_documents] ^= 1;
    sssd_test::write_bytes(path, b, b.size());
    CHECK_THROWS(sssd::Datastore d(path), DatastoreError);
  }
  {  // an inner document offset out of order: open is O(1) and accepts it, verify and document() do not
    auto b = bytes;
    b[h.doc_offsets_offset + 8] = 200;
    sssd_test::write_bytes(path, b, b.size());
    sssd::Datastore d(path);
    CHECK_THROWS(d.verify(nullptr), DatastoreError);
    std::vector<int32_t> out;
    CHECK_THROWS(d.document(0, out), DatastoreError);
  }
  {  // suffix array entries: out of range, pointing at a separator, duplicated, unsorted
    const size_t sa = h.sa_offset;
    const int32_t bad[] = {1000, 3, -1};
    for (int32_t v : bad) {
      auto b = bytes;
      std::memcpy(&b[sa + 4], &v, 4);
      sssd_test::write_bytes(path, b, b.size());
      sssd::Datastore d(path);
      CHECK_THROWS(d.verify(nullptr), DatastoreError);
    }
    auto b = bytes;
    std::swap_ranges(&b[sa], &b[sa + 4], &b[sa + 4]);
    sssd_test::write_bytes(path, b, b.size());
    sssd::Datastore d(path);
    CHECK_THROWS(d.verify(nullptr), DatastoreError);
  }
  sssd_test::write_bytes(path, bytes, bytes.size());
  sssd::Datastore d(path);
  d.verify(nullptr);
  std::vector<int32_t> out;
  d.document(1, out);
  CHECK(out == (std::vector<int32_t>{3, 2, 1, 2}));
}
