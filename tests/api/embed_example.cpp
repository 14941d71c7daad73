// A program built on plumb's public API alone (include/plumb/; this target has no src/ on its include path, so an
// internal header would not compile): load a model, stream a greedy continuation, stop it from a callback, carry
// on with the same session, and catch a plumb::Error. CTest runs it (api.embed_example) on the bundled model.
// Usage: embed_example MODEL_DIR
#include <plumb/engine.h>
#include <plumb/text.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL_DIR\n", argv[0]);
    return 2;
  }
  try {
    const auto engine = plumb::Engine::load(argv[1]);
    const auto tok = plumb::Tokenizer::load(argv[1]);
    auto session = engine->new_session();

    plumb::GenerateOptions opt;
    opt.sampling.temperature = 0;  // greedy: the same text on every run
    opt.max_tokens = 64;
    int pieces = 0;
    opt.should_stop = [&] { return pieces >= 5; };  // a front end's Ctrl-C, a client gone
    std::string streamed;
    const auto prompt = plumb::encode_prompt(tok, "Once upon a time", engine->info().bos_token);
    const auto r = plumb::generate(*session, tok, prompt, opt, [&](std::string_view piece) {
      streamed += piece;
      ++pieces;
    });
    std::printf("%s [%s after %zu tokens]\n", streamed.c_str(), plumb::stop_reason_name(r.stop), r.tokens.size());
    if (r.stop != plumb::StopReason::Cancelled || streamed != r.text) return 1;

    // The same session goes on: the last sampled token first (nothing needed its logits yet), then more text.
    opt.should_stop = {};
    opt.max_tokens = 8;
    const auto r2 = plumb::generate(*session, tok, std::vector<int32_t>{r.unfed}, opt);
    std::printf("...%s [%s]\n", r2.text.c_str(), plumb::stop_reason_name(r2.stop));
    if (r2.tokens.empty()) return 1;

    // Errors are plumb::Error, naming what is at fault, and leave the session as it was.
    const int64_t at = session->position();
    try {
      session->forward(std::vector<int32_t>{engine->info().vocab_size});
      return 1;
    } catch (const plumb::Error& e) {
      std::printf("refused: %s\n", e.what());
    }
    return session->position() == at ? 0 : 1;
  } catch (const plumb::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
