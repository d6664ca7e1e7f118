#include "tokenizer/decoder.h"

#include "tokenizer/unicode.h"

namespace kestrel::tokenizer {
namespace {

// Tokens whose every character is in the bytes_to_unicode image become those bytes; any other
// token (an added token with a raw space, say) keeps its own UTF-8 bytes. The byte string is then
// read lossily: a token boundary inside a character is fine, a truncated character becomes U+FFFD.
class ByteLevel final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      const size_t mark = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size();) {
        size_t len;
        const int b = unicode_to_byte(decode_utf8(t, i, len));
        if (b < 0) { ok = false; break; }
        bytes.push_back(static_cast<char>(b));
        i += len;
      }
      if (!ok) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// Runs of <0xXX> tokens become their bytes when those form valid UTF-8, else one U+FFFD per byte.
class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    size_t n_pending = 0;
    auto flush = [&] {
      if (n_pending == 0) return;
      if (utf8_lossy(pending) == pending) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < n_pending; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      n_pending = 0;
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') byte = parse_hex(t[3], t[4]);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        ++n_pending;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }
  static int parse_hex(char a, char b) {
    const int h = hex(a), l = hex(b);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class Strip final : public Decoder {
 public:
  Strip(char32_t c, size_t start, size_t stop) : c_(c), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t i = 0; i < t.size();) {
        size_t len;
        chars.emplace_back(i, decode_utf8(t, i, len));
        i += len;
      }
      size_t lo = 0, hi = chars.size();
      while (lo < start_ && lo < hi && chars[lo].second == c_) ++lo;
      while (chars.size() - hi < stop_ && hi > lo && chars[hi - 1].second == c_) --hi;
      const size_t b = lo < chars.size() ? chars[lo].first : t.size();
      const size_t e = hi < chars.size() ? chars[hi].first : t.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  char32_t c_;
  size_t start_, stop_;
};

class Replace final : public Decoder {
 public:
  Replace(std::string pat, std::string with) : pat_(std::move(pat)), with_(std::move(with)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    if (pat_.empty()) return;
    for (auto& t : tokens) {
      std::string r;
      size_t pos = 0, hit;
      while ((hit = t.find(pat_, pos)) != std::string::npos) {
        r.append(t, pos, hit - pos);
        r += with_;
        pos = hit + pat_.size();
      }
      r.append(t, pos, std::string::npos);
      t = std::move(r);
    }
  }

 private:
  std::string pat_, with_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

std::unique_ptr<Decoder> make_byte_level_decoder() { return std::make_unique<ByteLevel>(); }
std::unique_ptr<Decoder> make_byte_fallback_decoder() { return std::make_unique<ByteFallback>(); }
std::unique_ptr<Decoder> make_fuse_decoder() { return std::make_unique<Fuse>(); }
std::unique_ptr<Decoder> make_strip_decoder(char32_t c, size_t start, size_t stop) {
  return std::make_unique<Strip>(c, start, stop);
}
std::unique_ptr<Decoder> make_replace_decoder(std::string pattern, std::string content) {
  return std::make_unique<Replace>(std::move(pattern), std::move(content));
}
std::unique_ptr<Decoder> make_sequence_decoder(std::vector<std::unique_ptr<Decoder>> parts) {
  return std::make_unique<Sequence>(std::move(parts));
}

}  // namespace kestrel::tokenizer
