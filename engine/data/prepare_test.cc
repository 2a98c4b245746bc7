// Unit tests of `stemma-engine prepare` (engine/data/prepare.h): the .mo reader on catalogues
// the test writes in both byte orders, the normalisation steps, and whole corpora built from
// synthetic gettext roots, text and JSONL files: layout, no overlap between evaluation pairs,
// held-out and train text across languages, deduplication, budgets, mixture proportions,
// suite well-formedness, manifest hashes, determinism, and the refusals (exit 4, naming the
// field or file).
#include "engine/data/prepare.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "engine/data/commands.h"
#include "engine/data/corpus_text.h"
#include "engine/data/mo_file.h"
#include "engine/io/sha256.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::data {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

#define EXPECT_CONTAINS(text, sub)                          \
  EXPECT_NE(std::string(text).find(sub), std::string::npos) \
      << "'" << std::string(text) << "' does not contain '" << std::string(sub) << "'"

// A GNU .mo file: header, originals table, translations table, no hash table, strings.
std::string MoBytes(std::vector<std::pair<std::string, std::string>> entries, bool big_endian) {
  std::sort(entries.begin(), entries.end());
  const uint32_t n = static_cast<uint32_t>(entries.size());
  std::string out;
  auto put = [&](uint32_t v) {
    for (int k = 0; k < 4; ++k) {
      const int shift = big_endian ? 24 - 8 * k : 8 * k;
      out.push_back(static_cast<char>((v >> shift) & 0xff));
    }
  };
  const uint32_t originals = 28, translations = 28 + 8 * n, strings = 28 + 16 * n;
  put(0x950412de);
  put(0);
  put(n);
  put(originals);
  put(translations);
  put(0);
  put(strings);
  std::string blob;
  std::vector<std::pair<uint32_t, uint32_t>> ids, strs;
  for (const auto& [id, str] : entries) {
    ids.push_back({static_cast<uint32_t>(id.size()), strings + static_cast<uint32_t>(blob.size())});
    blob.append(id);
    blob.push_back('\0');
  }
  for (const auto& [id, str] : entries) {
    strs.push_back(
        {static_cast<uint32_t>(str.size()), strings + static_cast<uint32_t>(blob.size())});
    blob.append(str);
    blob.push_back('\0');
  }
  for (const auto& [len, off] : ids) put(len), put(off);
  for (const auto& [len, off] : strs) put(len), put(off);
  out.append(blob);
  return out;
}

const std::pair<std::string, std::string> kHeader = {
    "", "Project-Id-Version: test\nContent-Type: text/plain; charset=UTF-8\n"};

TEST(MoFile, ReadsBothByteOrdersWithContextPluralsAndUntranslated) {
  std::vector<std::pair<std::string, std::string>> entries = {
      kHeader,
      {"Open the file", "Datei öffnen"},
      {std::string("menu\x04") + "Quit the program", "Programm beenden"},
      {std::string("One file was copied\0%d files were copied", 39),
       std::string("Eine Datei kopiert\0%d Dateien kopiert", 37)},
      {"Not translated at all", ""},
      {"Same in both languages", "Same in both languages"},
  };
  for (bool be : {false, true}) {
    absl::StatusOr<MoCatalogue> cat = ParseMoFile(MoBytes(entries, be), "t.mo");
    ASSERT_TRUE(cat.ok()) << cat.status();
    EXPECT_EQ(cat->big_endian, be);
    EXPECT_EQ(cat->charset, "UTF-8");
    EXPECT_EQ(cat->strings, 6);
    EXPECT_EQ(cat->untranslated, 2);
    std::map<std::string, std::string> got;
    for (const auto& e : cat->entries) got[e.msgid] = e.msgstr;
    const std::map<std::string, std::string> want = {{"Open the file", "Datei öffnen"},
                                                     {"Quit the program", "Programm beenden"},
                                                     {"One file was copied", "Eine Datei kopiert"}};
    EXPECT_EQ(got, want) << (be ? "big endian" : "little endian");
  }
}

TEST(MoFile, RefusesWhatIsNotACatalogue) {
  auto bad = ParseMoFile("this is not a catalogue at all....", "x.mo");
  ASSERT_FALSE(bad.ok());
  EXPECT_CONTAINS(bad.status().message(), "x.mo: not a GNU .mo file");
  std::string truncated = MoBytes({kHeader, {"Open the file", "Datei öffnen"}}, false);
  truncated.resize(40);
  auto cut = ParseMoFile(truncated, "cut.mo");
  ASSERT_FALSE(cut.ok());
  EXPECT_CONTAINS(cut.status().message(), "cut.mo: ");
  EXPECT_CONTAINS(cut.status().message(), "outside the file");
}

