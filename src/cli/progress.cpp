// Model loading for run/chat (cli/progress.h). Engine::load maps the safetensors files (nothing is copied); this
// file shows that as it happens: the files and their bytes, the mapping time, then an optional page-in pass
// that reads the files once through the page cache (which the mapping shares) so the first tokens are not
// stalled on disk, with bytes done, rate and ETA. The page-in is skipped when the weights would not fit in
// half of the available memory: then pages come in on demand and reading ahead would only evict them again.
#include "cli/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <set>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "plumb/check.h"

namespace plumb::cli {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string human_bytes(double b) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000.0 && u < 4) b /= 1000.0, ++u;
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.{}f} {}", b, b < 10 ? 2 : b < 100 ? 1 : 0, units[u]);
}

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// kB value of a "Key:   123 kB" line in a /proc file; -1 if absent.
int64_t proc_kb(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + ":") == 0) return std::atoll(line.c_str() + key.size() + 1);
  return -1;
}

// The weight files of a checkpoint folder as Engine::load will open them (index shards or model.safetensors).
std::vector<fs::path> weight_files(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::set<std::string> names;
    try {
      std::ifstream in(index);
      const auto j = nlohmann::json::parse(in);
      for (const auto& [k, v] : j.at("weight_map").items()) names.insert(v.get<std::string>());
    } catch (const std::exception&) {
      return {};  // Engine::load reports the malformed index with its own message
    }
    std::vector<fs::path> out;
    for (const auto& n : names) out.push_back(dir / n);
    return out;
  }
  if (fs::exists(dir / "model.safetensors")) return {dir / "model.safetensors"};
  return {};
}

}  // namespace

// One status line on stderr: rewritten in place on a terminal, printed once (final) otherwise. (Outside the
// anonymous namespace: PrefillLine::Impl holds one.)
class StatusLine {
 public:
  explicit StatusLine(bool quiet) : quiet_(quiet), tty_(isatty(2)) {
    // While the line is live on a terminal, the library's notes (the GPU backend's "backend cuda: ..." lines, from
    // the loading thread) go above it: the line cleared, the note, the line again.
    // The line is redrawn as its source says it now (the last drawn text may be up to a poll behind).
    if (live())
      set_notice_sink([this](std::string_view note) {
        std::lock_guard<std::mutex> lock(m_);
        if (shown_ && source_) last_ = source_();
        std::fprintf(stderr, "%s%.*s\n%s", shown_ ? "\r\033[K" : "", int(note.size()), note.data(), shown_ ? last_.c_str() : "");
        std::fflush(stderr);
      });
  }
  ~StatusLine() {
    if (live()) set_notice_sink({});
  }
  StatusLine(const StatusLine&) = delete;
  StatusLine& operator=(const StatusLine&) = delete;
  bool live() const { return !quiet_ && tty_; }  // whether the line is drawn at all
  // What the line says at any moment (callable from another thread), for a redraw between updates.
  void set_source(std::function<std::string()> f) {
    std::lock_guard<std::mutex> lock(m_);
    source_ = std::move(f);
  }
  void update(const std::string& s) {
    if (!live()) return;
    std::lock_guard<std::mutex> lock(m_);
    std::fprintf(stderr, "\r\033[K%s", s.c_str());
    std::fflush(stderr);
    last_ = s, shown_ = true;
  }
  void clear() {  // the live line erased, nothing in its place
    std::lock_guard<std::mutex> lock(m_);
    if (shown_) std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }
  void finish(const std::string& s) {
    if (quiet_) return;
    std::lock_guard<std::mutex> lock(m_);
    if (shown_) std::fprintf(stderr, "\r\033[K");
    std::fprintf(stderr, "%s\n", s.c_str());
    shown_ = false;
  }

 private:
  bool quiet_, tty_, shown_ = false;
  std::mutex m_;
  std::string last_;
  std::function<std::string()> source_;
};

namespace {

// Reads every file once (8 MB at a time), reporting bytes, rate and ETA. Returns the seconds it took.
double page_in(const std::vector<fs::path>& files, uint64_t total, StatusLine& line, const std::string& what) {
  std::vector<char> buf(8 << 20);
  uint64_t done = 0;
  const auto t0 = Clock::now();
  auto last = t0;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;  // Engine::load already opened it; a vanished file is not this pass's business
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) {
      done += uint64_t(n);
      if (since(last) > 0.1) {
        last = Clock::now();
        const double el = since(t0), rate = done / std::max(el, 1e-9);
        line.update(fmt::format("{}: paging in weights {} / {} ({:.0f}%), {}/s, ETA {:.0f} s", what, human_bytes(double(done)),
                                human_bytes(double(total)), 100.0 * double(done) / double(std::max<uint64_t>(total, 1)),
                                human_bytes(rate), double(total - std::min(total, done)) / std::max(rate, 1.0)));
      }
    }
    ::close(fd);
  }
  return since(t0);
}

}  // namespace

