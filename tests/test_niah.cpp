// tests/test_niah.cpp — NIAH task generation (budget, needle placement, determinism, answers
// extractable) and the official scoring rules on hand cases (src/eval/niah.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "crisp/error.h"
#include "eval/niah.h"

namespace ce = crisp::eval;

namespace {

// A stand-in tokenizer: whitespace-separated words of the user message and the answer prefix,
// plus a fixed overhead for a chat template. Monotone, like a real tokenizer.
constexpr int64_t kTemplateTokens = 12;
int64_t count_words(const std::string& text) {
  std::istringstream in(text);
  std::string word;
  int64_t n = 0;
  while (in >> word) ++n;
  return n;
}
const ce::PromptTokenCounter kWordCounter = [](const std::string& user, const std::string& prefix) {
  return kTemplateTokens + count_words(user) + count_words(prefix);
};

int64_t occurrences(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::vector<std::string> test_prose() {
  std::vector<std::string> paragraphs;
  for (int p = 0; p < 12; ++p) {
    std::string text = "Title " + std::to_string(p) + "\n";
    for (int s = 0; s < 6; ++s) {
      text += "Paragraph " + std::to_string(p) + " sentence " + std::to_string(s) +
              " tells of rivers, towns and the people who lived there in the old days. ";
    }
    paragraphs.push_back(text);
  }
  return paragraphs;
}

std::string haystack_of(const ce::NiahSample& s) {
  return s.user_message.substr(static_cast<std::size_t>(s.haystack_begin),
                               static_cast<std::size_t>(s.haystack_end - s.haystack_begin));
}

}  // namespace

TEST(Niah, SamplesFitTheBudgetAndPlaceTheNeedleAtTheDepth) {
  const std::vector<std::string> prose = test_prose();
  for (ce::NiahTask task : ce::all_niah_tasks()) {
    for (int64_t length : {512, 2048}) {
      for (double depth : {0.0, 0.1, 0.5, 0.9, 1.0}) {
        SCOPED_TRACE(std::string(ce::to_string(task)) + " length " + std::to_string(length) + " depth " +
                     std::to_string(depth));
        ce::NiahSpec spec{task, length, depth, 7, 32};
        const ce::NiahSample s = ce::make_niah_sample(spec, kWordCounter, prose);
        const int64_t budget = length - spec.reserved_tokens;
        EXPECT_EQ(s.prompt_tokens, kWordCounter(s.user_message, s.answer_prefix));
        EXPECT_LE(s.prompt_tokens, budget);
        // Filled: within one unit (the longest: a prose sentence of ~16 words, a needle line of 10)
        // of the budget.
        EXPECT_GE(s.prompt_tokens, budget - 20);
        EXPECT_GT(s.haystack_units, 0);

        // The needle is where the sample says, once.
        ASSERT_GE(s.needle_offset, s.haystack_begin);
        ASSERT_LE(s.needle_offset + static_cast<int64_t>(s.needle.size()), s.haystack_end);
        EXPECT_EQ(s.user_message.compare(static_cast<std::size_t>(s.needle_offset), s.needle.size(), s.needle), 0);
        const std::string haystack = haystack_of(s);
        EXPECT_EQ(occurrences(haystack, s.needle), 1);
        // The answer is extractable: in the needle, once in the whole prompt, never in the question.
        EXPECT_NE(s.needle.find(s.expected), std::string::npos);
        EXPECT_EQ(occurrences(s.user_message, s.expected), task == ce::NiahTask::passkey ? 2 : 1);
        if (!s.key.empty()) EXPECT_EQ(occurrences(haystack, s.key), 1) << "the asked key must be unambiguous";

        // Depth: measured in bytes of the haystack, it is off by at most one unit plus the other
        // needles (RULER inserts at unit boundaries too).
        const double slack = (600.0 + 4.0 * static_cast<double>(s.needle.size())) / static_cast<double>(haystack.size());
        EXPECT_NEAR(s.needle_depth, depth, slack);

        // Scoring: the expected value (as a model would say it) scores, a wrong one does not.
        EXPECT_TRUE(ce::score_niah_output(s, " " + s.expected + "."));
        EXPECT_FALSE(ce::score_niah_output(s, " I do not know."));
      }
    }
  }
}

TEST(Niah, DepthOrdersTheNeedle) {
  // A deeper needle sits strictly later in the same haystack.
  for (ce::NiahTask task : {ce::NiahTask::single_noise, ce::NiahTask::passkey, ce::NiahTask::kv_retrieval}) {
    double previous = -1.0;
    for (double depth : {0.1, 0.5, 0.9}) {
      const ce::NiahSample s = ce::make_niah_sample({task, 4096, depth, 3, 32}, kWordCounter);
      EXPECT_GT(s.needle_depth, previous) << ce::to_string(task);
      EXPECT_NEAR(s.needle_depth, depth, 0.02) << ce::to_string(task);
      previous = s.needle_depth;
    }
  }
}

TEST(Niah, DeterministicPerSeedAndDifferentAcrossSeeds) {
  const std::vector<std::string> prose = test_prose();
  for (ce::NiahTask task : ce::all_niah_tasks()) {
    const ce::NiahSample a = ce::make_niah_sample({task, 1024, 0.5, 11, 16}, kWordCounter, prose);
    const ce::NiahSample b = ce::make_niah_sample({task, 1024, 0.5, 11, 16}, kWordCounter, prose);
    const ce::NiahSample c = ce::make_niah_sample({task, 1024, 0.5, 12, 16}, kWordCounter, prose);
    EXPECT_EQ(a.user_message, b.user_message) << ce::to_string(task);
    EXPECT_EQ(a.expected, b.expected) << ce::to_string(task);
    EXPECT_NE(a.expected, c.expected) << ce::to_string(task);
    EXPECT_NE(a.user_message, c.user_message) << ce::to_string(task);
  }
  // The same seed keeps the needle's value across lengths and depths (a controlled comparison).
  const ce::NiahSample short_one = ce::make_niah_sample({ce::NiahTask::passkey, 1024, 0.1, 5, 16}, kWordCounter);
  const ce::NiahSample long_one = ce::make_niah_sample({ce::NiahTask::passkey, 4096, 0.9, 5, 16}, kWordCounter);
  EXPECT_EQ(short_one.expected, long_one.expected);
}

TEST(Niah, TaskShapes) {
  // Multikey: the asked needle and three distractors with other keys and values.
  const ce::NiahSample mk = ce::make_niah_sample({ce::NiahTask::multikey, 2048, 0.5, 1, 32}, kWordCounter);
  EXPECT_EQ(occurrences(haystack_of(mk), "One of the special magic numbers for "), 4);
  EXPECT_EQ(occurrences(haystack_of(mk), "The grass is green."), mk.haystack_units);

  // All needles: every haystack line is a needle, every key distinct.
  const ce::NiahSample all = ce::make_niah_sample({ce::NiahTask::all_needles, 2048, 0.5, 1, 32}, kWordCounter);
  std::istringstream lines(haystack_of(all));
  std::string line;
  std::set<std::string> keys;
  int64_t count = 0;
  const std::string head = "One of the special magic numbers for ";
  while (std::getline(lines, line)) {
    ASSERT_EQ(line.rfind(head, 0), 0u) << line;
    const std::size_t is = line.find(" is: ");
    ASSERT_NE(is, std::string::npos);
    EXPECT_TRUE(keys.insert(line.substr(head.size(), is - head.size())).second) << "repeated key in " << line;
    ++count;
  }
  EXPECT_EQ(count, all.haystack_units + 1);

  // Passkey: InfiniteBench's needle sentence, a 5-digit key.
  const ce::NiahSample pk = ce::make_niah_sample({ce::NiahTask::passkey, 1024, 0.5, 1, 16}, kWordCounter);
  EXPECT_EQ(pk.expected.size(), 5u);
  EXPECT_EQ(pk.needle, "The pass key is " + pk.expected + ". Remember it. " + pk.expected + " is the pass key.");

  // kv_retrieval: a JSON object of uuid pairs, the key asked in the question.
  const ce::NiahSample kv = ce::make_niah_sample({ce::NiahTask::kv_retrieval, 2048, 0.5, 1, 48}, kWordCounter);
  const std::string json = haystack_of(kv);
  EXPECT_EQ(occurrences(json, "\": \""), kv.haystack_units + 1);
  EXPECT_NE(kv.user_message.find("Key: \"" + kv.key + "\""), std::string::npos);
  EXPECT_EQ(kv.user_message[static_cast<std::size_t>(kv.haystack_begin) - 1], '{');
  EXPECT_EQ(kv.user_message[static_cast<std::size_t>(kv.haystack_end)], '}');

  // Prose: the haystack is the given sentences (plus the needle).
  const std::vector<std::string> prose = test_prose();
  const ce::NiahSample pr = ce::make_niah_sample({ce::NiahTask::prose, 1024, 0.5, 1, 16}, kWordCounter, prose);
  EXPECT_NE(haystack_of(pr).find("tells of rivers, towns"), std::string::npos);
  EXPECT_EQ(occurrences(haystack_of(pr), "special magic"), 1);
}

TEST(Niah, RejectsBadSpecs) {
  EXPECT_THROW(ce::make_niah_sample({ce::NiahTask::passkey, 1024, 1.5, 0, 16}, kWordCounter), crisp::Error);
  EXPECT_THROW(ce::make_niah_sample({ce::NiahTask::passkey, 1024, -0.1, 0, 16}, kWordCounter), crisp::Error);
  EXPECT_THROW(ce::make_niah_sample({ce::NiahTask::passkey, 40, 0.5, 0, 16}, kWordCounter), crisp::Error);
  EXPECT_THROW(ce::make_niah_sample({ce::NiahTask::prose, 1024, 0.5, 0, 16}, kWordCounter, {}), crisp::Error);
  EXPECT_THROW(ce::make_niah_sample({ce::NiahTask::passkey, 1024, 0.5, 0, -1}, kWordCounter), crisp::Error);
  EXPECT_THROW(ce::parse_niah_task("niah_double"), crisp::Error);
  for (ce::NiahTask task : ce::all_niah_tasks()) EXPECT_EQ(ce::parse_niah_task(ce::to_string(task)), task);
}

TEST(NiahScoring, RulerSubstringMatch) {
  EXPECT_TRUE(ce::ruler_substring_match(" 4821937.", "4821937"));
  EXPECT_TRUE(ce::ruler_substring_match("The number is 4821937 indeed", "4821937"));
  EXPECT_TRUE(ce::ruler_substring_match("ID AB12-CD", "ab12-cd"));  // case-insensitive
  EXPECT_FALSE(ce::ruler_substring_match(" 482193.", "4821937"));    // a digit short
  EXPECT_FALSE(ce::ruler_substring_match(" 4821 937", "4821937"));
  EXPECT_FALSE(ce::ruler_substring_match("anything", ""));
}

TEST(NiahScoring, InfiniteBenchFirstInteger) {
  EXPECT_EQ(ce::first_integer(" 71432."), "71432");
  EXPECT_EQ(ce::first_integer("The pass key is 71432. Remember it."), "71432");
  EXPECT_EQ(ce::first_integer("12 then 71432"), "12");
  EXPECT_EQ(ce::first_integer("no digits"), "");
  EXPECT_EQ(ce::first_integer(""), "");
  ce::NiahSample s;
  s.scoring = ce::NiahScoring::first_integer;
  s.expected = "71432";
  EXPECT_TRUE(ce::score_niah_output(s, " 71432"));
  EXPECT_FALSE(ce::score_niah_output(s, " 714321"));       // a longer integer is another number
  EXPECT_FALSE(ce::score_niah_output(s, " 1, then 71432"));  // only the first integer counts
}

TEST(NiahScoring, InfiniteBenchWordMatch) {
  const std::string uuid = "0a1b2c3d-4e5f-4a7b-8c9d-0e1f2a3b4c5d";
  EXPECT_TRUE(ce::infinitebench_word_match(" " + uuid, uuid));
  EXPECT_TRUE(ce::infinitebench_word_match("\"" + uuid + "\".", uuid));
  EXPECT_TRUE(ce::infinitebench_word_match("value:" + uuid + "\n", uuid));
  EXPECT_FALSE(ce::infinitebench_word_match(" x" + uuid, uuid));       // not a word of its own
  EXPECT_FALSE(ce::infinitebench_word_match(" " + uuid + "-ff", uuid));
  EXPECT_FALSE(ce::infinitebench_word_match(" " + uuid.substr(0, 30), uuid));
}

TEST(NiahGenerators, ValuesHaveTheirForms) {
  ce::NiahRng rng(42);
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const std::string digits = ce::random_digits(rng, 7);
    ASSERT_EQ(digits.size(), 7u);
    EXPECT_NE(digits[0], '0');
    EXPECT_TRUE(std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }));
    const std::string uuid = ce::random_uuid(rng);
    ASSERT_EQ(uuid.size(), 36u);
    EXPECT_EQ(uuid[8], '-');
    EXPECT_EQ(uuid[13], '-');
    EXPECT_EQ(uuid[18], '-');
    EXPECT_EQ(uuid[23], '-');
    EXPECT_EQ(uuid[14], '4');
    EXPECT_NE(std::string("89ab").find(uuid[19]), std::string::npos);
    seen.insert(uuid);
    const std::string key = ce::random_word_key(rng);
    EXPECT_NE(key.find('-'), std::string::npos);
    EXPECT_LT(rng.below(10), 10u);
  }
  EXPECT_EQ(seen.size(), 200u);
  // splitmix64 from 0: the generator is the published one (first output 0xe220a8397b1dcdaf).
  ce::NiahRng zero(0);
  EXPECT_EQ(zero.next(), 0xe220a8397b1dcdafull);
}