TEST(CorpusText, NormalisationSteps) {
  EXPECT_EQ(Nfc("Cafe\xCC\x81"), "Caf\xC3\xA9");  // e + combining acute -> é
  EXPECT_EQ(StripAccelerators("_Open the file"), "Open the file");
  EXPECT_EQ(StripAccelerators("&Save the document"), "Save the document");
  EXPECT_EQ(StripAccelerators("_Файл"), "Файл");
  EXPECT_EQ(StripAccelerators("फ़ाइल खोलें (_O)"), "फ़ाइल खोलें");
  EXPECT_EQ(StripAccelerators("file_name_here"), "file_name_here");
  EXPECT_EQ(StripAccelerators("Tom &amp; Jerry"), "Tom &amp; Jerry");
  EXPECT_EQ(StripAccelerators("Rock && Roll"), "Rock & Roll");
  EXPECT_EQ(ReplaceFormatDirectives("Cannot open %s: %d files", "…"), "Cannot open …: … files");
  EXPECT_EQ(ReplaceFormatDirectives("%1$s of %2$-5lu and %.*f, %<PRIu64>", "X"), "X of X and X, X");
  EXPECT_EQ(ReplaceFormatDirectives("%(name)s is %(count)5d", "X"), "X is X");
  EXPECT_EQ(ReplaceFormatDirectives("{name} and {0} and {} and {x:>8}", "X"),
            "X and X and X and X");
  EXPECT_EQ(ReplaceFormatDirectives("100%% done, {{literal}}, 50% off, Qt %1", "X"),
            "100% done, {literal}, 50% off, Qt X");
  EXPECT_EQ(ReplaceFormatDirectives("Cannot open %s", ""), "Cannot open ");
  EXPECT_EQ(CollapseWhitespace("  a\n\t b\u00a0c  "), "a b c");

  NormalizeOptions options;
  auto kept = NormalizeCorpusText("_Open   %s\nnow, please", options);
  EXPECT_EQ(kept.reason, DropReason::kKept);
  EXPECT_EQ(kept.text, "Open … now, please");
  EXPECT_EQ(NormalizeCorpusText("Short one", options).reason, DropReason::kTooShort);
  EXPECT_EQ(NormalizeCorpusText("%s: %s -- %d / %d (%s)", options).reason, DropReason::kNoLetters);
  EXPECT_EQ(NormalizeCorpusText("12345 67890 12345", options).reason, DropReason::kNoLetters);
  EXPECT_EQ(NormalizeCorpusText("bad \xff\xfe utf-8 here", options).reason,
            DropReason::kInvalidUtf8);
  options.placeholder = "VAR";
  EXPECT_EQ(NormalizeCorpusText("%s: %s -- %d / %d (%s)", options).reason, DropReason::kNoLetters)
      << "letters of the placeholder do not count";
}

// ---------------------------------------------------------------------------------------
// Whole corpora.

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("stemma_prepare_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Path(const std::string& rel) const { return (root_ / rel).string(); }
  std::string Write(const std::string& rel, const std::string& contents) const {
    fs::create_directories(fs::path(Path(rel)).parent_path());
    std::ofstream(Path(rel), std::ios::binary) << contents;
    return Path(rel);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::vector<std::string> Lines(const std::string& path) {
    std::vector<std::string> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) out.push_back(line);
    return out;
  }
  static std::vector<Json> JsonLines(const std::string& path) {
    std::vector<Json> out;
    for (const auto& line : Lines(path)) out.push_back(Json::parse(line));
    return out;
  }

  // English sentence i, and its "translation" into `lang` (words prefixed so that every
  // language's text differs).
  static std::string English(int i) {
    static const char* kWords[] = {"file",    "window", "network", "printer", "folder",  "message",
                                   "account", "server", "device",  "archive", "package", "screen"};
    return absl::StrCat("The ", kWords[i % 12], " number ", i, " could not be opened by the ",
                        kWords[(i / 12) % 12], " service");
  }
  static std::string Translation(const std::string& lang, int i) {
    return absl::StrCat(lang, "word ", lang, "datei ", i, " konnte ", lang, "nicht ", i % 7,
                        " geöffnet werden ", lang, "dienst");
  }
  // A gettext root with catalogues for `langs`: entries [0, n) in two catalogues (one big
  // endian), plus a few that normalisation or the reader must drop.
  void WriteGettext(const std::string& root, const std::vector<std::string>& langs, int n) {
    for (const std::string& lang : langs) {
      std::vector<std::pair<std::string, std::string>> a = {kHeader}, b = {kHeader};
      for (int i = 0; i < n; ++i) {
        auto& cat = i % 2 == 0 ? a : b;
        cat.push_back({i % 5 == 0 ? "_" + English(i) : English(i), Translation(lang, i)});
      }
      a.push_back({"Too short", absl::StrCat(lang, "kurz")});
      a.push_back({"An untranslated message here", ""});
      a.push_back({"%s: %s (%d)", "%s: %s (%d)!"});
      Write(absl::StrCat(root, "/", lang, "/LC_MESSAGES/a.mo"), MoBytes(a, false));
      Write(absl::StrCat(root, "/", lang, "/LC_MESSAGES/b.mo"), MoBytes(b, true));
    }
  }

  // Runs `stemma-engine prepare --spec FILE`; returns the exit code; stderr into *err.
  int Prepare(const std::string& spec_yaml, std::string* err = nullptr) {
    const std::string spec = Write("spec.yaml", spec_yaml);
    const std::string err_path = Path("stderr.txt");
    fflush(stderr);
    const int saved = ::dup(2);
    const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::close(fd);
    std::vector<std::string> args = {"prepare", "--spec", spec};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    const int rc = RunPrepare(static_cast<int>(argv.size()), argv.data());
    fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    if (err != nullptr) *err = Read(err_path);
    return rc;
  }

  // The spec of the standard test corpus: base en, held_in xa and xb (xb also gets every
  // xa translation as a text file, to prove cross-language exclusion), held_in xc from JSONL,
  // held_out xd.
  std::string StandardSpec(const std::string& out, const std::string& extra = "") {
    WriteGettext(Path("locale"), {"xa", "xb", "xd"}, 400);
    std::string xa_text;
    for (int i = 0; i < 400; ++i) absl::StrAppend(&xa_text, Translation("xa", i), "\n");
    xa_text += Translation("xa", 3) + "\n\n   \n";  // a duplicate and blank lines
    Write("xb_extra.txt", xa_text);
    std::string jsonl;
    for (int i = 0; i < 300; ++i) {
      absl::StrAppend(&jsonl, Json({{"text", Translation("xc", i)}, {"other", 1}}).dump(), "\n");
    }
    Write("xc.jsonl", jsonl);
    return absl::StrCat(
        "out: ", out, "\n", "gettext: ", Path("locale"), "\n",
        "eval_fraction: 0.1\nheldout_fraction: 0.1\nsplit_seed: 3\n", "languages:\n",
        "  - {code: en, family: germanic, role: base, name: English}\n",
        "  - {code: xa, family: fam1, role: held_in, name: Xa}\n",
        "  - {code: xb, family: fam1, role: held_in, gettext: ", Path("locale"), ", text: [",
        Path("xb_extra.txt"), "], budget_bytes: 20000}\n",
        "  - {code: xc, family: fam2, role: held_in, jsonl: [{path: ", Path("xc.jsonl"), "}]}\n",
        "  - {code: xd, family: fam1, role: held_out, name: Xd}\n", "suites: {examples: 50}\n",
        extra);
  }

  fs::path root_;
};

