// Unit tests of the tokenizer on small hand-written tokenizer.json files:
// merges in both forms, byte fallback, unknown tokens, ignore_merges, added
// and special tokens (longest first, parse_special off), decoders, and a
// 100k-character word that must finish (the merge loop is O(n log n)).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace k3::tok {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// A SentencePiece-style BPE: Prepend/Replace normalizer, byte fallback,
// decoder Replace + ByteFallback + Fuse + Strip (as Llama-2 ships it).
json sp_tokenizer(json merges) {
  json vocab = {{"<unk>", 0},
                {"<s>", 1},
                {"</s>", 2},
                {"\xE2\x96\x81", 3},
                {"a", 4},
                {"b", 5},
                {"c", 6},
                {"ab", 7},
                {"abc", 8},
                {"\xE2\x96\x81"
                 "abc",
                 9}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 10 + b;
  }
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
            {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
            {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}}},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", true},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", merges}}}};
}

Tokenizer load(const json& j) {
  auto t = Tokenizer::from_json_text(j.dump());
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

Ids encode(const Tokenizer& t, const std::string& text, bool add_special = false, bool parse_special = true) {
  auto ids = t.encode(text, EncodeOptions{add_special, parse_special});
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? *ids : Ids{};
}

std::string decode(const Tokenizer& t, const Ids& ids, bool skip = false) {
  auto s = t.decode(ids, skip);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : "";
}

TEST(Tokenizer, MergesInBothFormsGiveTheSameIds) {
  const Tokenizer legacy = load(sp_tokenizer({"a b", "ab c", "\xE2\x96\x81 abc"}));
  // (json::array: a braced list of string pairs would become an object.)
  const Tokenizer pairs = load(sp_tokenizer(
      json::array({json::array({"a", "b"}), json::array({"ab", "c"}), json::array({"\xE2\x96\x81", "abc"})})));
  EXPECT_EQ(encode(legacy, "abc"), (Ids{9}));
  EXPECT_EQ(encode(pairs, "abc"), (Ids{9}));
  EXPECT_EQ(encode(legacy, "abc ab", true), (Ids{1, 9, 3, 7}));
  EXPECT_EQ(encode(pairs, "abc ab", true), (Ids{1, 9, 3, 7}));
}

TEST(Tokenizer, MergeRankDecidesOrder) {
  // Rank is list position; "ab c" can only apply once "a b" has made "ab".
  const Tokenizer t = load(sp_tokenizer({"ab c", "a b"}));
  EXPECT_EQ(encode(t, "abc"), (Ids{3, 8}));
}

TEST(Tokenizer, ByteFallbackAndDecode) {
  const Tokenizer t = load(sp_tokenizer({"a b"}));
  // "é" is not in the vocabulary: its two UTF-8 bytes C3 A9 become <0xC3> <0xA9>.
  EXPECT_EQ(encode(t, "\xC3\xA9"), (Ids{3, 10 + 0xC3, 10 + 0xA9}));
  EXPECT_EQ(decode(t, {3, 10 + 0xC3, 10 + 0xA9}), "\xC3\xA9");
  EXPECT_EQ(decode(t, {1, 3, 4, 3, 5}), "<s> a b");
  EXPECT_EQ(decode(t, {1, 3, 4, 3, 5}, /*skip=*/true), "a b");
  // An invalid byte run: one U+FFFD per byte (as tokenizers' ByteFallback).
  EXPECT_EQ(decode(t, {4, 10 + 0xC3, 10 + 0x28}), "a\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Tokenizer, UnknownCharactersFuseIntoOneUnk) {
  json j = sp_tokenizer({"a b"});
  j["model"]["byte_fallback"] = false;
  const Tokenizer t = load(j);
  EXPECT_EQ(encode(t,
                   "a\xC3\xA9\xC3\xA9"
                   "b"),
            (Ids{3, 4, 0, 5}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(encode(load(j),
                   "a\xC3\xA9\xC3\xA9"
                   "b"),
            (Ids{3, 4, 0, 0, 5}));
}

TEST(Tokenizer, IgnoreMergesTakesWholeWordFromVocab) {
  // Merges alone cannot build "abc" ("b c" is not a merge); ignore_merges
  // takes the word straight from the vocabulary.
  json j = sp_tokenizer({"b c"});
  j["model"]["vocab"]["bc"] = 300;
  j["normalizer"] = nullptr;
  EXPECT_EQ(encode(load(j), "abc"), (Ids{4, 300}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(encode(load(j), "abc"), (Ids{8}));
}

TEST(Tokenizer, SpecialTokensLongestFirstAndNoParseFlag) {
  json j = sp_tokenizer({"a b"});
  j["normalizer"] = nullptr;
  j["model"]["vocab"]["<"] = 300;
  j["model"]["vocab"][">"] = 301;
  j["model"]["vocab"]["|"] = 302;
  j["added_tokens"].push_back({{"id", 400}, {"content", "<|a|>"}, {"special", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", 401}, {"content", "<|a|>b"}, {"special", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", 402}, {"content", "<c>"}, {"special", false}, {"normalized", false}});
  const Tokenizer t = load(j);
  // Longest match wins over the shorter prefix token.
  EXPECT_EQ(encode(t, "<|a|>b<|a|>c"), (Ids{401, 400, 6}));
  // parse_special off: control tokens stay text; plain added tokens still match.
  EXPECT_EQ(encode(t, "<|a|>b<c>", false, false), (Ids{300, 302, 4, 302, 301, 5, 402}));
  EXPECT_EQ(decode(t, {401, 402}), "<|a|>b<c>");
  EXPECT_TRUE(t.is_special(401));
  EXPECT_FALSE(t.is_special(402));
}

TEST(Tokenizer, ByteLevelRoundTrip) {
  // A byte-level BPE with all 256 byte characters and the GPT-2 split regex.
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_char(static_cast<unsigned char>(b))] = b;
  const std::string h = byte_to_char('h'), i = byte_to_char('i'), sp = byte_to_char(' ');
  vocab[h + i] = 256;
  vocab[sp + h] = 257;
  json j = {{"model",
             {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({json::array({h, i}), json::array({sp, h})})}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}}};
  const Tokenizer t = load(j);
  // " hi": Ġ h i; "h i" ranks before "Ġ h", so it wins and "Ġ hi" is no merge.
  EXPECT_EQ(encode(t, "hi hi"), (Ids{256, ' ', 256}));
  const std::string text = "it's caf\xC3\xA9 \xF0\x9F\x98\x80!\r\n\t 123";
  EXPECT_EQ(decode(t, encode(t, text)), text);
  // Invalid input bytes are replaced by U+FFFD before encoding.
  EXPECT_EQ(decode(t, encode(t,
                             "a\xFF"
                             "b")),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(StreamDecoder, NeverSplitsACharacter) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_to_char(static_cast<unsigned char>(b))] = b;
  const Tokenizer t = load({{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
                            {"decoder", {{"type", "ByteLevel"}}}});
  StreamDecoder s(t);
  // U+1F600 is F0 9F 98 80: nothing comes out until its last byte.
  EXPECT_EQ(*s.push('a'), "a");
  EXPECT_EQ(*s.push(0xF0), "");
  EXPECT_EQ(*s.push(0x9F), "");
  EXPECT_EQ(*s.push(0x98), "");
  EXPECT_EQ(*s.push(0x80), "\xF0\x9F\x98\x80");
  // A byte that can never start a character comes out at once as U+FFFD.
  EXPECT_EQ(*s.push(0xFF), "\xEF\xBF\xBD");
  // A started character broken by another byte: U+FFFD, then the new byte.
  EXPECT_EQ(*s.push(0xE2), "");
  EXPECT_EQ(*s.push('x'), "\xEF\xBF\xBDx");
  // Left incomplete at the end: flushed as U+FFFD.
  EXPECT_EQ(*s.push(0xE2), "");
  EXPECT_EQ(*s.push(0x82), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");
  EXPECT_FALSE(s.push(100000).ok());
}

TEST(StreamDecoder, MatchesBatchDecodeForSentencePiece) {
  const Tokenizer t = load(sp_tokenizer({"a b", "ab c", "\xE2\x96\x81 abc"}));
  const Ids ids = encode(t, "abc \xE4\xB8\xAD ab", true);
  StreamDecoder s(t);
  std::string streamed;
  for (int32_t id : ids) streamed += *s.push(id);
  streamed += s.finish();
  EXPECT_EQ(streamed, decode(t, ids));
  EXPECT_EQ(streamed, "<s> abc \xE4\xB8\xAD ab");
}

TEST(Unicode, LossyMatchesPythonReplace) {
  // Expected values from bytes.decode("utf-8", "replace").
  EXPECT_EQ(utf8_lossy("\xE2\x82"
                       "x"),
            "\xEF\xBF\xBDx");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("ok \xC3\xA9"), "ok \xC3\xA9");
  auto nfc = normalize_unicode("cafe\xCC\x81", NormalForm::kNfc);
  ASSERT_TRUE(nfc.ok());
  EXPECT_EQ(*nfc, "caf\xC3\xA9");
}

TEST(Tokenizer, PathologicalLongWordFinishes) {
  // 100k identical characters: one word of 100k symbols through the merge loop.
  json vocab = {{"a", 0}, {"aa", 1}, {"aaaa", 2}, {" ", 3}};
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a a", "aa aa"}}}},
            {"pre_tokenizer",
             {{"type", "Split"},
              {"pattern", {{"Regex", R"( ?\p{L}+|\s+(?!\S)|\s+)"}}},
              {"behavior", "Isolated"},
              {"invert", false}}}};
  const Tokenizer t = load(j);
  const Ids ids = encode(t, std::string(100000, 'a'));
  EXPECT_EQ(ids, Ids(25000, 2));
  const Ids spaces = encode(t, std::string(100000, ' ') + "a");
  ASSERT_EQ(spaces.size(), 100001u);
  EXPECT_EQ(spaces.back(), 0);
}

TEST(TokenizerJson, MalformedInputGivesOneLineErrors) {
  auto error_of = [](const std::string& text) {
    auto t = Tokenizer::from_json_text(text);
    EXPECT_FALSE(t.ok());
    const std::string m = t.ok() ? "" : t.status().message();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  };
  auto has = [&](const std::string& text, const std::string& part) {
    const std::string m = error_of(text);
    EXPECT_NE(m.find(part), std::string::npos) << "error \"" << m << "\" lacks \"" << part << "\"";
  };
  const std::string bpe = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
  has("{not json", "not valid JSON");
  has("[]", "expected an object");
  has("{}", "model: missing");
  has(R"({"model": {"type": "WordPiece", "vocab": {}}})", "unsupported model type \"WordPiece\"");
  has(R"({"model": {"type": "BPE", "vocab": [], "merges": []}})", "model.vocab: expected an object");
  has(R"({"model": {"type": "BPE", "vocab": {"a": "x"}, "merges": []}})", "model.vocab[\"a\"]");
  has(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", "model.merges: missing");
  has(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [5]}})", "model.merges[0]");
  has(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})", "model.merges[0]");
  has(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "\"b\" is not in the vocabulary");
  has("{" + bpe + R"(, "normalizer": {"type": "Lowercase"}})", "unsupported normalizer type \"Lowercase\"");
  has("{" + bpe + R"(, "normalizer": {}})", "normalizer.type: missing");
  has("{" + bpe + R"(, "pre_tokenizer": {"type": "Whitespace"}})", "unsupported pre_tokenizer type");
  has("{" + bpe + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}})",
      "pre_tokenizer.pattern.Regex");
  has("{" + bpe + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Odd"}})",
      "unknown split behavior");
  has("{" + bpe + R"(, "decoder": {"type": "WordPiece"}})", "unsupported decoder type \"WordPiece\"");
  has("{" + bpe + R"(, "added_tokens": [{"id": "x", "content": "a"}]})", "added_tokens[0].id: expected an integer");
  has("{" + bpe +
          R"(, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}], "special_tokens": {}}})",
      "post_processor.special_tokens.<s>: missing");
  // A missing file is an error too, not a crash.
  EXPECT_FALSE(Tokenizer::load("/nonexistent/tokenizer.json").ok());
}

}  // namespace
}  // namespace k3::tok
