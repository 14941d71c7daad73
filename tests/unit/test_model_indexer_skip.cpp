// indexer.skip_short on the CPU reference: the differential test of indexer_skip_check.h (entry order while the
// top-k would select every visible entry, the indexer's own top-k from the first chunk past that point).
#include "indexer_skip_check.h"
#include "model/attention.h"

namespace {

TEST(IndexerSkipShort, MatchesTheIndexerUpToTheLastSkippableChunkAndRunsItAfter) {
  plumb_test::check_indexer_skip_short("cpu");
}

TEST(IndexerSkipShort, ThresholdIsTheTopkCountOfEntries) {
  plumb::ModelConfig c;
  c.index_topk = 512;
  EXPECT_TRUE(plumb::indexer_skippable(c, 4, 2051));   // 512 entries: the top-k takes them all
  EXPECT_FALSE(plumb::indexer_skippable(c, 4, 2052));  // 513
  EXPECT_FALSE(plumb::indexer_skippable(c, 0, 1));     // no compressor
}

}  // namespace