TEST_F(PrepareTest, LayoutAndNoOverlapBetweenPairsHeldoutAndTrain) {
  const std::string out = Path("corpus");
  std::string err;
  ASSERT_EQ(Prepare(StandardSpec(out), &err), 0) << err;
  for (const char* rel :
       {"manifest.json", "train/en.txt", "train/xa.txt", "train/xb.txt", "train/xc.txt",
        "heldout/en.txt", "heldout/xa.txt", "heldout/xb.txt", "heldout/xc.txt", "heldout/xd.txt",
        "pairs/en-xa.jsonl", "pairs/en-xb.jsonl", "pairs/en-xd.jsonl",
        "suites/translation_choice_xa.jsonl", "suites/continuation_xa.jsonl",
        "suites/translation_choice_xd.jsonl", "suites/continuation_xd.jsonl",
        "suites/general_en.jsonl", "suites/suites.json"}) {
    EXPECT_TRUE(fs::is_regular_file(out + "/" + rel)) << rel;
  }
  EXPECT_FALSE(fs::exists(out + "/train/xd.txt")) << "a held_out language is never trained on";
  EXPECT_FALSE(fs::exists(out + "/pairs/en-xc.jsonl")) << "xc has no gettext pairs";

  // Every string of every evaluation pair, both sides.
  std::set<std::string> reserved, xa_reserved_targets;
  for (const char* lang : {"xa", "xb", "xd"}) {
    const auto pairs = JsonLines(absl::StrCat(out, "/pairs/en-", lang, ".jsonl"));
    EXPECT_GT(pairs.size(), 15u) << lang;
    for (const auto& p : pairs) {
      reserved.insert(p["src"].get<std::string>());
      reserved.insert(p["tgt"].get<std::string>());
      if (std::string(lang) == "xa") xa_reserved_targets.insert(p["tgt"].get<std::string>());
      EXPECT_TRUE(p.contains("id"));
    }
  }
  std::map<std::string, std::set<std::string>> train, heldout;
  for (const char* lang : {"en", "xa", "xb", "xc", "xd"}) {
    if (std::string(lang) != "xd") {
      for (const auto& l : Lines(absl::StrCat(out, "/train/", lang, ".txt"))) train[lang].insert(l);
    }
    for (const auto& l : Lines(absl::StrCat(out, "/heldout/", lang, ".txt")))
      heldout[lang].insert(l);
  }
  std::set<std::string> all_train;
  for (auto& [lang, lines] : train) all_train.insert(lines.begin(), lines.end());
  for (const auto& [split, texts] : {std::pair{"train", &train}, std::pair{"heldout", &heldout}}) {
    for (const auto& [lang, lines] : *texts) {
      EXPECT_FALSE(lines.empty()) << split << "/" << lang;
      for (const auto& line : lines) {
        EXPECT_EQ(reserved.count(line), 0u)
            << split << "/" << lang << " holds a side of an evaluation pair: " << line;
        if (std::string(split) == "heldout") {
          EXPECT_EQ(all_train.count(line), 0u)
              << "heldout/" << lang << " line is trained on: " << line;
        }
      }
    }
  }
  // xb's text file carried every xa translation: the reserved ones were dropped, the others kept.
  int kept_from_xa = 0;
  for (const auto& line : train["xb"]) kept_from_xa += absl::StartsWith(line, "xaword") ? 1 : 0;
  EXPECT_GT(kept_from_xa, 0);
  EXPECT_FALSE(xa_reserved_targets.empty());

  // Normalised (accelerators gone), deduplicated, short and no-letter strings dropped.
  for (const char* lang : {"en", "xa"}) {
    const auto lines = Lines(absl::StrCat(out, "/train/", lang, ".txt"));
    EXPECT_EQ(std::set<std::string>(lines.begin(), lines.end()).size(), lines.size()) << lang;
    for (const auto& line : lines) {
      EXPECT_NE(line[0], '_') << line;
      EXPECT_GE(CodePoints(line), 12) << line;
    }
  }
  EXPECT_EQ(
      train["en"].count(English(5)) + heldout["en"].count(English(5)) + reserved.count(English(5)),
      1u)
      << "the accelerator of \"_" << English(5) << "\" is stripped";
  // The xb budget: 20000 bytes at most.
  EXPECT_LE(fs::file_size(out + "/train/xb.txt"), 20000u);
  EXPECT_GT(fs::file_size(out + "/train/xb.txt"), 15000u);
}

