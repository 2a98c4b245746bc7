// Unit tests of the data pipeline: tokenize → read round trips with the byte tokenizer,
// format checks, mixture proportions, temperature sampling, the held-out split, packing and
// exact resume.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/engine_spec.h"
#include "engine/data/commands.h"
#include "engine/data/data_test_fixture.h"
#include "engine/data/dataset.h"
#include "engine/data/dataset_writer.h"
#include "engine/data/loader.h"
#include "engine/data/tokenize.h"
#include "engine/events.h"
#include "engine/io/sha256.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::data {

using io::Sha256;
using io::Sha256File;
using io::Sha256Hex;
namespace {

namespace fs = std::filesystem;

constexpr int32_t kByteEos = 257;

class DataTest : public ByteTokenizerTest {
 protected:
  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::vector<int32_t> Bytes(const std::string& s) {
    return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(s.data()),
                                reinterpret_cast<const unsigned char*>(s.data()) + s.size());
  }
  // A dataset written directly: document d (of `sizes`) holds ids base + running index,
  // so every token of the dataset is distinct.
  std::shared_ptr<const Dataset> Synthetic(const std::string& name, const std::vector<int>& sizes,
                                           int32_t base, int64_t shard_tokens = 7) {
    DatasetWriterOptions o;
    o.out_dir = Path(name);
    o.language = name;
    o.tokenizer = {.name = "synthetic",
                   .kind = "none",
                   .file = "",
                   .sha256 = "",
                   .vocab_size = 0,
                   .bos_id = std::nullopt,
                   .eos_id = 0};
    o.shard_tokens = shard_tokens;
    auto w = DatasetWriter::Create(o);
    EXPECT_TRUE(w.ok()) << w.status();
    int32_t next = base;
    for (int n : sizes) {
      std::vector<int32_t> doc;
      for (int k = 0; k < n; ++k) doc.push_back(next++);
      EXPECT_TRUE((*w)->AddDocument(doc).ok());
    }
    EXPECT_TRUE((*w)->Finish({}).ok());
    auto ds = Dataset::Open(o.out_dir, /*verify_checksums=*/true);
    EXPECT_TRUE(ds.ok()) << ds.status();
    return std::shared_ptr<const Dataset>(std::move(*ds));
  }
};

