// Search in the core: an exact hand-written trie, edge cases, several shards, and corrupt suffix-array
// entries (bounds-checked: DatastoreError, never an out-of-bounds read under ASan).
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "core/search.h"
#include "datastore_fixture.h"

namespace {

using Paths = std::map<std::vector<int32_t>, int32_t>;  // token path from the root -> count

Paths paths_of(const sssd::CandidateTrie& t) {
  std::vector<std::vector<int32_t>> path(static_cast<size_t>(t.size()));
  Paths out;
  for (int32_t i = 1; i < t.size(); ++i) {
    CHECK(t.parents[i] >= 0 && t.parents[i] < i);
    CHECK_EQ(t.depth[i], t.depth[t.parents[i]] + 1);
    path[i] = path[t.parents[i]];
    path[i].push_back(t.tokens[i]);
    out[path[i]] = t.counts[i];
  }
  return out;
}

sssd::CandidateTrie search(const std::vector<const sssd::Datastore*>& shards, std::vector<int32_t> ctx,
                           const sssd::SearchParams& p) {
  std::vector<sssd::DatastoreView> views;
  for (const auto* s : shards) views.push_back(s->view());
  sssd::CandidateTrie t;
  sssd::search_context(views, {ctx.data(), static_cast<int64_t>(ctx.size())}, p, t);
  return t;
}

sssd::SearchParams params(int32_t max_samples = 100, int64_t min_occurrences = 1, int32_t depth = 3) {
  sssd::SearchParams p;
  p.max_query_len = 3;
  p.min_query_len = 1;
  p.min_occurrences = min_occurrences;
  p.max_samples = max_samples;
  p.max_depth = depth;
  return p;
}

const sssd_test::Docs kDocs = {{5, 6, 7, 8}, {5, 6, 7, 9}, {6, 7, 8, 1}, {5, 6}};

}  // namespace

TEST(search_exact_trie) {
  sssd_test::TempDir dir;
  sssd_test::build_file(dir.file("a.sssd"), kDocs, 10);
  sssd::Datastore ds(dir.file("a.sssd"));
  auto t = search({&ds}, {4, 5, 6}, params());
  CHECK_EQ(t.tokens[0], 6);
  CHECK_EQ(t.counts[0], 3);
  CHECK((paths_of(t) == Paths{{{7}, 2}, {{7, 8}, 1}, {{7, 9}, 1}}));
  for (int32_t i = 1; i < t.size(); ++i) CHECK_EQ(t.match_len[i], 2);
  // below min_occurrences: the shorter suffix (6) adds its occurrences
  t = search({&ds}, {4, 5, 6}, params(100, 4));
  CHECK_EQ(t.counts[0], 7);
  CHECK((paths_of(t) == Paths{{{7}, 5}, {{7, 8}, 3}, {{7, 9}, 2}, {{7, 8, 1}, 1}}));
  // two samples of the three (5, 6) occurrences, indices 0 and 3 / 2 = 1: "5 6 |" and "5 6 7 8"
  t = search({&ds}, {5, 6}, params(2));
  CHECK_EQ(t.counts[0], 2);
  CHECK((paths_of(t) == Paths{{{7}, 1}, {{7, 8}, 1}}));
}

TEST(search_edge_cases) {
  sssd_test::TempDir dir;
  sssd_test::build_file(dir.file("a.sssd"), kDocs, 10);
  sssd::Datastore ds(dir.file("a.sssd"));
  auto t = search({&ds}, {}, params());
  CHECK(t.size() == 1 && t.tokens[0] == -1 && t.counts[0] == 0);
  t = search({&ds}, {5, 6}, params(0));
  CHECK(t.size() == 1 && t.counts[0] == 0);
  t = search({&ds}, {3}, params());  // never occurs
  CHECK(t.size() == 1 && t.counts[0] == 0);
  t = search({&ds}, {7}, params(100, 1, 0));  // depth 0: counted, no nodes
  CHECK(t.size() == 1 && t.counts[0] == 3);
  t = search({}, {5, 6}, params());  // no shards
  CHECK(t.size() == 1);
  std::vector<int32_t> long_ctx(5000, 9);
  long_ctx.push_back(5);
  long_ctx.push_back(6);
  t = search({&ds}, long_ctx, params());
  CHECK_EQ(t.counts[0], 3);
  CHECK_THROWS(search({&ds}, {5, 10}, params()), std::invalid_argument);
  CHECK_THROWS(search({&ds}, {-1, 5}, params()), std::invalid_argument);
  sssd::SearchParams bad = params();
  bad.min_query_len = 0;
  CHECK_THROWS(sssd::validate_search_params(bad), std::invalid_argument);
  bad = params(-1);
  CHECK_THROWS(sssd::validate_search_params(bad), std::invalid_argument);
}

TEST(search_shards_as_one) {
  sssd_test::TempDir dir;
  sssd_test::build_file(dir.file("all.sssd"), kDocs, 10);
  sssd_test::build_file(dir.file("a.sssd"), {kDocs[0], kDocs[1]}, 10);
  sssd_test::build_file(dir.file("b.sssd"), {kDocs[2], kDocs[3]}, 10, "", /*force_sa64=*/true);
  sssd::Datastore all(dir.file("all.sssd")), a(dir.file("a.sssd")), b(dir.file("b.sssd"));
  for (const std::vector<int32_t>& ctx : std::vector<std::vector<int32_t>>{{5, 6}, {6, 7}, {7}, {8}}) {
    auto one = search({&all}, ctx, params(100, 10));
    auto two = search({&a, &b}, ctx, params(100, 10));
    CHECK(paths_of(one) == paths_of(two));
    CHECK_EQ(one.counts[0], two.counts[0]);
  }
}

TEST(search_corrupt_suffix_array_is_an_error) {
  sssd_test::TempDir dir;
  const std::string path = dir.file("a.sssd");
  sssd_test::build_file(path, kDocs, 10);
  const auto bytes = sssd_test::read_bytes(path);
  sssd::DatastoreHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  const int32_t values[] = {1 << 30, -5, static_cast<int32_t>(h.stream_length), 0};
  for (int32_t v : values) {
    for (uint64_t i = 0; i < h.num_tokens; ++i) {
      auto b = bytes;
      std::memcpy(&b[h.sa_offset + 4 * i], &v, 4);
      sssd_test::write_bytes(path, b, b.size());
      sssd::Datastore ds(path);
      for (const std::vector<int32_t>& ctx : std::vector<std::vector<int32_t>>{{5, 6}, {7}, {1}, {9}}) {
        try {
          search({&ds}, ctx, params(100, 10, 8));  // any result or DatastoreError, never a crash
        } catch (const sssd::DatastoreError&) {
        }
      }
    }
  }
}

TEST(search_batch_rethrows_worker_errors) {
  sssd_test::TempDir dir;
  sssd_test::build_file(dir.file("a.sssd"), kDocs, 10);
  sssd::Datastore ds(dir.file("a.sssd"));
  std::vector<std::vector<int32_t>> ctxs(64, std::vector<int32_t>{5, 6});
  ctxs[40] = {5, 11};
  std::vector<sssd::TokenSpan> spans;
  for (const auto& c : ctxs) spans.push_back({c.data(), static_cast<int64_t>(c.size())});
  std::vector<sssd::CandidateTrie> out;
  CHECK_THROWS(sssd::search_batch({ds.view()}, spans, params(), out), std::invalid_argument);
  ctxs[40] = {5, 6};
  sssd::search_batch({ds.view()}, spans, params(), out);
  CHECK_EQ(out.size(), 64u);
  for (const auto& t : out) CHECK_EQ(t.counts[0], 3);
}