// DeltaMoE's instruct data: translation requests from the pairs that are not evaluation
// pairs, split by their English side, never holding an evaluation pair's English; and the
// evaluation pairs carry both sides under their language codes (analyze's alignment input).
TEST_F(PrepareTest, InstructionsComeFromNonEvaluationPairsAndPairsAreKeyedByLanguage) {
  const std::string out = Path("corpus");
  std::string err;
  ASSERT_EQ(Prepare(StandardSpec(out, "instructions:\n  - {name: en-xa, language: xa}\n"), &err), 0)
      << err;
  std::set<std::string> reserved_en;
  for (const auto& p : JsonLines(out + "/pairs/en-xa.jsonl")) {
    reserved_en.insert(p["src"].get<std::string>());
    EXPECT_EQ(p["en"], p["src"]);
    EXPECT_EQ(p["xa"], p["tgt"]);
  }
  const auto train = Lines(out + "/instruct/en-xa.train.txt");
  const auto heldout = Lines(out + "/instruct/en-xa.heldout.txt");
  EXPECT_GT(train.size(), 200u);
  EXPECT_GT(heldout.size(), 5u);
  std::set<std::string> train_en;
  auto english_of = [](const std::string& doc) {
    const std::string prefix = "Translate into Xa: ";
    EXPECT_TRUE(absl::StartsWith(doc, prefix)) << doc;
    const size_t arrow = doc.find(" => ");
    EXPECT_NE(arrow, std::string::npos) << doc;
    EXPECT_TRUE(absl::StartsWith(doc.substr(arrow + 4), "xaword")) << doc;
    return doc.substr(prefix.size(), arrow - prefix.size());
  };
  for (const auto& d : train) {
    const std::string en = english_of(d);
    EXPECT_EQ(reserved_en.count(en), 0u) << "an evaluation pair became an instruction: " << d;
    train_en.insert(en);
  }
  for (const auto& d : heldout) {
    const std::string en = english_of(d);
    EXPECT_EQ(reserved_en.count(en), 0u) << d;
    EXPECT_EQ(train_en.count(en), 0u) << "held-out request also trained on: " << d;
  }
  const Json manifest = Json::parse(Read(out + "/manifest.json"));
  ASSERT_EQ(manifest["instructions"].size(), 1u);
  EXPECT_EQ(manifest["instructions"][0]["train_documents"], train.size());

  EXPECT_EQ(
      Prepare(StandardSpec(Path("bad"), "instructions:\n  - {name: x, language: en}\n"), &err), 4);
  EXPECT_CONTAINS(err, "instructions[0].language");
}

TEST_F(PrepareTest, ManifestHashesMatchTheFilesAndTheOutputIsDeterministic) {
  const std::string out = Path("corpus");
  ASSERT_EQ(Prepare(StandardSpec(out)), 0);
  const Json manifest = Json::parse(Read(out + "/manifest.json"));
  EXPECT_EQ(manifest["format"], kCorpusFormat);
  std::set<std::string> listed;
  std::string listing;
  for (const auto& f : manifest["files"]) {
    const std::string path = f["path"];
    listed.insert(path);
    const std::string contents = Read(out + "/" + path);
    EXPECT_EQ(f["sha256"], io::Sha256Hex(contents)) << path;
    EXPECT_EQ(f["bytes"], contents.size()) << path;
    EXPECT_EQ(f["lines"], std::count(contents.begin(), contents.end(), '\n')) << path;
    listing += f["sha256"].get<std::string>() + "  " + path + "\n";
  }
  EXPECT_EQ(manifest["content_hash"], io::Sha256Hex(listing));
  for (const auto& entry : fs::recursive_directory_iterator(out)) {
    if (!entry.is_regular_file()) continue;
    const std::string rel = fs::relative(entry.path(), out).string();
    if (rel != "manifest.json")
      EXPECT_EQ(listed.count(rel), 1u) << rel << " is not in the manifest";
  }
  ASSERT_EQ(manifest["languages"].size(), 5u);
  EXPECT_EQ(manifest["languages"][4]["code"], "xd");
  EXPECT_EQ(manifest["languages"][4]["role"], "held_out");
  EXPECT_EQ(manifest["languages"][4]["family"], "fam1");
  EXPECT_EQ(manifest["languages"][4]["name"], "Xd");
  EXPECT_EQ(manifest["suites"]["translation_choice"], kTranslationChoiceVersion);
  EXPECT_FALSE(manifest["parameters"].contains("out"))
      << "the manifest does not depend on where it lies";

  // The same sources and spec elsewhere: byte-identical.
  const std::string again = Path("again");
  ASSERT_EQ(Prepare(StandardSpec(again)), 0);
  EXPECT_EQ(Read(out + "/manifest.json"), Read(again + "/manifest.json"));
  // And a different split seed gives another corpus.
  std::string spec = StandardSpec(Path("seed4"));
  spec.replace(spec.find("split_seed: 3"), 13, "split_seed: 4");
  ASSERT_EQ(Prepare(spec), 0);
  EXPECT_NE(Json::parse(Read(Path("seed4") + "/manifest.json"))["content_hash"],
            manifest["content_hash"]);
}

