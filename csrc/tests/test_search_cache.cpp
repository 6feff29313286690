// SearchCache: a search that reuses the previous search of the same (grown) context returns exactly the
// trie of a search from scratch, on random corpora (several shards, 16/32-bit tokens and suffix arrays,
// with and without the search index), for contexts that grow by 0..6 tokens a step, follow the corpus
// (long matches that keep extending) or not, shrink, or are replaced by unrelated contexts.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check.h"
#include "core/search.h"
#include "datastore_fixture.h"

namespace {

bool same_trie(const sssd::CandidateTrie& a, const sssd::CandidateTrie& b) {
  return a.tokens == b.tokens && a.parents == b.parents && a.counts == b.counts && a.depth == b.depth &&
         a.match_len == b.match_len;
}

sssd_test::Docs random_docs(sssd_test::Rng& rng, int32_t vocab, int32_t num_docs, int32_t max_len) {
  sssd_test::Docs docs(static_cast<size_t>(num_docs));
  for (auto& d : docs) {
    const auto n = 1 + rng.below(static_cast<uint64_t>(max_len));
    // Low-entropy text (a few tokens dominate) so that long suffixes recur.
    for (uint64_t i = 0; i < n; ++i) {
      const auto r = rng.below(8);
      d.push_back(static_cast<int32_t>(r < 5 ? rng.below(3) : rng.below(static_cast<uint64_t>(vocab))));
    }
  }
  return docs;
}

// One random walk of a growing context against one set of shards; compares every step.
void walk(const std::vector<sssd::DatastoreView>& views, const sssd_test::Docs& docs, int32_t vocab,
          sssd_test::Rng& rng, const sssd::SearchParams& p) {
  sssd::SearchCache cache;
  std::vector<int32_t> ctx;
  const auto& src = docs[rng.below(docs.size())];
  size_t follow = 0;  // next position of src to copy while the context follows the corpus
  for (int step = 0; step < 60; ++step) {
    const auto what = rng.below(10);
    if (what == 0 && !ctx.empty()) {
      ctx.resize(rng.below(ctx.size()));  // shrink (the cache must not be trusted)
    } else if (what == 1) {
      ctx.assign(1 + rng.below(5), static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));  // unrelated
    } else {
      const auto n = rng.below(7);  // 0..6 tokens, from the corpus document or random
      for (uint64_t i = 0; i < n; ++i) {
        if (what < 7 && follow < src.size()) {
          ctx.push_back(src[follow++]);
        } else {
          ctx.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
        }
      }
    }
    if (follow >= src.size()) follow = 0;
    const sssd::TokenSpan span{ctx.data(), static_cast<int64_t>(ctx.size())};
    sssd::CandidateTrie fresh, cached;
    sssd::search_context(views, span, p, fresh);
    sssd::search_context(views, span, p, cached, &cache);
    CHECK(same_trie(fresh, cached));
    if (rng.below(2) == 0) {  // the same context again: everything comes from the cache
      sssd::search_context(views, span, p, cached, &cache);
      CHECK(same_trie(fresh, cached));
    }
  }
}

void run_cases(uint64_t seed) {
  sssd_test::Rng rng(seed);
  for (int round = 0; round < 6; ++round) {
    sssd_test::TempDir dir;
    const int32_t vocab = round % 3 == 2 ? 70000 : 12;  // 70000: 32-bit tokens
    const auto docs = random_docs(rng, vocab, 40, 300);
    // One shard, or the documents split over three (the last with a 64-bit suffix array).
    sssd_test::build_file(dir.file("all.sssd"), docs, static_cast<uint64_t>(vocab), "", round % 2 == 1);
    sssd_test::Docs parts[3];
    for (size_t i = 0; i < docs.size(); ++i) parts[i % 3].push_back(docs[i]);
    for (int s = 0; s < 3; ++s) {
      sssd_test::build_file(dir.file("p" + std::to_string(s) + ".sssd"), parts[s], static_cast<uint64_t>(vocab), "",
                            s == 2);
    }
    sssd::Datastore all(dir.file("all.sssd")), p0(dir.file("p0.sssd")), p1(dir.file("p1.sssd")),
        p2(dir.file("p2.sssd"));
    const std::vector<std::vector<sssd::DatastoreView>> shard_sets = {{all.view()},
                                                                      {p0.view(), p1.view(), p2.view()}};
    for (const auto& views : shard_sets) {
      for (int k = 0; k < 4; ++k) {
        sssd::SearchParams p;
        p.max_query_len = k == 0 ? 16 : static_cast<int32_t>(2 + rng.below(12));
        p.min_query_len = k == 1 ? 2 : 1;
        p.min_occurrences = static_cast<int64_t>(rng.below(20));
        p.max_samples = k == 2 ? 3 : 50;
        p.max_depth = static_cast<int32_t>(1 + rng.below(6));
        walk(views, docs, vocab, rng, p);
      }
    }
  }
}

}  // namespace

