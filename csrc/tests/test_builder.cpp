// DatastoreBuilder: input validation (nothing appended on error), the width rules, chunked input, and
// atomic writes (an aborted build leaves neither the file nor its temporary).
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "core/datastore.h"
#include "datastore_fixture.h"

namespace {

struct Abort {};  // what the progress callback throws

}  // namespace

TEST(builder_rejects_bad_documents_and_appends_nothing) {
  sssd::DatastoreBuilder b(10, "");
  const int32_t ok[] = {1, 2, 3};
  const int64_t offsets[] = {0, 1, 3};
  b.add_documents(ok, 3, offsets, 2);
  const int32_t out_of_vocab[] = {1, 10};
  const int32_t negative[] = {1, -1};
  const int64_t off2[] = {0, 2};
  CHECK_THROWS(b.add_documents(out_of_vocab, 2, off2, 1), std::invalid_argument);
  CHECK_THROWS(b.add_documents(negative, 2, off2, 1), std::invalid_argument);
  const int64_t bad_start[] = {1, 2}, bad_end[] = {0, 1}, decreasing[] = {0, 2, 1, 2};
  CHECK_THROWS(b.add_documents(ok, 2, bad_start, 1), std::invalid_argument);
  CHECK_THROWS(b.add_documents(ok, 2, bad_end, 1), std::invalid_argument);
  CHECK_THROWS(b.add_documents(ok, 2, decreasing, 3), std::invalid_argument);
  const int64_t big[] = {std::numeric_limits<int64_t>::max()};
  const int64_t off1[] = {0, 1};
  CHECK_THROWS(b.add_documents(big, 1, off1, 1), std::invalid_argument);
  CHECK_EQ(b.num_tokens(), 3u);
  CHECK_EQ(b.num_documents(), 2u);
}

TEST(builder_width_edges) {
  // uint16 stream: the largest id of a 65535-token vocabulary; uint32 stream: ids past 65535 and, with
  // the largest vocabulary, INT32_MAX (stored as 2^31: the + 1 must not overflow a signed int).
  const int32_t top16[] = {65534, 0};
  const int32_t top32[] = {std::numeric_limits<int32_t>::max(), 65535, 70000};
  const uint32_t top_u32[] = {sssd::kMaxVocab - 1};
  const int64_t off2[] = {0, 2}, off3[] = {0, 3}, off1[] = {0, 1};
  sssd::DatastoreBuilder b16(65535, "");
  b16.add_documents(top16, 2, off2, 1);
  CHECK_THROWS(b16.add_documents(top32 + 1, 1, off1, 1), std::invalid_argument);
  sssd::DatastoreBuilder b32(sssd::kMaxVocab, "");
  b32.add_documents(top32, 3, off3, 1);
  b32.add_documents(top_u32, 1, off1, 1);
  const uint32_t past_int32[] = {uint32_t{1} << 31};
  CHECK_THROWS(b32.add_documents(past_int32, 1, off1, 1), std::invalid_argument);
  sssd_test::TempDir dir;
  b16.finish(dir.file("a.sssd"), nullptr);
  b32.finish(dir.file("b.sssd"), nullptr);
  sssd::Datastore a(dir.file("a.sssd")), b(dir.file("b.sssd"));
  CHECK_EQ(a.header().token_width, 2u);
  CHECK_EQ(b.header().token_width, 4u);
  a.verify(nullptr);
  b.verify(nullptr);
  std::vector<int32_t> doc;
  b.document(0, doc);
  CHECK(doc == std::vector<int32_t>(top32, top32 + 3));
}

TEST(builder_chunks_give_the_same_file) {
  sssd_test::TempDir dir;
  sssd_test::Rng rng(7);
  sssd_test::Docs docs(200);
  for (auto& d : docs) {
    d.resize(rng.below(6));
    for (auto& t : d) t = static_cast<int32_t>(rng.below(4));
  }
  sssd_test::build_file(dir.file("one.sssd"), docs, 4);
  sssd::DatastoreBuilder b(4, "");
  for (const auto& d : docs) {  // one document per call: the stream must grow geometrically
    const int64_t off[] = {0, static_cast<int64_t>(d.size())};
    b.add_documents(d.data(), off[1], off, 1);
  }
  b.finish(dir.file("many.sssd"), nullptr);
  CHECK(sssd_test::read_bytes(dir.file("one.sssd")) == sssd_test::read_bytes(dir.file("many.sssd")));
}

TEST(builder_empty_corpus) {
  sssd_test::TempDir dir;
  sssd::DatastoreBuilder b(10, "");
  CHECK_THROWS(b.finish(dir.file("a.sssd"), nullptr), std::invalid_argument);
  const int64_t offsets[] = {0, 0, 0};
  b.add_documents(static_cast<const int32_t*>(nullptr), 0, offsets, 2);  // empty documents only
  CHECK_THROWS(b.finish(dir.file("a.sssd"), nullptr), std::invalid_argument);
  CHECK_EQ(dir.count_entries(), 0u);
  CHECK_THROWS(sssd::DatastoreBuilder(0, ""), std::invalid_argument);
  CHECK_THROWS(sssd::DatastoreBuilder(10, std::string(200, 'x')), std::invalid_argument);
}

TEST(builder_aborted_build_leaves_nothing) {
  sssd_test::TempDir dir;
  const char* phases[] = {"sorting suffixes", "writing suffix array"};
  for (const char* stop_at : phases) {
    sssd::DatastoreBuilder b(10, "");
    const int32_t t[] = {1, 2, 3, 1, 2};
    const int64_t off[] = {0, 5};
    b.add_documents(t, 5, off, 1);
    bool called = false;
    auto progress = [&](const char* phase, uint64_t, uint64_t) {
      called = true;
      if (std::string(phase) == stop_at) throw Abort{};
    };
    bool aborted = false;
    try {
      b.finish(dir.file("a.sssd"), progress);
    } catch (const Abort&) {
      aborted = true;
    }
    CHECK(called && aborted);
    CHECK_EQ(dir.count_entries(), 0u);  // neither the file nor a temporary
    CHECK_EQ(b.num_tokens(), 0u);       // the builder is empty afterwards
  }
  sssd::DatastoreBuilder b(10, "");
  const int32_t t[] = {1};
  const int64_t off[] = {0, 1};
  b.add_documents(t, 1, off, 1);
  CHECK_THROWS(b.finish(dir.file("no/such/dir/a.sssd"), nullptr), std::system_error);
  CHECK_EQ(dir.count_entries(), 0u);
}
