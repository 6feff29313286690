// The core under bad input (group "robustness"): non-file paths, files damaged or truncated after they
// were written, repetitive text in verify(), shard lists sharing a first shard, NaN scores and negative
// or huge depths, observed paths that are none. Also run under ASan + UBSan (-DSSSD_SANITIZE=ON).
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "core/calibration.h"
#include "core/draft_tree.h"
#include "core/drafter.h"
#include "core/search.h"
#include "datastore_fixture.h"

namespace {

sssd_test::Docs periodic(int32_t period, int32_t tokens, int32_t docs) {
  sssd_test::Docs out(static_cast<size_t>(docs));
  for (auto& d : out) {
    for (int32_t i = 0; i < tokens; ++i) d.push_back(i % period);
  }
  return out;
}

sssd::DatastoreHeader header_of(const std::vector<unsigned char>& raw) {
  sssd::DatastoreHeader h;
  std::memcpy(&h, raw.data(), sizeof h);
  return h;
}

// raw without its content checksum (an older build's file), so that the structure checks run.
void drop_checksum(std::vector<unsigned char>& raw) {
  sssd::DatastoreHeader h = header_of(raw);
  h.flags &= ~sssd::kFlagContentChecksum;
  h.content_checksum = 0;
  sssd::seal_header(h);
  std::memcpy(raw.data(), &h, sizeof h);
}

bool same_trie(const sssd::CandidateTrie& a, const sssd::CandidateTrie& b) {
  return a.tokens == b.tokens && a.parents == b.parents && a.counts == b.counts && a.match_len == b.match_len;
}

}  // namespace

TEST(robustness_open_refuses_fifo_device_and_directory) {
  sssd_test::TempDir dir;
  const std::string fifo = dir.file("pipe.sssd");
  CHECK_EQ(mkfifo(fifo.c_str(), 0600), 0);
  CHECK_THROWS(sssd::Datastore ds(fifo), sssd::DatastoreError);  // without waiting for a writer
  CHECK_THROWS(sssd::Datastore ds("/dev/null"), sssd::DatastoreError);
  CHECK_THROWS(sssd::Datastore ds(dir.file("")), sssd::DatastoreError);
}

TEST(robustness_verify_is_linear_and_exact_on_repetitive_text) {
  sssd_test::TempDir dir;
  const std::string path = dir.file("rep.sssd");
  sssd_test::build_file(path, periodic(7, 5000, 3), 8);
  sssd::Datastore(path).verify(nullptr);
  std::vector<unsigned char> raw = sssd_test::read_bytes(path);
  drop_checksum(raw);
  const sssd::DatastoreHeader h = header_of(raw);
  // Swap a pair of neighbours whose suffixes share a long prefix: verify must find it.
  auto* sa = reinterpret_cast<int32_t*>(raw.data() + h.sa_offset);
  const size_t i = 5000;  // deep inside the run of one residue class: neighbours agree for ~thousands
  std::swap(sa[i - 1], sa[i]);
  sssd_test::write_bytes(dir.file("bad.sssd"), raw, raw.size());
  std::string error = "nothing";
  try {
    sssd::Datastore(dir.file("bad.sssd")).verify(nullptr);
  } catch (const sssd::DatastoreError& e) {
    error = e.what();
  }
  if (error.find("not sorted") == std::string::npos) {
    sssd_test::fail(__FILE__, __LINE__, "verify of a swapped pair: " + error);
  }
}

TEST(robustness_content_checksum_catches_flipped_bytes) {
  sssd_test::TempDir dir;
  const std::string path = dir.file("a.sssd");
  sssd_test::build_file(path, {{1, 2, 3}, {2, 3, 4, 1}}, 5);
  const std::vector<unsigned char> raw = sssd_test::read_bytes(path);
  const sssd::DatastoreHeader h = header_of(raw);
  CHECK((h.flags & sssd::kFlagContentChecksum) != 0);
  for (size_t at = h.stream_offset; at < raw.size(); ++at) {
    std::vector<unsigned char> bad = raw;
    bad[at] ^= 0x20;
    sssd_test::write_bytes(dir.file("bad.sssd"), bad, bad.size());
    bool caught = false;
    try {
      sssd::Datastore ds(dir.file("bad.sssd"));
      ds.check_usable();
    } catch (const sssd::DatastoreError&) {
      caught = true;
    }
    CHECK(caught);
  }
}

TEST(robustness_truncation_under_the_map_is_an_error) {
  sssd_test::TempDir dir;
  const std::string path = dir.file("a.sssd");
  sssd_test::build_file(path, periodic(5, 4000, 2), 6);
  sssd::Datastore ds(path);
  ds.check_usable();
  CHECK_EQ(truncate(path.c_str(), 1000), 0);
  CHECK_THROWS(ds.check_usable(), sssd::DatastoreError);
  std::vector<sssd::CandidateTrie> out;
  const std::vector<int32_t> ctx{1, 2};
  CHECK_THROWS(sssd::search_batch({ds.view()}, {{ctx.data(), 2}}, sssd::SearchParams{}, out), sssd::DatastoreError);
  std::vector<int32_t> doc;
  CHECK_THROWS(ds.document(1, doc), sssd::DatastoreError);
}

TEST(robustness_stale_temporaries_of_dead_builds_are_removed) {
  sssd_test::TempDir dir;
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);  // a pid that no longer runs
  const std::string dead = dir.file(".a.sssd.tmp." + std::to_string(child) + ".0");
  const std::string live = dir.file(".a.sssd.tmp.1.0");  // init is alive
  std::ofstream(dead) << "x";
  std::ofstream(live) << "x";
  sssd_test::build_file(dir.file("a.sssd"), {{1, 2}}, 5);
  struct stat st;
  CHECK(stat(dead.c_str(), &st) != 0);
  CHECK(stat(live.c_str(), &st) == 0);
  CHECK_EQ(dir.count_entries(), size_t{2});
}