TEST(search_cache_equals_fresh_search) {
  unsetenv("SSSD_SEARCH_INDEX");  // default policy: these datastores are too small for an index
  run_cases(1);
}

TEST(search_cache_equals_fresh_search_with_index) {
  // An index on every shard (stride 2 and 4): window searches and index searches are mixed. The
  // variable is read when a mapping's index is made, and every case maps fresh files.
  setenv("SSSD_SEARCH_INDEX", "2,1", 1);
  run_cases(2);
  setenv("SSSD_SEARCH_INDEX", "4,1", 1);
  run_cases(3);
  unsetenv("SSSD_SEARCH_INDEX");
}

namespace {

// Random short contexts (one- and two-symbol matches dominate) searched with the memo on, compared with
// the memo off; the same contexts are searched several times so that the memo is hit.
void compare_memo(const std::vector<sssd::DatastoreView>& views, int32_t vocab, sssd_test::Rng& rng) {
  sssd::SearchParams p;
  p.max_query_len = 8;
  p.min_occurrences = static_cast<int64_t>(rng.below(6));
  p.max_samples = 1 + static_cast<int32_t>(rng.below(40));
  p.max_depth = 1 + static_cast<int32_t>(rng.below(6));
  for (int i = 0; i < 200; ++i) {
    std::vector<int32_t> ctx;
    const auto n = 1 + rng.below(2);  // one- and two-symbol queries: the memoized ones
    for (uint64_t j = 0; j < n; ++j) ctx.push_back(static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab))));
    const sssd::TokenSpan span{ctx.data(), static_cast<int64_t>(ctx.size())};
    sssd::CandidateTrie off, on;
    sssd::set_search_memo(true);
    sssd::search_context(views, span, p, on);  // fills the memo, or hits an entry of an earlier context
    CHECK_EQ(on.size() >= 1, true);
    sssd::set_search_memo(false);
    sssd::search_context(views, span, p, off);
    CHECK(same_trie(off, on));
    sssd::set_search_memo(true);
    sssd::search_context(views, span, p, on);  // a hit
    CHECK(same_trie(off, on));
  }
}

}  // namespace

TEST(search_cache_trie_memo_equals_sampling) {
  sssd_test::Rng rng(4);
  // Documents of fixed length, so that files a and b have the same size and a mapping of b is likely
  // to get the address of a released mapping of a (the memo must not serve a's tries for b).
  auto fixed_docs = [&](int32_t vocab) {
    sssd_test::Docs docs(30, std::vector<int32_t>(100));
    for (auto& d : docs) {
      for (auto& t : d) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
    }
    return docs;
  };
  for (int round = 0; round < 4; ++round) {
    if (round == 2) setenv("SSSD_SEARCH_INDEX", "2,1", 1);
    sssd_test::TempDir dir;
    const int32_t vocab = 6;
    sssd_test::build_file(dir.file("a.sssd"), fixed_docs(vocab), static_cast<uint64_t>(vocab));
    sssd_test::build_file(dir.file("b.sssd"), fixed_docs(vocab), static_cast<uint64_t>(vocab));
    for (const char* name : {"a.sssd", "b.sssd", "a.sssd"}) {
      sssd::Datastore ds(dir.file(name));
      compare_memo({ds.view()}, vocab, rng);
    }
    sssd::Datastore a(dir.file("a.sssd")), b(dir.file("b.sssd"));
    compare_memo({a.view(), b.view()}, vocab, rng);
  }
  unsetenv("SSSD_SEARCH_INDEX");
  sssd::set_search_memo(true);
}