TEST(Sha256Test, KnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Incremental updates in odd pieces equal one update.
  Sha256 h;
  std::string s = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  for (char c : s) h.Update(&c, 1);
  EXPECT_EQ(h.HexDigest(), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST_F(DataTest, TextParagraphsRoundTrip) {
  std::string a = Write("a.txt", "Hello world.\nSecond line.\n\n\n  \nПривет мир\r\n\r\nlast");
  std::string b = Write("b.txt", "\n\nfrom b\n");
  v1::TokenizeSpec o = Spec({a, b}, "text", "ds");
  o.set_shard_tokens(5);
  auto summary = TokenizeFiles(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  std::vector<std::string> want = {"Hello world.\nSecond line.", "Привет мир", "last", "from b"};
  auto ds = Dataset::Open(Path("ds"), /*verify_checksums=*/true);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_documents(), 4);
  int64_t total = 0;
  for (size_t d = 0; d < want.size(); ++d) {
    EXPECT_EQ((*ds)->Document(d), Bytes(want[d])) << d;
    total += want[d].size();
  }
  EXPECT_EQ((*ds)->num_tokens(), total);
  EXPECT_EQ(summary->num_shards, (total + 4) / 5);
  EXPECT_EQ((*ds)->language(), "xx");
  EXPECT_EQ((*ds)->tokenizer().kind, "bytes");
  EXPECT_EQ((*ds)->tokenizer().eos_id, kByteEos);
  EXPECT_FALSE((*ds)->eos_appended());

  nlohmann::json index = nlohmann::json::parse(ReadAll(Path("ds/index.json")));
  EXPECT_EQ(index["format"], "stemma-tokens-v1");
  EXPECT_EQ(index["tokenizer"]["file"], "stemma_tokenizer.json");
  EXPECT_EQ(index["tokenizer"]["sha256"], Sha256Hex(R"({"type": "bytes"})"));
  ASSERT_EQ(index["sources"].size(), 2u);
  EXPECT_EQ(index["sources"][0]["sha256"], Sha256Hex(ReadAll(a)));
  ASSERT_EQ(index["shards"].size(), static_cast<size_t>(summary->num_shards));
  EXPECT_EQ(index["shards"][0]["num_tokens"], 5);
  // The shard file is the raw little-endian uint32 ids.
  std::string shard0 = ReadAll(Path("ds/shard-00000.bin"));
  ASSERT_EQ(shard0.size(), 20u);
  EXPECT_EQ(static_cast<unsigned char>(shard0[0]), 'H');
  EXPECT_EQ(shard0[1], 0);
  EXPECT_EQ(index["shards"][0]["sha256"], Sha256Hex(shard0));
  // No staging directory left behind.
  for (const auto& e : fs::directory_iterator(root_)) {
    EXPECT_EQ(e.path().filename().string().find("staging"), std::string::npos);
  }
}

TEST_F(DataTest, LineDocsEosAndDeterminism) {
  std::string a = Write("a.txt", "one\ntwo\n\nthree\n");
  v1::TokenizeSpec o = Spec({a}, "text", "ds1");
  o.set_line_docs(true);
  o.set_eos(true);
  ASSERT_TRUE(TokenizeFiles(o).ok());
  auto ds = Dataset::Open(Path("ds1"));
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_documents(), 3);
  std::vector<int32_t> three = Bytes("three");
  three.push_back(kByteEos);
  EXPECT_EQ((*ds)->Document(2), three);
  EXPECT_TRUE((*ds)->eos_appended());
  // Same inputs, same bytes.
  o.set_out(Path("ds2"));
  ASSERT_TRUE(TokenizeFiles(o).ok());
  for (std::string f : {"index.json", "index.bin", "shard-00000.bin"}) {
    EXPECT_EQ(ReadAll(Path("ds1/" + f)), ReadAll(Path("ds2/" + f))) << f;
  }
  // An existing output is refused unless overwriting.
  auto again = TokenizeFiles(o);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  o.set_overwrite(true);
  EXPECT_TRUE(TokenizeFiles(o).ok());
}

TEST_F(DataTest, JsonlRoundTripAndCommand) {
  std::string a = Write("a.jsonl",
                        "{\"text\": \"alpha\", \"id\": 1}\n\n{\"text\": \"\"}\n"
                        "{\"body\": \"x\", \"text\": \"beta\\ngamma\"}\n");
  std::string out = Path("ds");
  std::string tok = Path("tok");
  std::vector<std::string> args = {"tokenize", "--tokenizer",    tok,          "--input", a,
                                   "--format", "jsonl",          "--language", "de",      "--out",
                                   out,        "--shard-tokens", "3"};
  std::vector<char*> argv;
  for (std::string& s : args) argv.push_back(s.data());
  ASSERT_EQ(RunTokenize(static_cast<int>(argv.size()), argv.data()), 0);
  auto ds = Dataset::Open(out, /*verify_checksums=*/true);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_documents(), 2);  // the empty string is skipped
  EXPECT_EQ((*ds)->Document(0), Bytes("alpha"));
  EXPECT_EQ((*ds)->Document(1), Bytes("beta\ngamma"));
  EXPECT_EQ((*ds)->language(), "de");
  // A bad spec exits 4 (bad input: the worker does not retry it).
  std::vector<std::string> bad = {"tokenize", "--tokenizer", tok, "--format", "xml"};
  argv.clear();
  for (std::string& s : bad) argv.push_back(s.data());
  EXPECT_EQ(RunTokenize(static_cast<int>(argv.size()), argv.data()), 4);
  // Several inputs after one --input, and --help.
  std::string b = Write("b.jsonl", "{\"text\": \"delta\"}\n");
  std::vector<std::string> two = {"tokenize", "--tokenizer", tok,     "--input",    a,
                                  b,          "--format",    "jsonl", "--language", "de",
                                  "--out",    Path("ds2")};
  argv.clear();
  for (std::string& s : two) argv.push_back(s.data());
  ASSERT_EQ(RunTokenize(static_cast<int>(argv.size()), argv.data()), 0);
  EXPECT_EQ((*Dataset::Open(Path("ds2")))->num_documents(), 3);
  std::vector<std::string> help = {"tokenize", "--help"};
  argv.clear();
  for (std::string& s : help) argv.push_back(s.data());
  EXPECT_EQ(RunTokenize(static_cast<int>(argv.size()), argv.data()), 0);
}

