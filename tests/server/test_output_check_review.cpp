// A review of plumb serve's check of the output options (check_output: check_output_options' OptionError mapped to a
// 400 naming the request's field).
#include <gtest/gtest.h>

#include "server/openai.h"

#include "tiny_model.h"

namespace plumb::server {
namespace {

json output_review_user() { return json::array({{{"role", "user"}, {"content", "Hi"}}}); }

json output_review_required_body() {
  const auto tt = testing::tool_turns();
  return {{"messages", json::parse(tt.messages.dump())}, {"tools", json::parse(tt.tools.dump())}, {"tool_choice", "required"}};
}

// The request is refused with a 400 naming `param` (no other exception escapes: a 500).
void output_review_refused(const json& body, bool chat, const Defaults& d, const std::string& param, const std::string& text) {
  SCOPED_TRACE(body.dump());
  try {
    if (chat) parse_chat(body, testing::tiny_tok(), d);
    else parse_completion(body, testing::tiny_tok(), d);
    ADD_FAILURE() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a RequestError (a 500): " << e.what();
  }
}

// Every schema the new keywords make invalid (lengths, integer bounds) is a 400 naming response_format on both
// endpoints, with the compiler's reason; so is a format without an end token on chat (ignore_eos).
TEST(OutputCheckReview, SchemaAndFormatRefusalsAre400sNamingResponseFormat) {
  const Defaults d = testing::tiny_model_defaults();
  auto with = [](const json& prop) {
    return json{{"type", "json_schema"},
                {"json_schema", {{"schema", {{"type", "object"}, {"properties", {{"a", prop}}}}}}}};
  };
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"type", "number"}, {"minimum", 1}}, "supported on integers only"},
      {{{"minimum", 1}}, "supported on integers only"},
      {{{"type", "integer"}, {"minimum", "1"}}, "must be a number"},
      {{{"type", "integer"}, {"maximum", true}}, "must be a number"},
      {{{"type", "integer"}, {"minimum", 5}, {"maximum", 4}}, "no integer lies within the bounds"},
      {{{"type", "integer"}, {"exclusiveMinimum", 4}, {"exclusiveMaximum", 5}}, "no integer lies within the bounds"},
      {{{"type", "integer"}, {"minimum", 4.2}, {"maximum", 4.8}}, "no integer lies within the bounds"},
      {{{"type", "string"}, {"minLength", 3}, {"maxLength", 2}}, "maxLength below minLength"},
      {{{"type", "string"}, {"maxLength", -1}}, "non-negative integer"},
      {{{"type", "string"}, {"minLength", 1.5}}, "non-negative integer"},
      {{{"enum", json::array({"abc", "de"})}, {"maxLength", 1}}, "no value of the enum"},
      {{{"type", "integer"}, {"enum", json::array({1, 2})}, {"minimum", 3}}, "no value of the enum"}};
  for (const auto& [prop, text] : bad) {
    output_review_refused(json{{"messages", output_review_user()}, {"response_format", with(prop)}}, true, d,
                          "response_format", text);
    output_review_refused(json{{"prompt", "a"}, {"response_format", with(prop)}}, false, d, "response_format", text);
  }
  output_review_refused(json{{"messages", output_review_user()}, {"response_format", {{"type", "json_object"}}},
                             {"ignore_eos", true}}, true, d, "response_format", "needs a token that ends the object's text");
  // The valid forms pass (and keep the schema as given).
  for (const json& prop : {json{{"type", "integer"}, {"exclusiveMinimum", -0.5}, {"maximum", 9223372036854775807}},
                           json{{"type", "string"}, {"minLength", 0}, {"maxLength", 0}}}) {
    SCOPED_TRACE(prop.dump());
    EXPECT_NO_THROW(parse_chat(json{{"messages", output_review_user()}, {"response_format", with(prop)}}, testing::tiny_tok(), d));
  }
}

// Found by the review: a stop string of the server's own (--stop, Defaults::stop_strings) inside the tool call's
// opening is answered as the request's "stop" ("stop holds ...") though the request sent none; the server's stop
// tokens are answered as tool_choice (and check_sampling's errors leave out a field the body does not hold). The
// request's own field that cannot be held to is tool_choice.
TEST(OutputCheckReview, AServerStopStringIsNotBlamedOnTheRequestsStop) {
  Defaults d = testing::tiny_model_defaults();
  d.stop_strings = {"DSML"};
  try {
    parse_chat(output_review_required_body(), testing::tiny_tok(), d);
    ADD_FAILURE() << "accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "tool_choice") << e.what();
  }
  // (the request's own stop: named "stop", as it is now)
  json body = output_review_required_body();
  body["stop"] = "DSML";
  output_review_refused(body, true, testing::tiny_model_defaults(), "stop", "DSML");
}

}  // namespace
}  // namespace plumb::server
