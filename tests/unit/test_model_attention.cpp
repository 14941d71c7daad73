// The official numerics' sparse attention on the CPU against DeepSeek's code (official_layout_check.h): the window
// holes of the official index list, with more than 64 keys per query.
#include "official_layout_check.h"

namespace {

using plumb_test::expect_official_attention_agrees;

TEST(OfficialAttention, WindowHolesMatchTheOfficialCodeInDecodes) { expect_official_attention_agrees("wide-window-ref", "cpu"); }
TEST(OfficialAttention, WindowHolesMatchTheOfficialCodeInAPrefill) { expect_official_attention_agrees("wide-prefill-ref", "cpu"); }

}  // namespace