// A dataset's lineage: index.json names its tokenizer and the Stemma corpus its input lies
// in (with the corpus manifest's sha256), and the output event carries both as parents, as a
// trained model's stemma.json and output event carry its base.
TEST_F(DataTest, ADatasetsParentsAreItsTokenizerAndItsCorpus) {
  const std::string manifest = Write(
      "corpus/manifest.json", R"({"format": "stemma.corpus/1", "content_hash": "x", "files": []})");
  const std::string train = Write("corpus/train/xx.txt", "one document\nanother one\n");
  const std::string plain = Write("plain.txt", "not in a corpus\n");
  v1::TokenizeSpec o = Spec({train, plain, train}, "text", "ds");
  o.set_tokenizer(Path("tok") + "/");
  ASSERT_TRUE(TokenizeFiles(o).ok());
  const nlohmann::json index = nlohmann::json::parse(ReadAll(Path("ds/index.json")));
  const nlohmann::json want = nlohmann::json::array(
      {{{"path", Path("tok")}, {"role", "tokenizer"}},
       {{"path", Path("corpus")}, {"role", "corpus"}, {"manifest_sha256", *Sha256File(manifest)}}});
  EXPECT_EQ(index["parents"], want);
  auto event = OutputEvent("dataset", Path("ds"), "tokenize");
  ASSERT_TRUE(event.ok()) << event.status();
  EXPECT_EQ(std::vector<std::string>(event->parents().begin(), event->parents().end()),
            (std::vector<std::string>{Path("tok"), Path("corpus")}));
  EXPECT_EQ(event->type(), "dataset");
  // Outside a corpus: the tokenizer alone.
  ASSERT_TRUE(TokenizeFiles(Spec({plain}, "text", "ds2")).ok());
  EXPECT_EQ(nlohmann::json::parse(ReadAll(Path("ds2/index.json")))["parents"],
            nlohmann::json::array({{{"path", Path("tok")}, {"role", "tokenizer"}}}));
}

TEST_F(DataTest, BadInputsNameFileLineAndField) {
  struct Case {
    std::string name, contents, field, want;
  };
  std::vector<Case> cases = {
      {"badjson.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"x\"\n", "text",
       "badjson.jsonl:2: bad JSON"},
      {"missing.jsonl", "{\"text\": \"ok\"}\n\n{\"body\": \"x\"}\n", "text",
       "missing.jsonl:3: field 'text' missing"},
      {"number.jsonl", "{\"content\": 7}\n", "content",
       "number.jsonl:1: field 'content' is number, not a string"},
      {"array.jsonl", "[1, 2]\n", "text", "array.jsonl:1: expected a JSON object"},
      {"empty.jsonl", "\n{\"text\": \"\"}\n", "text", "empty dataset: no documents in"},
  };
  for (const Case& c : cases) {
    std::string path = Write(c.name, c.contents);
    v1::TokenizeSpec o = Spec({path}, "jsonl", "out_" + c.name);
    o.set_field(c.field);
    auto r = TokenizeFiles(o);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_CONTAINS(std::string(r.status().message()), c.want) << c.name;
    if (c.name == "empty.jsonl") {
      EXPECT_CONTAINS(std::string(r.status().message()), path);
      EXPECT_CONTAINS(std::string(r.status().message()), "field 'text'");
    }
    EXPECT_FALSE(fs::exists(Path("out_" + c.name))) << c.name;
    EXPECT_FALSE(fs::exists(Path("out_" + c.name + ".staging-" + std::to_string(::getpid()))));
  }
  // Empty text input, missing input file, missing tokenizer.
  std::string blank = Write("blank.txt", "\n  \n\n");
  auto r = TokenizeFiles(Spec({blank}, "text", "o1"));
  EXPECT_CONTAINS(std::string(r.status().message()), "empty dataset");
  r = TokenizeFiles(Spec({Path("nope.txt")}, "text", "o2"));
  EXPECT_CONTAINS(std::string(r.status().message()), "nope.txt");
  v1::TokenizeSpec o = Spec({blank}, "text", "o3");
  o.set_tokenizer(Path("no_tokenizer"));
  EXPECT_FALSE(TokenizeFiles(o).ok());
}