TEST_F(PrepareTest, SuitesAreWellFormed) {
  const std::string out = Path("corpus");
  ASSERT_EQ(Prepare(StandardSpec(out)), 0);
  const Json index = Json::parse(Read(out + "/suites/suites.json"));
  ASSERT_FALSE(index["suites"].empty());
  std::set<std::string> names;
  for (const auto& s : index["suites"]) {
    names.insert(s["name"]);
    const std::string path = out + "/" + s["file"].get<std::string>();
    EXPECT_EQ(s["sha256"], io::Sha256Hex(Read(path))) << path;
    EXPECT_EQ(s["examples"], Lines(path).size()) << path;
    EXPECT_LE(s["examples"].get<int>(), 50);
  }
  for (const char* name :
       {"translation_choice_xa", "translation_choice_xb", "translation_choice_xd",
        "continuation_xa", "continuation_xb", "continuation_xc", "continuation_xd", "general_en"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  // Translation choice: the gold answer is the pair's translation, present once; distractors
  // are other reserved translations of the language, all four distinct.
  for (const char* lang : {"xa", "xd"}) {
    std::map<std::string, std::string> pairs;
    std::set<std::string> targets;
    for (const auto& p : JsonLines(absl::StrCat(out, "/pairs/en-", lang, ".jsonl"))) {
      pairs[p["src"]] = p["tgt"];
      targets.insert(p["tgt"].get<std::string>());
    }
    std::set<int> golds;
    for (const auto& row :
         JsonLines(absl::StrCat(out, "/suites/translation_choice_", lang, ".jsonl"))) {
      const std::string passage = row["flores_passage"];
      ASSERT_EQ(pairs.count(passage), 1u) << passage;
      EXPECT_CONTAINS(row["question"].get<std::string>(), "translation");
      const int gold = std::stoi(row["correct_answer_num"].get<std::string>());
      ASSERT_TRUE(gold >= 1 && gold <= 4);
      golds.insert(gold);
      std::set<std::string> answers;
      int right = 0;
      for (int k = 1; k <= 4; ++k) {
        const std::string a = row[absl::StrCat("mc_answer", k)];
        answers.insert(a);
        right += a == pairs[passage] ? 1 : 0;
        EXPECT_EQ(targets.count(a), 1u) << "a distractor that is not a reserved translation: " << a;
      }
      EXPECT_EQ(answers.size(), 4u);
      EXPECT_EQ(right, 1);
      EXPECT_EQ(row[absl::StrCat("mc_answer", gold)], pairs[passage]);
    }
    EXPECT_GT(golds.size(), 2u) << "answer positions vary";
  }
  // Continuation: prompt + " " + the gold ending is a held-out document of the language.
  for (const char* lang : {"xa", "xd", "en"}) {
    const auto held = Lines(absl::StrCat(out, "/heldout/", lang, ".txt"));
    const std::set<std::string> heldout(held.begin(), held.end());
    const std::string file = std::string(lang) == "en"
                                 ? "/suites/general_en.jsonl"
                                 : absl::StrCat("/suites/continuation_", lang, ".jsonl");
    const auto rows = JsonLines(out + file);
    EXPECT_FALSE(rows.empty()) << file;
    for (const auto& row : rows) {
      const int label = row["label"];
      ASSERT_TRUE(label >= 0 && label < 4);
      std::set<std::string> endings;
      for (int k = 0; k < 4; ++k)
        endings.insert(row[absl::StrCat("solution", k)].get<std::string>());
      EXPECT_EQ(endings.size(), 4u);
      EXPECT_EQ(row.count("solution4"), 0u);
      const std::string whole = row["prompt"].get<std::string>() + " " +
                                row[absl::StrCat("solution", label)].get<std::string>();
      EXPECT_EQ(heldout.count(whole), 1u) << whole;
    }
  }
}

TEST_F(PrepareTest, MixtureProportionsFollowTheTemperature) {
  // a: 4000 documents, b: 1000, of equal length; a quarter of the total bytes are drawn (so
  // that neither runs out under either temperature).
  std::string a, b;
  for (int i = 0; i < 4000; ++i) absl::StrAppend(&a, "alpha document ", 10000 + i, " text\n");
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&b, "bravo document ", 10000 + i, " text\n");
  Write("a.txt", a);
  Write("b.txt", b);
  const int64_t total = static_cast<int64_t>(a.size() + b.size());
  const std::string spec = absl::StrCat(
      "out: ", Path("corpus"), "\nheldout_fraction: 0.01\neval_fraction: 0\n", "languages:\n",
      "  - {code: en, family: f, role: base, text: [", Path("a.txt"), "]}\n",
      "  - {code: xb, family: f, role: held_in, text: [", Path("b.txt"), "]}\n", "mixtures:\n",
      "  - {name: natural, languages: [en, xb], temperature: 1, budget_bytes: ", total / 4, "}\n",
      "  - {name: flat, languages: [en, xb], temperature: 1000, budget_bytes: ", total / 4,
      ", seed: 7}\n", "  - {name: all, languages: [en, xb], temperature: 5}\n");
  std::string err;
  ASSERT_EQ(Prepare(spec, &err), 0) << err;
  auto share_of_b = [&](const std::string& name) {
    int64_t bytes = 0, of_b = 0;
    for (const auto& line : Lines(Path("corpus/mix/" + name + ".txt"))) {
      bytes += static_cast<int64_t>(line.size()) + 1;
      of_b += absl::StartsWith(line, "bravo") ? static_cast<int64_t>(line.size()) + 1 : 0;
    }
    EXPECT_LE(bytes, total / 4) << name;
    EXPECT_GT(bytes, total / 4 - 100) << name;
    return static_cast<double>(of_b) / static_cast<double>(bytes);
  };
  EXPECT_NEAR(share_of_b("natural"), 0.2, 0.03);  // p ∝ n
  EXPECT_NEAR(share_of_b("flat"), 0.5, 0.03);     // p nearly uniform
  // Without a budget every train document is used once (drawn without replacement).
  const auto all = Lines(Path("corpus/mix/all.txt"));
  const auto en = Lines(Path("corpus/train/en.txt")), xb = Lines(Path("corpus/train/xb.txt"));
  EXPECT_EQ(all.size(), en.size() + xb.size());
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), all.size());
  const Json manifest = Json::parse(Read(Path("corpus/manifest.json")));
  EXPECT_NEAR(manifest["mixtures"][0]["languages"][1]["probability"].get<double>(), 0.2, 0.01);
  EXPECT_NEAR(manifest["mixtures"][1]["languages"][1]["probability"].get<double>(), 0.5, 0.01);
}