TEST(robustness_memo_and_cache_are_keyed_by_the_whole_shard_list) {
  sssd_test::TempDir dir;
  sssd_test::build_file(dir.file("a.sssd"), {{1, 2, 3}}, 6);
  sssd_test::build_file(dir.file("b.sssd"), {{1, 4, 4}, {1, 4, 2}}, 6);
  sssd_test::build_file(dir.file("c.sssd"), {{1, 3, 3}, {1, 3, 2}}, 6);
  sssd::Datastore a(dir.file("a.sssd")), b(dir.file("b.sssd")), c(dir.file("c.sssd"));
  const std::vector<int32_t> ctx{1};
  sssd::SearchParams p;
  p.max_depth = 2;
  for (const auto* second : {&b, &c, &b, &c}) {
    const std::vector<sssd::DatastoreView> views{a.view(), second->view()};
    sssd::CandidateTrie with, without;
    sssd::set_search_memo(true);
    sssd::search_context(views, {ctx.data(), 1}, p, with);
    sssd::set_search_memo(false);
    sssd::search_context(views, {ctx.data(), 1}, p, without);
    sssd::set_search_memo(true);
    CHECK(same_trie(with, without));
  }
  sssd::SearchCache cache;  // a cache of [a, b] does not serve [a, c]
  sssd::CandidateTrie first, second, fresh;
  const std::vector<int32_t> grown{1, 3};
  sssd::search_context({a.view(), b.view()}, {ctx.data(), 1}, p, first, &cache);
  sssd::search_context({a.view(), c.view()}, {grown.data(), 2}, p, second, &cache);
  sssd::search_context({a.view(), c.view()}, {grown.data(), 2}, p, fresh);
  CHECK(same_trie(second, fresh));
}

TEST(robustness_nan_scores_and_bad_depths_stay_in_bounds) {
  sssd::Calibration cal;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK_EQ(cal.apply(1, 2, 3, nan), cal.apply(1, 2, 3, 0.0f));
  cal.observe(1, 2, 3, nan, 1.0f);
  cal.observe(1, 2, 3, 0.5f, nan);      // ignored
  cal.observe(7, 2, 3, 0.5f, 1.0f);     // a source out of range: ignored
  cal.observe(1, -5, -9, 0.5f, 1.0f, std::numeric_limits<double>::infinity());  // ignored
  cal.refit_dirty();
  for (float v : cal.values()) CHECK(v >= 0.0f && v <= 1.0f);
  // Selection: a negative depth is never taken; a huge max_depth costs nothing.
  const std::vector<int32_t> parents{-1, 0, 1, 0};
  const std::vector<double> f{1.0, 0.9, 0.5, 0.4};
  const std::vector<int32_t> depth{0, -1, 2, 1};
  std::vector<int32_t> seq;
  sssd::select_sequence(parents.data(), f.data(), depth.data(), 4, 10, std::numeric_limits<int32_t>::max(), 1, seq);
  CHECK_EQ(seq.size(), size_t{1});
  CHECK_EQ(seq[0], 3);
  std::vector<int32_t> order;
  const std::vector<const double*> fs{f.data() + 1};
  sssd::allocate_budget(fs, {3}, std::numeric_limits<int64_t>::max(), nullptr, 0.0, 0.0, order);
  CHECK_EQ(order.size(), size_t{3});
}

namespace {
double weight_sum(sssd::Drafter& d) {
  const sssd::Calibration c = d.calibration();  // weights() refers into it: keep it alive
  double s = 0.0;
  for (double w : c.weights()) s += w;
  return s;
}
}  // namespace

TEST(robustness_observe_takes_one_path_per_tree_or_nothing) {
  sssd::Drafter d(sssd::DrafterParams{}, {});
  // root -> 1 (-> 3), 2; every non-root node from the input source
  const int32_t parents[] = {-1, 0, 0, 1}, bad_parents[] = {-1, 0, 3, 1};
  const int8_t source[] = {-1, 0, 0, 0};
  const int32_t depth[] = {0, 1, 1, 2}, match[] = {0, 2, 2, 2};
  const float raw[] = {1.0f, 0.5f, 0.25f, 0.5f};
  auto tree_of = [&](const int32_t* par, const uint8_t* on_path) {
    return sssd::TreeView{par, source, depth, match, raw, on_path, 4};
  };
  auto tree = [&](const uint8_t* on_path) { return tree_of(parents, on_path); };
  const uint8_t path[] = {1, 1, 0, 1}, root_only[] = {1, 0, 0, 0}, no_root[] = {0, 1, 0, 0};
  const uint8_t orphan[] = {1, 0, 0, 1}, two_children[] = {1, 1, 1, 0};
  const double before = weight_sum(d);
  for (const uint8_t* bad : {no_root, orphan, two_children}) {
    CHECK_THROWS(d.observe({tree(path), tree(bad)}), std::invalid_argument);  // nothing recorded
  }
  CHECK_THROWS(d.observe({tree_of(bad_parents, path)}), std::invalid_argument);
  CHECK_EQ(weight_sum(d), before);
  CHECK_EQ(d.observe({tree(path), tree(root_only)}), 2);
  CHECK(std::fabs(weight_sum(d) - before - 5.0) < 1e-9);  // trials: 1, 2, 3 of the first tree; 1, 2 of the second
  sssd::DrafterParams offline;
  offline.online = false;
  sssd::Drafter quiet(offline, {});
  CHECK_EQ(quiet.observe({tree(path)}), 0);
}
