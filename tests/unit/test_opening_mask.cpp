// GenerateOptions::reply_opens_with (src/generate/opening_mask.cpp): the mask against a check written here, and
// generate() holding a reply to a DSML call's opening (plumb serve's tool_choice "required" / a named function).
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "generate/opening_mask.h"
#include "json_test_util.h"
#include "plumb/engine.h"
#include "plumb/text.h"

namespace {

using plumb::testing::PreferringSession;

struct OpeningMaskTest : ::testing::Test {
  plumb::Tokenizer tok = plumb::Tokenizer::load(PLUMB_TEST_DATA "/../../models/tiny");
  const int32_t vocab = 1216, eos = 1;
  const std::string weather = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n",
                    time = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_time\">\n";
  plumb::ModelInfo info() const {
    plumb::ModelInfo i;
    i.vocab_size = vocab, i.bos_token = 0, i.eos_token = eos, i.max_positions = 4096;
    return i;
  }
};

// Along each opening's own tokens (and past its end), the mask keeps exactly the tokens whose bytes keep the text a
// prefix of an opening or run past one whole; never a token without text or a stop token before that; every token
// after it.
TEST_F(OpeningMaskTest, KeepsTheTokensThatStayOnAnOpening) {
  const int32_t bang = tok.encode("!").at(0);  // (a stop token: kept out until the opening is whole)
  for (const std::string& target : {weather, time}) {
    plumb::gen::OpeningMask mask(tok, vocab, {weather, time}, {bang});
    const auto ids = tok.encode(target + "Paris");
    std::string written;
    bool opened = false;
    for (size_t k = 0; k <= ids.size(); ++k) {
      std::vector<uint32_t> bits(size_t(vocab + 31) / 32, 0);
      mask.allowed(bits);
      int kept = 0;
      for (int32_t id = 0; id < vocab; ++id) {
        const std::string b = tok.token_bytes(id), t = written + b;
        bool want = opened;
        if (!opened && !b.empty() && !tok.is_added(id) && id != bang && id < tok.vocab_size())
          for (const std::string& o : {weather, time})
            want |= o.compare(0, std::min(o.size(), t.size()), t, 0, std::min(o.size(), t.size())) == 0;
        ASSERT_EQ(bool((bits[size_t(id) / 32] >> (id % 32)) & 1), want) << "token " << id << " after \"" << written << "\"";
        ASSERT_EQ(mask.allows(id), want) << id;
        kept += want;
      }
      EXPECT_GT(kept, 0);
      if (k == ids.size()) break;
      ASSERT_TRUE(mask.allows(ids[k])) << "the opening's own token " << ids[k] << " at " << k;
      mask.accept(ids[k]);
      written += tok.token_bytes(ids[k]);
      opened = written.size() >= target.size();
      EXPECT_EQ(mask.lifted(), opened) << k;
    }
    EXPECT_TRUE(mask.allows(eos));  // (once open, anything: the reply may end)
  }
  plumb::gen::OpeningMask mask(tok, vocab, {weather}, {});
  EXPECT_THROW(mask.accept(tok.encode("Hi").at(0)), plumb::Error);
}

// generate(): a model that would write something else still opens with one of the openings, then writes freely; a
// model that writes the call is not changed by the mask; the openings are checked (none empty, not with JSON formats).
TEST_F(OpeningMaskTest, GenerateOpensWithOneOfTheOpenings) {
  for (float t : {0.0f, 1.0f}) {
    PreferringSession s(tok, "Hello there, I will not call anything.", info());
    plumb::GenerateOptions g;
    g.sampling.temperature = t, g.sampling.seed = 9, g.max_tokens = 60;
    g.reply_opens_with = {weather, time};
    const std::vector<int32_t> prompt = {0};
    const auto r = plumb::generate(s, tok, prompt, g);
    EXPECT_TRUE(r.text.rfind(weather, 0) == 0 || r.text.rfind(time, 0) == 0) << r.text;
    EXPECT_GT(r.text.size(), std::min(weather.size(), time.size())) << "nothing after the opening: " << r.text;
  }
  const std::string call = weather + "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                                     "</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
  PreferringSession a(tok, call, info()), b(tok, call, info());
  plumb::GenerateOptions g;
  g.sampling.temperature = 0, g.max_tokens = 200;
  const std::vector<int32_t> prompt = {0};
  const auto free = plumb::generate(a, tok, prompt, g);
  g.reply_opens_with = {weather, time};
  const auto held = plumb::generate(b, tok, prompt, g);
  EXPECT_EQ(held.text, call);
  EXPECT_EQ(held.tokens, free.tokens);
  // A stop token whose text is inside an opening would end the reply there: refused before anything is fed.
  PreferringSession c(tok, call, info());
  g.stop_tokens = {tok.encode("\n").at(0)};
  try {
    plumb::generate(c, tok, prompt, g);
    ADD_FAILURE() << "a newline stop token with a DSML opening was taken";
  } catch (const plumb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is text inside the reply's opening"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.position(), 0);
  g.stop_tokens.clear();
  g.format = plumb::OutputFormat::JsonObject;
  EXPECT_THROW(plumb::check_generate_options(g), plumb::Error);
  g.format = plumb::OutputFormat::Text, g.reply_opens_with = {""};
  EXPECT_THROW(plumb::check_generate_options(g), plumb::Error);
}

}  // namespace