std::string rates_text(int64_t prompt_tokens, double prefill_seconds, int64_t generated, double decode_seconds) {
  return fmt::format("prefill {:.1f} tok/s, decode {}", double(prompt_tokens) / std::max(prefill_seconds, 1e-9),
                     generated > 1 ? fmt::format("{:.1f} tok/s", double(generated - 1) / std::max(decode_seconds, 1e-9))
                                   : std::string("n/a (the one token came with the prefill)"));
}

struct PrefillLine::Impl {
  Impl(Session& s, bool quiet) : session(s), line(quiet) {}
  Session& session;
  StatusLine line;
  Clock::time_point t0 = Clock::now(), drawn;
  bool shown = false, finished = false;  // finished: done() was called (the reply has begun)
};

PrefillLine::PrefillLine(Session& session, bool quiet) : impl_(std::make_unique<Impl>(session, quiet)) {
  Impl* p = impl_.get();
  // No line to draw (-q, or stderr is no terminal): no progress function, whose presence makes each prefill save
  // the session's window rows first (Session::set_prefill_stop) where nothing else (a stop) asks for it.
  if (!p->line.live()) return;
  session.set_prefill_progress([p](int64_t done, int64_t total) {
    if (p->finished || (p->shown && since(p->drawn) < 0.1)) return;  // at most 10 redraws a second
    p->drawn = Clock::now();
    const double s = since(p->t0), rate = double(done) / std::max(s, 1e-9);
    p->line.update(fmt::format("prefill: {} / {} tokens ({:.0f} %), {:.1f} tok/s, about {:.0f} s left", done, total,
                               100.0 * double(done) / double(total), rate, double(total - done) / std::max(rate, 1e-9)));
    p->shown = true;
  });
}
PrefillLine::~PrefillLine() {
  impl_->session.set_prefill_progress({});
  done();
}

void PrefillLine::done() {
  impl_->finished = true;
  if (!impl_->shown) return;
  impl_->line.clear();
  impl_->shown = false;
}

std::string count_text(int64_t n, const char* noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

std::string memory_report() {
  const int64_t rss = proc_kb("/proc/self/status", "VmRSS"), anon = proc_kb("/proc/self/status", "RssAnon"),
                file = proc_kb("/proc/self/status", "RssFile");
  if (rss < 0) return {};
  if (anon < 0 || file < 0) return fmt::format("RSS {}", human_bytes(rss * 1024.0));
  return fmt::format("RSS {} = {} anonymous + {} file-backed", human_bytes(rss * 1024.0), human_bytes(anon * 1024.0),
                     human_bytes(file * 1024.0));
}

void add_model_options(CLI::App* cmd, ModelArgs& a) {
  cmd->add_option("-m,--model", a.dir,
                  fmt::format("model folder: config.json, safetensors weights, tokenizer.json (default: the bundled {}, "
                              "relative to the current directory)", kDefaultModel));
  cmd->add_option("--patches", a.patches, "comma-separated speed patches / numerics mode / presets such as cuda.fast (see `plumb patches`)");
  cmd->add_option("--backend", a.backend, "cpu (the fp32 reference) or cuda (every op on the GPU; needs a Hopper GPU)")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a.prefill_chunk, "feed longer prompts in forward passes of at most this many tokens "
                  "(0: one pass; each pass's activations grow with it)")
      ->capture_default_str();
  cmd->add_flag("--no-preload", a.no_preload, "do not page the weights in after mapping them (they load on first use)");
  cmd->add_flag("-q,--quiet", a.quiet, "no loading progress or memory lines on stderr");
}

