// Small string helpers: list splitting for options, CSV rows for the bench reports.
#include <gtest/gtest.h>

#include "core/strings.h"

TEST(Strings, SplitListTrimsAndDropsEmptyItems) {
  EXPECT_EQ(plumb::split_list(" a, b,,c "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(plumb::split_list("").empty());
}

TEST(Strings, CsvRowQuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(plumb::csv_row({"a", "1.5", ""}), "a,1.5,\n");
  EXPECT_EQ(plumb::csv_row({"moe gate+up (w1,w3 FP4)", "x"}), "\"moe gate+up (w1,w3 FP4)\",x\n");
  EXPECT_EQ(plumb::csv_row({"say \"hi\""}), "\"say \"\"hi\"\"\"\n");
  EXPECT_EQ(plumb::csv_row({"two\nlines"}), "\"two\nlines\"\n");
}