TEST_F(DataTest, DamagedDatasetsAreRejected) {
  Synthetic("ds", {3, 4, 5}, 10);
  // A damaged shard fails the checksum.
  {
    std::fstream f(Path("ds/shard-00001.bin"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.put('\x7f');
  }
  auto ds = Dataset::Open(Path("ds"), /*verify_checksums=*/true);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_CONTAINS(std::string(ds.status().message()), "shard-00001.bin");
  // A truncated shard fails on its size even without checksums.
  fs::resize_file(Path("ds/shard-00000.bin"), 8);
  ds = Dataset::Open(Path("ds"));
  EXPECT_CONTAINS(std::string(ds.status().message()), "shard-00000.bin");
  // A bad field in index.json is named.
  nlohmann::json index = nlohmann::json::parse(ReadAll(Path("ds/index.json")));
  index["num_tokens"] = "many";
  Write("ds/index.json", index.dump());
  ds = Dataset::Open(Path("ds"));
  EXPECT_CONTAINS(std::string(ds.status().message()), "'num_tokens'");
  EXPECT_EQ(Dataset::Open(Path("none")).status().code(), absl::StatusCode::kNotFound);
}

TEST(TemperatureTest, Formula) {
  std::vector<double> n = {1e6, 1e4, 100};
  for (double t : {0.5, 1.0, 2.0, 5.0, 1e9}) {
    auto p = TemperatureProbabilities(n, t);
    ASSERT_TRUE(p.ok());
    double z = 0;
    for (double x : n) z += std::pow(x, 1 / t);
    for (size_t i = 0; i < n.size(); ++i) {
      EXPECT_NEAR((*p)[i], std::pow(n[i], 1 / t) / z, 1e-12) << t;
    }
  }
  auto p1 = TemperatureProbabilities(n, 1.0);
  EXPECT_NEAR((*p1)[0], 1e6 / (1e6 + 1e4 + 100), 1e-12);
  auto pinf = TemperatureProbabilities(n, 1e9);
  EXPECT_NEAR((*pinf)[2], 1.0 / 3, 1e-6);
  EXPECT_FALSE(TemperatureProbabilities(n, 0).ok());
  EXPECT_FALSE(TemperatureProbabilities({0, 0}, 1).ok());
}

TEST_F(DataTest, TemperatureAndFamilyMixtures) {
  auto a = Synthetic("a", {100, 300}, 1000);  // 400 tokens
  auto b = Synthetic("b", {100}, 5000);       // 100
  auto c = Synthetic("c", {25}, 9000);        // 25
  MixtureSpec spec;
  spec.components = {
      {a, std::nullopt, "slavic"}, {b, std::nullopt, "slavic"}, {c, std::nullopt, "romance"}};
  spec.temperature = 2.0;
  LoaderOptions o{.seq_len = 8};
  auto loader = Loader::Create(spec, o);
  ASSERT_TRUE(loader.ok()) << loader.status();
  // sqrt(400) : sqrt(100) : sqrt(25) = 20 : 10 : 5
  EXPECT_NEAR((*loader)->probabilities()[0], 20.0 / 35, 1e-12);
  EXPECT_NEAR((*loader)->probabilities()[2], 5.0 / 35, 1e-12);
  spec.family_weights = {{"slavic", 0.9}, {"romance", 0.1}};
  loader = Loader::Create(spec, o);
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_NEAR((*loader)->probabilities()[0], 0.9 * 20 / 30, 1e-12);
  EXPECT_NEAR((*loader)->probabilities()[1], 0.9 * 10 / 30, 1e-12);
  EXPECT_NEAR((*loader)->probabilities()[2], 0.1, 1e-12);
  spec.family_weights = {{"slavic", 1.0}};
  EXPECT_CONTAINS(std::string(Loader::Create(spec, o).status().message()), "romance");
  spec.family_weights.clear();
  spec.components[0].weight = 1.0;
  EXPECT_FALSE(Loader::Create(spec, o).ok());  // weight and temperature
}

TEST_F(DataTest, OpenMixtureFromTheTypedSpec) {
  Synthetic("uk", {10, 20}, 100);
  Synthetic("en", {30}, 500);
  v1::TrainData data;
  auto* uk = data.add_datasets();
  uk->set_path(Path("uk"));
  uk->set_family("slavic");
  auto* en = data.add_datasets();
  en->set_path(Path("en"));
  en->set_family("germanic");
  data.set_temperature(1.0);
  (*data.mutable_family_weights())["slavic"] = 3;
  (*data.mutable_family_weights())["germanic"] = 1;
  auto spec = OpenMixture(data);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto loader = Loader::Create(*spec, {.seq_len = 4});
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_NEAR((*loader)->probabilities()[0], 0.75, 1e-12);
  data.mutable_datasets(1)->set_path(Path("missing"));
  auto missing = OpenMixture(data);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_CONTAINS(missing.status().message(), "data.datasets[1].path");
  data.mutable_datasets(1)->set_path(Path("en"));
  data.mutable_datasets(1)->set_heldout_path(Path("missing"));
  EXPECT_CONTAINS(OpenMixture(data).status().message(), "data.datasets[1].heldout_path");
}

// Issue 16 point 2: one dataset, or several, with no weights: equal shares.
TEST_F(DataTest, DatasetsWithoutWeightsGetEqualShares) {
  Synthetic("a", {10, 20}, 100);
  Synthetic("b", {300}, 500);
  v1::TrainData data;
  data.add_datasets()->set_path(Path("a"));
  auto one = OpenMixture(data);
  ASSERT_TRUE(one.ok()) << one.status();
  auto loader = Loader::Create(*one, {.seq_len = 4});
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ((*loader)->probabilities(), std::vector<double>{1.0});
  data.add_datasets()->set_path(Path("b"));
  auto two = OpenMixture(data);
  ASSERT_TRUE(two.ok()) << two.status();
  loader = Loader::Create(*two, {.seq_len = 4});
  ASSERT_TRUE(loader.ok()) << loader.status();
  EXPECT_EQ((*loader)->probabilities(), (std::vector<double>{0.5, 0.5}));  // not by size
}

// Issue 16 point 4: the end of a corpus held out by position.
TEST_F(DataTest, HeldOutByPositionTakesTheLastDocuments) {
  auto ds = Synthetic("a", std::vector<int>(50, 3), 100);
  MixtureSpec spec;
  spec.components = {{ds, 1.0, ""}};
  LoaderOptions o{.seq_len = 4, .heldout_fraction = 0.1, .heldout_last = true};
  auto train = Loader::Create(spec, o);
  o.split = Split::kHeldOut;
  auto held = Loader::Create(spec, o);
  ASSERT_TRUE(train.ok() && held.ok());
  EXPECT_EQ((*held)->documents(0), (std::vector<int64_t>{45, 46, 47, 48, 49}));
  EXPECT_EQ((*train)->documents(0).size(), 45u);
  EXPECT_EQ((*train)->documents(0).back(), 44);
  // ceil: a small fraction still holds out one document; a tiny corpus keeps its first.
  EXPECT_EQ(FirstHeldOutByPosition(50, 0.001), 49);
  EXPECT_EQ(FirstHeldOutByPosition(50, 0.0), 50);
  EXPECT_EQ(FirstHeldOutByPosition(3, 0.5), 1);
}

// Issue 16 point 4: a separate dataset as the held-out set.
TEST_F(DataTest, HeldOutFromASeparateDataset) {
  auto train_ds = Synthetic("train", {5, 6, 7}, 100);
  auto valid_ds = Synthetic("valid", {4, 4}, 900);
  MixtureSpec spec;
  spec.components = {{train_ds, 1.0, "", valid_ds}};
  LoaderOptions o{.seq_len = 3, .shuffle = false};
  o.heldout_fraction = 0.5;  // does not apply to a dataset with its own held-out set
  auto train = Loader::Create(spec, o);
  o.split = Split::kHeldOut;
  auto held = Loader::Create(spec, o);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ((*train)->documents(0), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ((*held)->documents(0), (std::vector<int64_t>{0, 1}));
  const std::vector<int32_t> row = (*held)->NextBatch(1);
  EXPECT_EQ(row, (std::vector<int32_t>{900, 901, 902, 903}));  // the valid dataset's tokens
  EXPECT_EQ((*held)->state().cursors[0].dir, valid_ds->dir());
}

// Issue 16 point 11: a one-paragraph-per-line file read without line_docs gets a hint.
TEST_F(DataTest, AHugeOneParagraphTextGetsALineDocsHint) {
  std::string text;
  for (int i = 0; text.size() < static_cast<size_t>(kLineDocsHintBytes) + 10; ++i) {
    text += "line " + std::to_string(i) + " of a corpus with one paragraph per line\n";
  }
  const std::string path = Write("lines.txt", text);
  v1::TokenizeSpec o = Spec({path}, "text", "lines_ds");
  auto summary = TokenizeFiles(o);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->num_documents, 1);
  const std::string hint = LineDocsHint(o, *summary);
  EXPECT_CONTAINS(hint, "lines.txt:1");
  EXPECT_CONTAINS(hint, "--line-docs");
  o.set_line_docs(true);
  o.set_out(Path("lines_ds2"));
  auto per_line = TokenizeFiles(o);
  ASSERT_TRUE(per_line.ok());
  EXPECT_GT(per_line->num_documents, 10000);
  EXPECT_EQ(LineDocsHint(o, *per_line), "");
  // Ordinary paragraphs get none.
  o = Spec({Write("p.txt", "one\ntwo\n\nthree\n")}, "text", "p_ds");
  EXPECT_EQ(LineDocsHint(o, *TokenizeFiles(o)), "");
}

TEST_F(DataTest, MixtureRefusesDifferentTokenizers) {
  std::string a = Write("a.txt", "alpha\n");
  ASSERT_TRUE(TokenizeFiles(Spec({a}, "text", "bytes_ds")).ok());
  fs::create_directories(Path("tok2"));
  Write("tok2/config.json", R"({"stemma_tokenizer": {"type": "bytes"}})");
  v1::TokenizeSpec o = Spec({a}, "text", "bytes2_ds");
  o.set_tokenizer(Path("tok2"));
  ASSERT_TRUE(TokenizeFiles(o).ok());
  MixtureSpec spec;
  spec.components = {{std::move(*Dataset::Open(Path("bytes_ds"))), 1.0, ""},
                     {std::move(*Dataset::Open(Path("bytes2_ds"))), 1.0, ""}};
  auto loader = Loader::Create(spec, {.seq_len = 4});
  EXPECT_CONTAINS(loader.status().message(), "tokenized with");
}

TEST_F(DataTest, MixtureProportionsMatchWeights) {
  auto a = Synthetic("a", {50, 70, 90}, 1000);
  auto b = Synthetic("b", {40}, 5000);
  auto c = Synthetic("c", {30, 30}, 9000);
  MixtureSpec spec;
  spec.components = {{a, 5.0, ""}, {b, 3.0, ""}, {c, 2.0, ""}};
  auto loader = Loader::Create(spec, {.seq_len = 4, .seed = 42});
  ASSERT_TRUE(loader.ok()) << loader.status();
  const int64_t kRows = 20000;
  std::vector<int64_t> counts(3, 0);
  for (int step = 0; step < kRows / 50; ++step) {
    std::vector<int32_t> batch = (*loader)->NextBatch(50);
    ASSERT_EQ(batch.size(), 50u * 5);
    for (int r = 0; r < 50; ++r) {
      int32_t first = batch[r * 5];
      int32_t id = first == 0 ? batch[r * 5 + 1] : first;  // a row may start at an EOS
      counts[id >= 9000 ? 2 : id >= 5000 ? 1 : 0]++;
    }
  }
  EXPECT_EQ((*loader)->rows_per_component(), counts);
  for (int i = 0; i < 3; ++i) {
    double p = (*loader)->probabilities()[i];
    double sd = std::sqrt(kRows * p * (1 - p));
    EXPECT_NEAR(counts[i], kRows * p, 4 * sd) << "component " << i;  // 4σ: ~6e-5 false alarm
  }
  EXPECT_NEAR((*loader)->probabilities()[0], 0.5, 1e-12);
}

TEST_F(DataTest, PackingCoversEveryTokenOncePerEpoch) {
  // Documents of varied sizes, some longer than a window, across shards of 7 tokens.
  std::vector<int> sizes = {1, 2, 13, 4, 25, 3, 9, 1, 6};
  auto ds = Synthetic("a", sizes, 100);
  for (bool shuffle : {false, true}) {
    MixtureSpec spec;
    spec.components = {{ds, 1.0, ""}};
    LoaderOptions o{.seq_len = 6, .seed = 3, .shuffle = shuffle};
    auto loader = Loader::Create(spec, o);
    ASSERT_TRUE(loader.ok()) << loader.status();
    const int64_t per_epoch = (*loader)->epoch_tokens(0);
    ASSERT_EQ(per_epoch, ds->num_tokens() + static_cast<int64_t>(sizes.size()));
    // Three epochs' worth of windows, concatenated.
    std::vector<int32_t> stream;
    while (static_cast<int64_t>(stream.size()) < 3 * per_epoch) {
      std::vector<int32_t> b = (*loader)->NextBatch(3);
      stream.insert(stream.end(), b.begin(), b.end());
    }
    for (int e = 0; e < 3; ++e) {
      std::multiset<int32_t> seen(stream.begin() + e * per_epoch,
                                  stream.begin() + (e + 1) * per_epoch);
      // Every token id once, EOS once per document.
      EXPECT_EQ(seen.count(0), sizes.size()) << "epoch " << e;
      for (int32_t t = 100; t < 100 + ds->num_tokens(); ++t) {
        ASSERT_EQ(seen.count(t), 1u) << "token " << t << " epoch " << e;
      }
      // Documents are contiguous and followed by EOS.
      for (int64_t i = e * per_epoch; i < (e + 1) * per_epoch - 1; ++i) {
        if (stream[i] != 0 && stream[i + 1] != 0) {
          EXPECT_EQ(stream[i + 1], stream[i] + 1);
        }
      }
    }
    if (!shuffle) {
      EXPECT_EQ(stream[0], 100);
    }
    // Shuffled epochs differ in order.
    if (shuffle) {
      EXPECT_NE(std::vector<int32_t>(stream.begin(), stream.begin() + per_epoch),
                std::vector<int32_t>(stream.begin() + per_epoch, stream.begin() + 2 * per_epoch));
    }
  }
}

TEST_F(DataTest, HeldOutSplitIsDisjointAndStable) {
  std::vector<int> sizes(400, 3);
  auto ds = Synthetic("a", sizes, 100);
  MixtureSpec spec;
  spec.components = {{ds, 1.0, ""}};
  LoaderOptions o{.seq_len = 4, .heldout_fraction = 0.1, .split_seed = 7};
  auto train = Loader::Create(spec, o);
  o.split = Split::kHeldOut;
  auto held = Loader::Create(spec, o);
  ASSERT_TRUE(train.ok() && held.ok());
  const auto& t = (*train)->documents(0);
  const auto& h = (*held)->documents(0);
  EXPECT_EQ(t.size() + h.size(), sizes.size());
  std::set<int64_t> ts(t.begin(), t.end());
  for (int64_t d : h) EXPECT_FALSE(ts.contains(d)) << d;
  double sd = std::sqrt(400 * 0.1 * 0.9);
  EXPECT_NEAR(static_cast<double>(h.size()), 40, 4 * sd);
  // Stable: the same documents in a dataset with other shards and a different doc order.
  std::vector<std::vector<int32_t>> held_docs;
  for (int64_t d : h) held_docs.push_back(ds->Document(d));
  DatasetWriterOptions wo;
  wo.out_dir = Path("rev");
  wo.language = "rev";
  wo.tokenizer.eos_id = 0;
  wo.shard_tokens = 11;
  auto w = DatasetWriter::Create(wo);
  for (int64_t d = ds->num_documents() - 1; d >= 0; --d)
    ASSERT_TRUE((*w)->AddDocument(ds->Document(d)).ok());
  ASSERT_TRUE((*w)->Finish({}).ok());
  std::shared_ptr<const Dataset> rev = std::move(*Dataset::Open(Path("rev")));
  spec.components = {{rev, 1.0, ""}};
  auto held2 = Loader::Create(spec, o);
  ASSERT_TRUE(held2.ok());
  std::set<std::vector<int32_t>> a(held_docs.begin(), held_docs.end()), b;
  for (int64_t d : (*held2)->documents(0)) b.insert(rev->Document(d));
  EXPECT_EQ(a, b);
  // Another seed gives another split.
  o.split_seed = 8;
  spec.components = {{ds, 1.0, ""}};
  auto held3 = Loader::Create(spec, o);
  EXPECT_NE((*held3)->documents(0), h);
}

TEST_F(DataTest, SaveRestoreReproducesFollowingBatches) {
  auto a = Synthetic("a", {5, 17, 3, 8, 2, 30}, 1000);
  auto b = Synthetic("b", {4, 4, 9}, 5000);
  MixtureSpec spec;
  spec.components = {{a, 0.7, ""}, {b, 0.3, ""}};
  LoaderOptions o{.seq_len = 5, .seed = 11, .heldout_fraction = 0.2, .split_seed = 1};
  auto reference = Loader::Create(spec, o);
  ASSERT_TRUE(reference.ok()) << reference.status();
  std::vector<std::vector<int32_t>> batches;
  for (int i = 0; i < 60; ++i) batches.push_back((*reference)->NextBatch(3));
  for (int k : {0, 1, 7, 23, 59}) {
    auto run = Loader::Create(spec, o);
    for (int i = 0; i < k; ++i) (*run)->NextBatch(3);
    // Through JSON text, as a checkpoint stores it.
    std::string saved = (*run)->state().ToJson().dump();
    auto state = LoaderState::FromJson(nlohmann::json::parse(saved));
    ASSERT_TRUE(state.ok()) << state.status();
    auto resumed = Loader::Create(spec, o);
    ASSERT_TRUE((*resumed)->Restore(*state).ok());
    for (int i = k; i < 60; ++i) {
      ASSERT_EQ((*resumed)->NextBatch(3), batches[i]) << "k=" << k << " batch " << i;
    }
    EXPECT_EQ((*resumed)->state().ToJson(), (*reference)->state().ToJson());
  }
  // A state from other options or datasets is refused.
  LoaderState s = (*reference)->state();
  LoaderOptions other = o;
  other.seed = 12;
  EXPECT_FALSE((*Loader::Create(spec, other))->Restore(s).ok());
  spec.components = {{b, 0.3, ""}, {a, 0.7, ""}};
  EXPECT_FALSE((*Loader::Create(spec, o))->Restore(s).ok());
  auto bad = LoaderState::FromJson(nlohmann::json{{"seed", 1}});
  EXPECT_CONTAINS(std::string(bad.status().message()), "'seq_len'");
}

}  // namespace
}  // namespace stemma::engine::data