namespace {

// Searches q with the memo on (filling or hitting it) and off; checks that both tries are equal and
// returns the trie's size. Leaves the memo on.
size_t memo_agrees_with_sampling(const sssd::DatastoreView& view, const std::vector<int32_t>& q,
                                 const sssd::SearchParams& p) {
  const sssd::TokenSpan span{q.data(), static_cast<int64_t>(q.size())};
  sssd::CandidateTrie on, off;
  sssd::set_search_memo(true);
  sssd::search_context({view}, span, p, on);
  sssd::set_search_memo(false);
  sssd::search_context({view}, span, p, off);
  sssd::set_search_memo(true);
  CHECK(same_trie(off, on));
  return on.size();
}

}  // namespace

TEST(search_cache_trie_memo_keeps_queries_apart) {
  // 400 distinct two-symbol queries share their first (or last) symbol and 800 share the memo's 256
  // slots: every slot is reused, so only the full key (both symbols, length) keeps their tries apart.
  const int32_t a = 400, vocab = 401;
  sssd_test::Docs docs(1);
  for (int32_t x = 0; x < a; ++x) {
    docs[0].push_back(a);
    docs[0].push_back(x);
  }
  docs[0].push_back(a);  // so that the last pairs have continuations too
  docs[0].push_back(0);
  sssd_test::TempDir dir;
  sssd_test::build_file(dir.file("pairs.sssd"), docs, static_cast<uint64_t>(vocab));
  sssd::Datastore ds(dir.file("pairs.sssd"));
  sssd::SearchParams p;
  p.max_query_len = 2;
  p.max_samples = 8;
  p.max_depth = 3;
  std::vector<std::vector<int32_t>> queries;
  for (int32_t x = 0; x < a; ++x) {
    queries.push_back({a, x});  // continues with a, x + 1
    queries.push_back({x, a});  // continues with x + 1, a
  }
  sssd::set_search_memo(true);
  for (int pass = 0; pass < 2; ++pass) {  // pass 0 fills the memo, pass 1 may hit entries
    for (const auto& q : queries) {
      // every query matches and has continuations
      CHECK_EQ(memo_agrees_with_sampling(ds.view(), q, p) > 1, true);
    }
  }
}

TEST(search_cache_trie_memo_not_served_across_mappings) {
  // Two files of the same size with different contents, mapped one after the other: a new mapping may
  // get the released one's address, and the memo must not serve the old file's tries for it.
  sssd_test::TempDir dir;
  const int32_t vocab = 3;
  sssd_test::Docs da(1), db(1);
  for (int32_t i = 0; i < 300; ++i) {
    da[0].push_back(i % 3);
    db[0].push_back((i * 2 + 1) % 3);
  }
  sssd_test::build_file(dir.file("a.sssd"), da, static_cast<uint64_t>(vocab));
  sssd_test::build_file(dir.file("b.sssd"), db, static_cast<uint64_t>(vocab));
  sssd::SearchParams p;
  p.max_query_len = 2;
  p.max_depth = 4;
  int reused = 0;
  const void* last = nullptr;
  sssd::set_search_memo(true);
  for (int round = 0; round < 6; ++round) {
    sssd::Datastore ds(dir.file(round % 2 ? "b.sssd" : "a.sssd"));
    reused += ds.view().header == last;
    last = ds.view().header;
    for (int32_t s = 0; s < vocab; ++s) {
      for (int32_t t = -1; t < vocab; ++t) {
        memo_agrees_with_sampling(ds.view(), t < 0 ? std::vector<int32_t>{s} : std::vector<int32_t>{s, t}, p);
      }
    }
  }
  std::printf("  (a new mapping reused the released address %d of 5 times)\n", reused);
}
