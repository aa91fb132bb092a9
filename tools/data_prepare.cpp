// `shardwise data prepare --tokenizer FILE` (and --jsonl): inputs streamed in pieces, encoded
// on a pool of threads, written in order through engine/data.h's TokenWriter / MaskWriter.
//
//   reader (this thread)        a text file is read 1 MiB at a time and cut into pieces of
//                               about `target` bytes where Tokenizer::chunk_cut allows (the
//                               pieces' ids joined are the whole file's, for byte-level BPE);
//                               a JSONL file into pieces of whole lines. At most
//                               threads * 4 pieces (a batch) are held at once.
//   pool (--threads workers)    encodes a batch's pieces, any worker any piece; the workers
//                               live for the whole run, so the BPE's per-thread word caches
//                               stay warm.
//   writer (this thread)        appends the batch's ids in input order; piece i goes to the
//                               validation file when floor((i+1) F) > floor(i F).
//   progress (a thread)         the bar on stderr, four times a second (a terminal only).
// The piece size, clamp(total bytes / 256, 4 KiB, 1 MiB), depends on the input alone, so the
// files (and the --val split) are the same for any --threads. A text with no place to cut (a
// tokenizer with ByteLevel's add_prefix_space, or no "X\n" + letter in it) is read whole.
// Memory: a batch (threads * 4 pieces) and its ids, whatever the input's size.
#include "tools/data_prepare.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "engine/data.h"
#include "engine/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Workers that live for the whole run; run(n, fn) calls fn(0..n-1) on them and waits.
class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; i++) threads_.emplace_back([this] { work(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void run(size_t n, const std::function<void(size_t)>& fn) {
    std::unique_lock<std::mutex> l(m_);
    fn_ = &fn;
    count_ = n;
    next_ = done_ = 0;
    cv_.notify_all();
    done_cv_.wait(l, [&] { return done_ == count_; });
    fn_ = nullptr;
  }

 private:
  void work() {
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || next_ < count_; });
      if (stop_) return;
      const size_t i = next_++;
      const std::function<void(size_t)>* fn = fn_;
      l.unlock();
      (*fn)(i);
      l.lock();
      if (++done_ == count_) done_cv_.notify_one();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t count_ = 0, next_ = 0, done_ = 0;
  bool stop_ = false;
};

// A piece of input, encoded by one worker.
struct Piece {
  std::string text;          // a text file's bytes, or whole JSONL lines joined by '\n'
  bool doc_end = false;      // text: the file ends here (its end-of-text id follows)
  const std::string* file = nullptr;
  int64_t first_line = 0;    // JSONL: the line number of the piece's first line
  std::vector<int32_t> ids;  // results
  std::vector<uint8_t> mask;
  bool masked = false;  // a prompt / completion line was in it
  std::string error;
};

std::string human_bytes(double b) {
  char s[32];
  if (b >= 1e9)
    std::snprintf(s, sizeof s, "%.2f GB", b / 1e9);
  else
    std::snprintf(s, sizeof s, "%.1f MB", b / 1e6);
  return s;
}

class Preparer {
 public:
  Preparer(const PrepareArgs& a, const sw::Tokenizer& tok, int threads, uint64_t total)
      : a_(a), tok_(tok), threads_(threads), total_(total), pool_(threads) {
    target_ = std::clamp<size_t>(static_cast<size_t>(total / 256), 4096, 1 << 20);
    ensure_parent_dir(a.out);
    train_ = std::make_unique<sw::TokenWriter>(a.out, tok.vocab_size());
    if (a.jsonl) train_mask_ = std::make_unique<sw::MaskWriter>(sw::mask_path_for(a.out));
    if (!a.val.empty()) {
      ensure_parent_dir(a.val);
      val_ = std::make_unique<sw::TokenWriter>(a.val, tok.vocab_size());
      if (a.jsonl) val_mask_ = std::make_unique<sw::MaskWriter>(sw::mask_path_for(a.val));
    }
  }

  void run() {
    start_ = Clock::now();
    const bool bar = !a_.quiet && ::isatty(2);
    std::thread progress;
    if (bar) progress = std::thread([this] { show_progress(); });
    try {
      for (const std::string& f : a_.inputs) a_.jsonl ? read_jsonl(f) : read_text(f);
      flush();
    } catch (...) {
      stop_progress(progress);
      throw;
    }
    stop_progress(progress);
    if (bar) std::fputc('\n', stderr);
    finish();
  }

 private:
  void stop_progress(std::thread& t) {
    stop_ = true;
    if (t.joinable()) t.join();
  }

  void show_progress() {
    auto last = Clock::now();
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (Clock::now() - last < std::chrono::milliseconds(250) && !stop_) continue;
      last = Clock::now();
      const double done = static_cast<double>(bytes_done_.load());
      const double s = std::chrono::duration<double>(Clock::now() - start_).count();
      const double frac = total_ > 0 ? std::min(1.0, done / static_cast<double>(total_)) : 1.0;
      char line[160];
      const int w = 30, fill = static_cast<int>(frac * w + 0.5);
      std::string barstr(static_cast<size_t>(fill), '#');
      barstr.append(static_cast<size_t>(w - fill), '.');
      std::snprintf(line, sizeof line, "\r[%s] %5.1f%%  %s / %s  %.2f M tokens/s   ",
                    barstr.c_str(), 100 * frac, human_bytes(done).c_str(),
                    human_bytes(static_cast<double>(total_)).c_str(),
                    s > 0 ? static_cast<double>(tokens_.load()) / s / 1e6 : 0.0);
      std::fputs(line, stderr);
      std::fflush(stderr);
    }
  }

  void add(Piece&& p) {
    batch_bytes_ += p.text.size();
    batch_.push_back(std::move(p));
    if (batch_.size() >= static_cast<size_t>(threads_) * 4 ||
        batch_bytes_ >= static_cast<size_t>(threads_) * (4u << 20))
      flush();
  }

  void read_text(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) sw::fail("data", "cannot open input file '" + path + "'");
    std::unique_ptr<FILE, int (*)(FILE*)> closer(f, &std::fclose);
    std::string pending;
    std::vector<char> buf(1 << 20);
    bool eof = false;
    size_t need = 2 * target_;
    for (;;) {
      while (!eof && pending.size() < need) {
        const size_t n = std::fread(buf.data(), 1, buf.size(), f);
        if (n == 0) {
          if (std::ferror(f)) sw::fail("data", "error reading input file '" + path + "'");
          eof = true;
        }
        pending.append(buf.data(), n);
      }
      if (pending.empty()) return;  // an empty file is no document
      size_t next = 0;
      const size_t cut = tok_.chunk_cut(pending, target_, &next);
      if (cut >= pending.size() && !eof) {  // no place to cut yet: read on
        need = pending.size() * 2;
        continue;
      }
      need = 2 * target_;
      Piece p;
      p.text = pending.substr(0, cut);
      pending.erase(0, next);
      const bool end = eof && pending.empty();
      p.doc_end = end;
      add(std::move(p));
      if (end) return;
    }
  }

  void read_jsonl(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) sw::fail("data", "cannot open input file '" + path + "'");
    Piece p;
    int64_t line_no = 0;
    for (std::string line; std::getline(f, line);) {
      line_no++;
      if (p.text.empty()) {
        p.file = &path;
        p.first_line = line_no;
      } else {
        p.text += '\n';
      }
      p.text += line;
      if (p.text.size() >= target_) {
        add(std::move(p));
        p = Piece();
      }
    }
    if (f.bad()) sw::fail("data", "error reading input file '" + path + "'");
    if (!p.text.empty()) add(std::move(p));
  }

  void encode(Piece& p) const {
    try {
      const int32_t eot = tok_.eot_id();
      if (!a_.jsonl) {
        p.ids = tok_.encode(p.text);
        if (p.doc_end && eot >= 0) p.ids.push_back(eot);
        return;
      }
      int64_t line = p.first_line;
      for (size_t pos = 0; pos <= p.text.size(); pos++, line++) {
        size_t nl = p.text.find('\n', pos);
        if (nl == std::string::npos) nl = p.text.size();
        const std::string_view l(p.text.data() + pos, nl - pos);
        pos = nl;
        if (l.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        auto where = [&] { return *p.file + ":" + std::to_string(line); };  // errors only
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(l);
        } catch (const nlohmann::json::exception& e) {
          sw::fail("data", where() + ": not valid JSON: " + e.what());
        }
        auto str = [&](const char* k) { return j.is_object() && j.contains(k) && j[k].is_string(); };
        auto put = [&](const std::string& text, uint8_t m) {
          const auto ids = tok_.encode(text);
          p.ids.insert(p.ids.end(), ids.begin(), ids.end());
          p.mask.insert(p.mask.end(), ids.size(), m);
        };
        if (str("text")) {
          put(j["text"].get<std::string>(), 1);
        } else if (str("prompt") && str("completion")) {
          put(j["prompt"].get<std::string>(), 0);
          put(j["completion"].get<std::string>(), 1);
          p.masked = true;
        } else {
          sw::fail("data", where() + ": neither a \"text\" string nor \"prompt\" and "
                                     "\"completion\" strings");
        }
        if (eot >= 0) {
          p.ids.push_back(eot);
          p.mask.push_back(1);
        }
      }
    } catch (const std::exception& e) {
      p.error = e.what();
    }
  }

  void flush() {
    if (batch_.empty()) return;
    pool_.run(batch_.size(), [this](size_t i) {
      encode(batch_[i]);
      bytes_done_ += batch_[i].text.size();
      tokens_ += static_cast<int64_t>(batch_[i].ids.size());
    });
    for (Piece& p : batch_) {
      if (!p.error.empty()) throw sw::Error(p.error);
      const double F = a_.val_fraction;
      const bool to_val = val_ && std::floor(static_cast<double>(piece_ + 1) * F) >
                                      std::floor(static_cast<double>(piece_) * F);
      piece_++;
      (to_val ? val_ : train_)->append(p.ids);
      if (a_.jsonl) (to_val ? val_mask_ : train_mask_)->append(p.mask);
      masked_ = masked_ || p.masked;
    }
    batch_.clear();
    batch_bytes_ = 0;
  }

  void finish() {
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    if (train_->count() == 0) sw::fail("data", "the inputs gave no training tokens");
    if (val_ && val_->count() == 0)
      sw::fail("data", "the input is too small to split: no piece went to validation (" +
                           std::to_string(total_) + " bytes in " + std::to_string(piece_) +
                           " pieces, --val-fraction " + std::to_string(a_.val_fraction) + ")");
    auto done = [&](sw::TokenWriter& w, std::unique_ptr<sw::MaskWriter>& m) {
      w.finish();
      std::printf("wrote %s: %lld tokens (%d-byte ids)", w.path().c_str(),
                  static_cast<long long>(w.count()), w.width());
      if (m && masked_) {
        m->finish();
        std::printf(", loss mask %s", sw::mask_path_for(w.path()).c_str());
      }
      m.reset();  // unfinished without prompt / completion lines: its temporary file goes
      std::printf("\n");
    };
    done(*train_, train_mask_);
    if (val_) done(*val_, val_mask_);
    const int64_t tokens = tokens_.load();
    std::printf("%zu input files (%s), %llu bytes; tokenizer %s%s%s (vocabulary %lld, "
                "end of text %d)\n",
                a_.inputs.size(), a_.jsonl ? "JSONL" : "text",
                static_cast<unsigned long long>(total_), tok_.kind(),
                tok_.files().empty() ? "" : " ",
                tok_.files().empty() ? "" : tok_.files()[0].c_str(),
                static_cast<long long>(tok_.vocab_size()), tok_.eot_id());
    std::printf("%lld tokens in %.2f s: %.0f tokens/s on %d threads\n",
                static_cast<long long>(tokens), s, s > 0 ? static_cast<double>(tokens) / s : 0.0,
                threads_);
  }

  const PrepareArgs& a_;
  const sw::Tokenizer& tok_;
  int threads_;
  uint64_t total_;
  size_t target_ = 1 << 20;
  Pool pool_;
  std::unique_ptr<sw::TokenWriter> train_, val_;
  std::unique_ptr<sw::MaskWriter> train_mask_, val_mask_;
  std::vector<Piece> batch_;
  size_t batch_bytes_ = 0;
  int64_t piece_ = 0;
  bool masked_ = false;
  std::atomic<uint64_t> bytes_done_{0};
  std::atomic<int64_t> tokens_{0};
  std::atomic<bool> stop_{false};
  Clock::time_point start_;
};

}  // namespace

void ensure_parent_dir(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) sw::fail("data", "cannot create directory '" + parent.string() + "': " + ec.message());
}

int prepare_tokenized(const PrepareArgs& a) {
  uint64_t total = 0;
  for (const std::string& p : a.inputs) {
    std::error_code ec;
    if (!fs::exists(p, ec)) sw::fail("data", "input file '" + p + "' does not exist");
    if (fs::is_directory(p, ec)) sw::fail("data", "input '" + p + "' is a directory");
    total += fs::file_size(p, ec);
  }
  const auto tok = sw::load_tokenizer(a.tokenizer);
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) cores = CPU_COUNT(&set);  // the cores we may use
  const int threads = a.threads > 0 ? a.threads : std::max(1, cores);
  Preparer prep(a, *tok, threads, total);
  prep.run();
  return 0;
}