void add_sampling_options(CLI::App* cmd, GenArgs& a) {
  SamplingParams& s = a.gen.sampling;
  cmd->add_option("-n,--max-tokens", a.gen.max_tokens, "most tokens to generate")->capture_default_str();
  // Parsed here: CLI11 wrapped -1 into the unsigned seed 2^64 - 1, and into a signed one saturates 2^64 - 1 to
  // 2^63 - 1, both silently. -1 means random, as llama.cpp reads it.
  cmd->add_option_function<std::string>(
      "--seed",
      [&a](const std::string& v) {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (ec != std::errc() || end != v.data() + v.size() || x < -1)
          throw CLI::ValidationError("--seed", "expected an integer from 0 to 9223372036854775807 (or -1: random), got '" + v + "'");
        a.seed = x;
      },
      "sampling seed, 0 to 2^63 - 1 (default, or -1: a random one, printed in the summary)")
      ->type_name("INT");  // (parsed from text above; --help names what it takes)
  cmd->add_option("--temperature", s.temperature, "softmax temperature; 0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", s.top_k, "keep the k most likely tokens; 0 = off")->capture_default_str();
  cmd->add_option("--top-p", s.top_p, "keep the smallest set of tokens whose probability reaches p; 1 = off")
      ->capture_default_str();
  cmd->add_option("--min-p", s.min_p, "drop tokens less likely than min-p times the top token; 0 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-penalty", s.repeat_penalty, "divide (multiply if negative) the logits of recent tokens; 1 = off")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", s.presence_penalty, "subtract from the logit of every recent token")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", s.frequency_penalty, "subtract this times its count from each recent token's logit")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", s.penalty_last_n, "how many recent tokens the penalties look at; -1 = all")
      ->capture_default_str();
  // One value per flag: `--stop "the end" brave` would otherwise take the stray word as a second stop string.
  cmd->add_option("--stop", a.gen.stop_strings, "stop when the output contains this text (one per flag: repeat the flag "
                  "for more; not printed)")
      ->type_name("TEXT")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--stop-token", a.stop_token_ids, "stop at this token id (one per flag: repeat the flag for more; EOS "
                  "always stops)")
      ->type_name("INT")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

std::string model_dir(const ModelArgs& a) {
  if (a.dir.empty()) {
    PLUMB_CHECK(fs::is_directory(kDefaultModel),
                "no model given (-m DIR) and the bundled default model {} is not in the current directory {}: run "
                "from the plumb repository root or pass -m DIR", kDefaultModel, fs::current_path().string());
    return kDefaultModel;
  }
  PLUMB_CHECK(fs::exists(a.dir), "model folder {} does not exist", a.dir);
  PLUMB_CHECK(fs::is_directory(a.dir), "{} is not a folder: -m takes the model folder (config.json, weights, "
              "tokenizer.json)", a.dir);
  return a.dir;
}

LoadedModel load_model(const ModelArgs& a) {
  LoadedModel m;
  m.dir = model_dir(a);
  m.tok.emplace(Tokenizer::load(m.dir));

  const auto files = weight_files(m.dir);
  uint64_t total = 0;
  for (const auto& f : files) total += fs::exists(f) ? fs::file_size(f) : 0;
  const std::string what = fmt::format("loading {}", m.dir);
  const std::string weights = fmt::format("{} of weights in {} file{}", human_bytes(double(total)), files.size(),
                                          files.size() == 1 ? "" : "s");
  StatusLine line(a.quiet);
  const auto t0 = Clock::now();
  // Mapping runs on a worker so the line can show that something is happening on a slow (network) disk.
  std::atomic<int64_t> layers_done{0}, layers_total{0}, uploaded{0};  // (the upload counts the same layers)
  EngineOptions eo{a.patches, a.backend,
                   [&](const LoadProgress& p) {
                     if (std::string_view(p.stage) == "upload") uploaded = p.done;
                     else layers_done = p.done, layers_total = p.total;
                   },
                   a.prefill_chunk};
  // Binding reaches n/n before the GPU backend uploads the layers (`--backend cuda`), counting them again (the
  // embedding and head go up first, while the line says layer 0).
  auto loading_text = [&] {
    const int64_t done = layers_done, n = layers_total;
    if (a.backend == "cuda" && n && done == n)
      return fmt::format("{}: {}, uploading to the GPU: layer {}/{}, {:.1f} s", what, weights, int64_t(uploaded), n, since(t0));
    return n ? fmt::format("{}: mapping {}, layer {}/{} bound, {:.1f} s", what, weights, done, n, since(t0))
             : fmt::format("{}: mapping {}, {:.1f} s", what, weights, since(t0));
  };
  line.set_source(loading_text);  // (declared before the load's future, so it outlives the loading thread)
  auto fut = std::async(std::launch::async, [&] { return Engine::load(m.dir, eo); });
  while (fut.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) line.update(loading_text());
  line.set_source({});
  m.engine = fut.get();
  const double map_s = since(t0);
  // The GPU without patches is the fp32 twin (the reference's arithmetic on the device): exact and slow, a fine
  // check but rarely what a user who asked for the GPU wants; say how to get the fast kernels. (After the load: a
  // machine without a GPU gets the one error line alone.)
  if (a.backend == "cuda" && a.patches.empty() && !a.quiet)
    line.finish("note: --backend cuda without --patches runs the GPU's fp32 twin of the reference (exact, slow); "
                "--patches cuda.fast runs the fast kernels");

  std::string paged = "not paged in (--no-preload)";
  if (!a.no_preload) {
    const int64_t avail_kb = proc_kb("/proc/meminfo", "MemAvailable");
    if (avail_kb >= 0 && double(total) > 0.5 * double(avail_kb) * 1024.0) {
      paged = fmt::format("not paged in ({} available: pages load on first use)", human_bytes(avail_kb * 1024.0));
    } else {
      const double s = page_in(files, total, line, what);
      paged = fmt::format("paged in at {}/s", human_bytes(double(total) / std::max(s, 1e-6)));
    }
  }
  const auto& info = m.engine->info();
  line.finish(fmt::format("loaded {}: {}; {}, mapped{} in {:.2f} s, {}", m.dir, info.summary, weights,
                          info.device.empty() ? "" : " and uploaded to the GPU", map_s, paged));
  if (!a.quiet) {
    const std::string mem = memory_report();
    if (!mem.empty())
      std::fprintf(stderr, "memory: %s (the weights are mapped from the files, not copied)\n", mem.c_str());
    if (!info.device.empty())
      fmt::print(stderr, "gpu memory: the weights took {} of the GPU ({}){}; {} free of {} for the caches\n",
                 human_bytes(double(info.device_loaded_bytes)), info.device,
                 info.host_weight_bytes ? fmt::format(" and {} of pinned host memory", human_bytes(double(info.host_weight_bytes))) : "",
                 human_bytes(double(info.device_free_bytes)), human_bytes(double(info.device_total_bytes)));
  }
  m.eos = info.eos_token >= 0 ? info.eos_token : m.tok->eos_id();
  return m;
}