TEST_F(PrepareTest, RefusesBadInputNamingTheFieldWithExit4) {
  WriteGettext(Path("locale"), {"xa"}, 50);
  std::string err;
  // A language with no source.
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c1"),
                                 "\nlanguages:\n  - {code: en, family: g, role: base}\n",
                                 "  - {code: xa, family: f, role: held_in}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, "languages[1].code");
  EXPECT_CONTAINS(err, "has no source");
  // A gettext root that does not exist.
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c2"), "\ngettext: ", Path("nowhere"),
                                 "\nlanguages:\n  - {code: en, family: g, role: base}\n",
                                 "  - {code: xa, family: f, role: held_in}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, "gettext: " + Path("nowhere") + ": no such directory");
  // A locale without catalogues.
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c3"), "\ngettext: ", Path("locale"),
                                 "\nlanguages:\n  - {code: en, family: g, role: base}\n",
                                 "  - {code: zz, family: f, role: held_in}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, Path("locale") + "/zz/LC_MESSAGES: no such directory");
  // No base language; a mixture over a held_out language; a bad role.
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c4"), "\ngettext: ", Path("locale"),
                                 "\nlanguages:\n  - {code: xa, family: f, role: held_in}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, "languages: needs exactly one language with role base");
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c5"), "\ngettext: ", Path("locale"),
                                 "\nlanguages:\n  - {code: en, family: g, role: base}\n",
                                 "  - {code: xa, family: f, role: held_out}\n",
                                 "mixtures:\n  - {name: m, languages: [en, xa]}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, "mixtures[0].languages[1]");
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c6"), "\ngettext: ", Path("locale"),
                                 "\nlanguages:\n  - {code: en, family: g, role: trained}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, "languages[0].role");
  // A catalogue that is not one: the file is named.
  Write("locale/xa/LC_MESSAGES/broken.mo", "garbage, not a catalogue");
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c7"), "\ngettext: ", Path("locale"),
                                 "\nlanguages:\n  - {code: en, family: g, role: base}\n",
                                 "  - {code: xa, family: f, role: held_in}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, "broken.mo: not a GNU .mo file");
  fs::remove(Path("locale/xa/LC_MESSAGES/broken.mo"));
  // A JSONL record without its field: file, line and field.
  Write("bad.jsonl", "{\"text\": \"a perfectly good document\"}\n{\"body\": \"x\"}\n");
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("c8"), "\nlanguages:\n",
                                 "  - {code: en, family: g, role: base, jsonl: [{path: ",
                                 Path("bad.jsonl"), "}]}\n"),
                    &err),
            4);
  EXPECT_CONTAINS(err, Path("bad.jsonl") + ":2: field 'text' missing");
  for (const char* c : {"c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8"})
    EXPECT_FALSE(fs::exists(Path(c))) << c;
}

TEST_F(PrepareTest, OverwriteOnlyWhenAsked) {
  const std::string out = Path("corpus");
  const std::string spec = StandardSpec(out);
  ASSERT_EQ(Prepare(spec), 0);
  std::string err;
  EXPECT_NE(Prepare(spec, &err), 0);
  EXPECT_CONTAINS(err, "already exists");
  EXPECT_EQ(Prepare(spec + "overwrite: true\n", &err), 0) << err;
  // Never over a directory Stemma did not write.
  Write("other/file.txt", "mine");
  std::string other = StandardSpec(Path("other")) + "overwrite: true\n";
  EXPECT_EQ(Prepare(other, &err), 4);
  EXPECT_TRUE(fs::exists(Path("other/file.txt")));
}

}  // namespace
}  // namespace stemma::engine::data