TEST(Niah, QaPromptParagraphs) {
  const std::string prompt =
      "Answer the question based on the given documents.\n\nThe following are given documents.\n\n"
      "Document 1:\nFirst Title\nThe first text. It has two sentences.\n\n"
      "Document 2:\nSecond Title\nSee Document 1: it is cited.\n\n"
      "Answer the question based on the given documents.\n\nQuestion: Who? Answer:";
  const std::vector<std::string> paragraphs = ce::qa_prompt_paragraphs(prompt);
  ASSERT_EQ(paragraphs.size(), 2u);
  EXPECT_EQ(paragraphs[0], "First Title\nThe first text. It has two sentences.");
  EXPECT_EQ(paragraphs[1], "Second Title\nSee Document 1: it is cited.");
  EXPECT_TRUE(ce::qa_prompt_paragraphs("no documents here").empty());
}

TEST(NiahScoring, DecidedOnlyWhenNoContinuationCanChangeTheScore) {
  ce::NiahSample s;
  s.scoring = ce::NiahScoring::substring;
  s.expected = "4821937";
  EXPECT_FALSE(ce::niah_score_decided(s, " 482193"));
  EXPECT_TRUE(ce::niah_score_decided(s, " 4821937"));
  s.scoring = ce::NiahScoring::first_integer;
  s.expected = "71432";
  EXPECT_FALSE(ce::niah_score_decided(s, " The key"));
  EXPECT_FALSE(ce::niah_score_decided(s, " 7143"));    // "71432" or "714321" may follow
  EXPECT_TRUE(ce::niah_score_decided(s, " 71432."));
  EXPECT_TRUE(ce::niah_score_decided(s, " 12 and"));   // decided wrong: the first integer is 12
  s.scoring = ce::NiahScoring::word_match;
  s.expected = "0a1b2c3d-4e5f-4a7b-8c9d-0e1f2a3b4c5d";
  EXPECT_FALSE(ce::niah_score_decided(s, " " + s.expected));         // "-ff" may still follow
  EXPECT_TRUE(ce::niah_score_decided(s, " " + s.expected + "."));
  EXPECT_TRUE(ce::niah_score_decided(s, " \"" + s.expected + "\""));
  // Decided means: the score of every continuation equals the score now.
  for (const std::string& tail : {std::string(""), std::string(" more"), std::string("x")}) {
    const std::string out = " \"" + s.expected + "\"";
    EXPECT_EQ(ce::score_niah_output(s, out + tail), ce::score_niah_output(s, out));
  }
}