GenerateOptions generate_options(const GenArgs& a, const LoadedModel& m, uint64_t& seed) {
  GenerateOptions g = a.gen;
  seed = a.seed && *a.seed >= 0 ? uint64_t(*a.seed) : std::random_device{}();
  g.sampling.seed = seed;
  g.stop_tokens = a.stop_token_ids;
  // Checked once, after the load (chat would otherwise refuse every turn and go on).
  for (const int32_t id : a.stop_token_ids)
    PLUMB_CHECK(id >= 0 && id < m.engine->info().vocab_size, "--stop-token {}: outside the model's vocabulary [0, {})", id,
                m.engine->info().vocab_size);
  if (m.eos >= 0) g.stop_tokens.push_back(m.eos);
  if (m.tok->eos_id() >= 0 && m.tok->eos_id() != m.eos) g.stop_tokens.push_back(m.tok->eos_id());
  return g;
}

void add_chat_mode_options(CLI::App* cmd, ChatModeArgs& a, const char* system_help, const char* think_help) {
  cmd->add_option("--system", a.system, system_help)->each([&a](const std::string&) { a.system_given = true; });
  auto* t = cmd->add_flag("--think", a.think, think_help);
  cmd->add_flag("--no-think", a.no_think, "non-thinking chat mode (the default)")->excludes(t);
  // (thinking mode's alone: without --think it changed nothing, silently)
  cmd->add_option("--reasoning-effort", a.effort, "thinking mode's effort prompt: high (none) or max; needs --think")
      ->check(CLI::IsMember({"high", "max"}))
      ->needs(t);
}

void add_json_options(CLI::App* cmd, JsonArgs& a, const char* reply) {
  auto* j = cmd->add_flag("--json", a.json, fmt::format("JSON mode: {} one JSON object (each token that would break "
                                                        "its syntax is masked; ask for JSON in the prompt too)", reply));
  cmd->add_option("--json-schema", a.schema_file, fmt::format("structured output: {} one JSON object valid under the "
                                                              "JSON Schema in this file (its supported subset: "
                                                              "docs/generation.md)", reply))
      ->each([&a](const std::string&) { a.schema_given = true; })
      ->excludes(j);
}

JsonFormat json_format(const JsonArgs& a, bool think) {
  // (JSON mode masks every token from the first: a thinking reply's reasoning would have to be JSON too)
  PLUMB_CHECK(!((a.json || a.schema_given) && think), "{} cannot be combined with --think: the reasoning would be held "
              "to JSON too", a.json ? "--json" : "--json-schema");
  JsonFormat f;
  if (a.json) f.format = OutputFormat::JsonObject;
  if (a.schema_given) {
    f.format = OutputFormat::JsonSchema;
    f.schema = read_text_file(a.schema_file, "--json-schema file");
    check_json_schema(f.schema);  // (an empty file: "not valid JSON")
  }
  return f;
}

}  // namespace plumb::cli