namespace stemma::engine::data {
namespace {

// `prepare` reads its text and JSONL sources compressed and through globs (text_input.h):
// the same documents as the plain files give the same corpus text.
TEST_F(PrepareTest, CompressedSourcesAndGlobsGiveTheSameCorpus) {
  std::string err;
  ASSERT_EQ(Prepare(StandardSpec(Path("plain")), &err), 0) << err;
  std::string spec = StandardSpec(Path("packed"));  // (re)writes the plain source files
  // xb's extra text gzipped by gzip(1); xc's JSONL split in two files, one gzipped, read
  // through a glob in name order.
  const std::string jsonl = Read(Path("xc.jsonl"));
  const size_t half = jsonl.find('\n', jsonl.size() / 2) + 1;
  fs::create_directories(Path("xc"));
  Write("xc/part-1.jsonl", jsonl.substr(0, half));
  Write("xc/part-2.jsonl", jsonl.substr(half));
  fs::remove(Path("xc.jsonl"));
  ASSERT_EQ(
      std::system(("gzip -f " + Path("xc/part-1.jsonl") + " " + Path("xb_extra.txt")).c_str()), 0);
  spec = absl::StrReplaceAll(spec, {{Path("xb_extra.txt"), Path("xb_extra.txt.gz")},
                                    {Path("xc.jsonl"), Path("xc/part-*.jsonl*")}});
  ASSERT_EQ(Prepare(spec, &err), 0) << err;
  for (const char* rel : {"train/xb.txt", "train/xc.txt", "heldout/xc.txt", "train/en.txt"}) {
    EXPECT_EQ(Read(Path(std::string("packed/") + rel)), Read(Path(std::string("plain/") + rel)))
        << rel;
  }
  EXPECT_NE(Read(Path("packed/manifest.json")).find("part-2.jsonl"), std::string::npos);
  // A glob that matches nothing names the field and the pattern.
  spec =
      absl::StrReplaceAll(StandardSpec(Path("none")), {{Path("xc.jsonl"), Path("nope/*.jsonl")}});
  EXPECT_EQ(Prepare(spec, &err), 4);
  EXPECT_NE(err.find("languages[3].jsonl[0] " + Path("nope/*.jsonl") + ": no file matches"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace stemma::engine::data

namespace stemma::engine::data {
namespace {

// A corpus already split by position and cleaned elsewhere (issue 22 item 9): `heldout_split:
// last` holds out each language's tail in source order; `keep_documents` takes text and JSONL
// documents as they are.
class PositionalPrepareTest : public PrepareTest {
 protected:
  // Sentence i of a language, long enough for min_chars and with letters.
  static std::string Doc(const std::string& lang, int i) {
    return absl::StrCat(lang, " sentence number ", i, " of the ready corpus");
  }
  std::vector<std::string> Text(const std::string& out, const std::string& rel) const {
    return Lines(out + "/" + rel);
  }
  static Json Counts(const Json& manifest, const std::string& code) {
    for (const auto& l : manifest["languages"])
      if (l["code"] == code) return l["counts"];
    return Json();
  }
};

TEST_F(PositionalPrepareTest, LastHoldsOutEachLanguagesTailInSourceOrder) {
  std::string en, xa;
  for (int i = 1; i <= 8; ++i) absl::StrAppend(&en, Doc("en", i), "\n");
  // xa: a duplicate and extra spaces (normalised and deduplicated as usual), and as its last
  // document English sentence 2, which en trains on: it leaves xa's held-out text.
  absl::StrAppend(&xa, Doc("xa", 1), "\n", Doc("xa", 2), "\n", Doc("xa", 1), "\n  ", Doc("xa", 3),
                  "   \n", Doc("xa", 4), "\n", Doc("en", 2), "\n");
  Write("en.txt", en);
  Write("xa.txt", xa);
  const std::string spec =
      absl::StrCat("heldout_fraction: 0.25\nlanguages:\n",
                   "  - {code: en, family: g, role: base, text: [", Path("en.txt"), "]}\n",
                   "  - {code: xa, family: f, role: held_in, text: [", Path("xa.txt"), "]}\n");
  std::string err;
  const std::string out = Path("last");
  ASSERT_EQ(Prepare(absl::StrCat("out: ", out, "\nheldout_split: last\n", spec), &err), 0) << err;
  // en: 8 documents, ⌈0.25·8⌉ = 2 held out: the last two.
  EXPECT_EQ(Text(out, "train/en.txt"),
            (std::vector<std::string>{Doc("en", 1), Doc("en", 2), Doc("en", 3), Doc("en", 4),
                                      Doc("en", 5), Doc("en", 6)}));
  EXPECT_EQ(Text(out, "heldout/en.txt"), (std::vector<std::string>{Doc("en", 7), Doc("en", 8)}));
  // xa: 5 distinct documents, ⌈0.25·5⌉ = 2 held out; the trained English one is dropped.
  EXPECT_EQ(Text(out, "train/xa.txt"),
            (std::vector<std::string>{Doc("xa", 1), Doc("xa", 2), Doc("xa", 3)}));
  EXPECT_EQ(Text(out, "heldout/xa.txt"), (std::vector<std::string>{Doc("xa", 4)}));
  const Json manifest = Json::parse(Read(out + "/manifest.json"));
  EXPECT_EQ(Counts(manifest, "xa")["duplicates"], 1);
  EXPECT_EQ(Counts(manifest, "xa")["train_overlap_excluded"], 1);
  EXPECT_EQ(manifest["parameters"]["heldout_split"], "last");
  EXPECT_EQ(manifest["normalisation"], "normalise@1");

  // The hash split of the same sources: another corpus, and the manifests say which.
  const std::string hashed = Path("hash");
  ASSERT_EQ(Prepare(absl::StrCat("out: ", hashed, "\n", spec), &err), 0) << err;
  const Json hash_manifest = Json::parse(Read(hashed + "/manifest.json"));
  EXPECT_EQ(hash_manifest["parameters"]["heldout_split"], "hash");
  EXPECT_NE(hash_manifest["content_hash"], manifest["content_hash"]);
  // Deterministic: the same again elsewhere, byte for byte.
  const std::string again = Path("again");
  ASSERT_EQ(Prepare(absl::StrCat("out: ", again, "\nheldout_split: last\n", spec), &err), 0);
  EXPECT_EQ(Read(again + "/manifest.json"), Read(out + "/manifest.json"));
}

TEST_F(PositionalPrepareTest, KeepDocumentsTakesTextAndJsonlAsTheyAre) {
  // Un-normalised whitespace, an accelerator, a directive, a decomposed é, a short line and a
  // duplicate: all kept, in source order; a blank line is no document.
  const std::vector<std::string> en = {
      "  Hello   world, with spaces  ", "_Open the file", "Cannot open %s now", "Short",
      "Cafe\xCC\x81 au lait",           "Short",          "\ttabbed\tline",     "last one"};
  std::string text;
  for (const std::string& d : en) absl::StrAppend(&text, d, "\n");
  text += "   \n";
  Write("en.txt", text);
  std::string jsonl;
  for (const char* d : {"  a  b  ", "dup", "dup", "x"})
    absl::StrAppend(&jsonl, Json({{"text", d}}).dump(), "\n");
  Write("xa.jsonl", jsonl);
  const std::string spec = absl::StrCat(
      "keep_documents: true\nheldout_split: last\nheldout_fraction: 0.25\nlanguages:\n",
      "  - {code: en, family: g, role: base, text: [", Path("en.txt"), "]}\n",
      "  - {code: xa, family: f, role: held_in, jsonl: [{path: ", Path("xa.jsonl"), "}]}\n");
  std::string err;
  const std::string out = Path("kept");
  ASSERT_EQ(Prepare(absl::StrCat("out: ", out, "\n", spec), &err), 0) << err;
  EXPECT_EQ(Text(out, "train/en.txt"), std::vector<std::string>(en.begin(), en.end() - 2));
  EXPECT_EQ(Text(out, "heldout/en.txt"), std::vector<std::string>(en.end() - 2, en.end()));
  EXPECT_EQ(Text(out, "train/xa.txt"), (std::vector<std::string>{"  a  b  ", "dup", "dup"}));
  EXPECT_EQ(Text(out, "heldout/xa.txt"), (std::vector<std::string>{"x"}));
  const Json manifest = Json::parse(Read(out + "/manifest.json"));
  EXPECT_EQ(Counts(manifest, "en")["duplicates"], 0);
  EXPECT_EQ(Counts(manifest, "en")["too_short"], 0);
  EXPECT_EQ(manifest["parameters"]["keep_documents"], true);
  EXPECT_NE(manifest["normalisation"], "normalise@1");

  // With the hash split the documents are still all there, each side in source order.
  const std::string hashed = Path("kept-hash");
  ASSERT_EQ(Prepare(absl::StrCat("out: ", hashed, "\n",
                                 absl::StrReplaceAll(spec, {{"heldout_split: last\n", ""}})),
                    &err),
            0)
      << err;
  std::vector<std::string> train = Text(hashed, "train/en.txt"),
                           heldout = Text(hashed, "heldout/en.txt");
  std::multiset<std::string> all(train.begin(), train.end());
  all.insert(heldout.begin(), heldout.end());
  EXPECT_EQ(all, std::multiset<std::string>(en.begin(), en.end()));
  for (const auto* side : {&train, &heldout}) {
    auto at = en.begin();
    for (const std::string& d : *side) {
      at = std::find(at, en.end(), d);
      EXPECT_NE(at, en.end()) << d << " is out of source order";
    }
  }

  // A document with a line break cannot be one line: refused, naming the record.
  Write("xa.jsonl", jsonl + Json({{"text", "two\nlines"}}).dump() + "\n");
  EXPECT_EQ(Prepare(absl::StrCat("out: ", Path("broken"), "\n", spec), &err), 4);
  EXPECT_CONTAINS(err, Path("xa.jsonl") + ":5: the document holds a line break");
}

// Evaluation pairs stay out of train/ and heldout/ when documents are kept as they are: a
// reserved translation with other spacing is still recognised.
TEST_F(PositionalPrepareTest, KeepDocumentsStillKeepsEvaluationPairsOut) {
  const std::string out = Path("corpus");
  // (No budget on xb: its gettext documents come first in source order and would fill it.)
  const std::string spec = absl::StrReplaceAll(StandardSpec(out, "keep_documents: true\n"),
                                               {{"budget_bytes: 20000", "budget_bytes: 0"}});
  // xb's extra text: every xa translation with spaces around it, one of them twice.
  std::string padded;
  for (int i = 0; i < 400; ++i) absl::StrAppend(&padded, "  ", Translation("xa", i), "\t\n");
  absl::StrAppend(&padded, "  ", Translation("xa", 3), "\t\n");
  Write("xb_extra.txt", padded);
  std::string err;
  ASSERT_EQ(Prepare(spec, &err), 0) << err;
  std::set<std::string> reserved;
  for (const auto& p : JsonLines(out + "/pairs/en-xa.jsonl")) reserved.insert(p["tgt"]);
  ASSERT_FALSE(reserved.empty());
  int padded_kept = 0, copies_of_3 = 0;
  for (const char* rel : {"train/xb.txt", "heldout/xb.txt"}) {
    for (const std::string& line : Lines(out + "/" + rel)) {
      const NormalizedText n = NormalizeCorpusText(line, NormalizeOptions{});
      EXPECT_EQ(reserved.count(n.text), 0u) << rel << " holds an evaluation pair: " << line;
      padded_kept += absl::StartsWith(line, "  xaword") ? 1 : 0;
      copies_of_3 += line == absl::StrCat("  ", Translation("xa", 3), "\t") ? 1 : 0;
    }
  }
  EXPECT_GT(padded_kept, 100) << "the padded documents are kept as they are";
  if (reserved.count(Translation("xa", 3)) == 0) EXPECT_EQ(copies_of_3, 2) << "no deduplication";
}

// The defaults written out are the defaults: the same corpus, manifest and all.
TEST_F(PositionalPrepareTest, ExplicitDefaultsGiveTheSameCorpus) {
  std::string err;
  ASSERT_EQ(Prepare(StandardSpec(Path("plain")), &err), 0) << err;
  ASSERT_EQ(
      Prepare(StandardSpec(Path("explicit"), "heldout_split: hash\nkeep_documents: false\n"), &err),
      0)
      << err;
  EXPECT_EQ(Read(Path("explicit/manifest.json")), Read(Path("plain/manifest.json")));
}

}  // namespace
}  // namespace stemma::engine::data
