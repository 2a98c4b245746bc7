// The inputs as people have them (engine/data/text_input.h): gzip and zstd files made by the
// real libraries, globs, and Parquet and JSONL files written by pyarrow and Hugging Face
// `datasets` themselves, read through `tokenize` and compared document by document with
// the same text read plain.
#include "engine/data/text_input.h"

#include <zlib.h>
#include <zstd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/data/data_test_fixture.h"
#include "engine/data/dataset.h"
#include "engine/data/tokenize.h"
#include "gtest/gtest.h"

namespace stemma::engine::data {
namespace {

namespace fs = std::filesystem;

class TextInputTest : public ByteTokenizerTest {
 protected:
  // gzip through zlib's own file API; `members` > 1 writes that many concatenated members.
  std::string WriteGzip(const std::string& rel, const std::string& contents, int members = 1) {
    std::string path = Path(rel);
    fs::remove(path);
    const size_t part = contents.size() / members + 1;
    for (int m = 0; m < members; ++m) {
      gzFile f = gzopen(path.c_str(), "ab");
      const std::string piece = contents.substr(std::min(contents.size(), m * part), part);
      gzwrite(f, piece.data(), static_cast<unsigned>(piece.size()));
      gzclose(f);
    }
    return path;
  }
  std::string WriteZstd(const std::string& rel, const std::string& contents) {
    std::string out(ZSTD_compressBound(contents.size()), '\0');
    const size_t n = ZSTD_compress(out.data(), out.size(), contents.data(), contents.size(), 3);
    EXPECT_FALSE(ZSTD_isError(n));
    out.resize(n);
    return Write(rel, out);
  }
  // The dataset's documents as text (the byte tokenizer maps byte b to id b).
  std::vector<std::string> Documents(const std::string& rel) const {
    auto ds = Dataset::Open(Path(rel), /*verify_checksums=*/true);
    EXPECT_TRUE(ds.ok()) << ds.status();
    std::vector<std::string> docs;
    if (!ds.ok()) return docs;
    for (int64_t d = 0; d < (*ds)->num_documents(); ++d) {
      std::string text;
      for (int32_t id : (*ds)->Document(d)) text.push_back(static_cast<char>(id));
      docs.push_back(text);
    }
    return docs;
  }
  // Runs the engine venv's Python (the one CMake built against) on `code`; false when absent.
  bool Python(const std::string& code) const {
    const std::string script = Write("make.py", code);
    const std::string cmd = std::string(STEMMA_PYTHON) + " " + script + " " + root_.string();
    return std::system(cmd.c_str()) == 0;
  }
};

constexpr char kText[] =
    "Первый абзац,\nвторая строка.\n\nSecond paragraph.\r\n\n\nTroisième — sans fin de ligne";

TEST_F(TextInputTest, GzipAndZstdReadAsThePlainText) {
  ASSERT_TRUE(TokenizeFiles(Spec({Write("a.txt", kText)}, "text", "p")).ok());
  const std::vector<std::string> plain = Documents("p");
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain[0], "Первый абзац,\nвторая строка.");
  for (const auto& [name, path] : std::vector<std::pair<std::string, std::string>>{
           {"gz", WriteGzip("a.txt.gz", kText)},
           {"gz3", WriteGzip("members.gz", kText, 3)},  // concatenated members (cat a.gz b.gz)
           {"zst", WriteZstd("a.txt.zst", kText)},
           {"renamed", WriteZstd("no-suffix", kText)}}) {  // told by magic bytes, not the name
    auto summary = TokenizeFiles(Spec({path}, "text", name));
    ASSERT_TRUE(summary.ok()) << name << ": " << summary.status();
    EXPECT_EQ(Documents(name), plain) << name;
  }
  EXPECT_EQ(*CompressionOf(Path("a.txt.gz")), "gzip");
  EXPECT_EQ(*CompressionOf(Path("no-suffix")), "zstd");
  EXPECT_EQ(*CompressionOf(Path("a.txt")), "");
  // JSONL compressed the same way.
  const std::string jsonl = "{\"text\": \"alpha\"}\n{\"text\": \"beta\"}\n";
  ASSERT_TRUE(TokenizeFiles(Spec({WriteZstd("d.jsonl.zst", jsonl)}, "jsonl", "j")).ok());
  EXPECT_EQ(Documents("j"), (std::vector<std::string>{"alpha", "beta"}));
}

TEST_F(TextInputTest, TruncatedCompressedFilesAreDataLossNamingTheFile) {
  std::string big;
  for (int i = 0; i < 20000; ++i) big += "line " + std::to_string(i * 7919 % 10007) + "\n";
  const std::string gz = WriteGzip("big.gz", big);
  fs::resize_file(gz, fs::file_size(gz) / 2);
  auto r = TokenizeFiles(Spec({gz}, "text", "t1"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_CONTAINS(r.status().message(), "big.gz");
  EXPECT_CONTAINS(r.status().message(), "gzip");
  const std::string zst = WriteZstd("big.zst", big);
  fs::resize_file(zst, fs::file_size(zst) - 5);
  r = TokenizeFiles(Spec({zst}, "text", "t2"));
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "big.zst");
  EXPECT_FALSE(fs::exists(Path("t1")));  // nothing half-published
}

TEST_F(TextInputTest, GlobsReadTheirFilesInNameOrderAndAnEmptyGlobIsAnError) {
  Write("raw/b.txt", "two");
  WriteGzip("raw/a.txt.gz", "one");
  Write("raw/c.txt", "three");
  Write("raw/skip.md", "not me");
  fs::create_directories(Path("raw/dir.txt"));  // a directory the glob matches is left out
  ASSERT_TRUE(TokenizeFiles(Spec({Path("raw/*.txt*"), Path("raw/c.txt")}, "text", "g")).ok());
  EXPECT_EQ(Documents("g"), (std::vector<std::string>{"one", "two", "three", "three"}));
  auto r = TokenizeFiles(Spec({Path("raw/*.parquet")}, "text", "none"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), "--input " + Path("raw/*.parquet") + ": no file matches");
}

TEST_F(TextInputTest, ParquetAndJsonFromPyarrowAndDatasetsReadUnchanged) {
  if (!ParquetSupported()) GTEST_SKIP() << "stemma-engine built without pyarrow";
  // Files made by the libraries people use: pyarrow with nulls, a large_string column and
  // several row groups; Hugging Face datasets' to_parquet and to_json (JSON lines).
  ASSERT_TRUE(Python(R"(
import sys, pyarrow as pa, pyarrow.parquet as pq, datasets
root = sys.argv[1]
rows = ["doc %d: %s" % (i, "Ünïcödé " * (i % 5)) for i in range(1000)]
rows[10] = None
t = pa.table({"id": pa.array(range(1000)), "content": pa.array(rows, pa.large_string())})
pq.write_table(t, root + "/pa.parquet", row_group_size=128)
ds = datasets.Dataset.from_dict({"text": ["erste", "zweite", "dritte"], "n": [1, 2, 3]})
ds.to_parquet(root + "/hf.parquet")
ds.to_json(root + "/hf.jsonl", force_ascii=False)
)")) << "the venv's Python could not write the files";
  auto r = TokenizeFiles([&] {
    auto s = Spec({Path("pa.parquet")}, "parquet", "pa");
    s.set_field("content");
    return s;
  }());
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<std::string> docs = Documents("pa");
  ASSERT_EQ(docs.size(), 999u);  // the null row skipped
  EXPECT_EQ(docs[0], "doc 0: ");
  EXPECT_EQ(docs[10], "doc 11: Ünïcödé ");
  EXPECT_EQ(docs.back(), "doc 999: Ünïcödé Ünïcödé Ünïcödé Ünïcödé ");
  ASSERT_TRUE(TokenizeFiles(Spec({Path("hf.parquet")}, "parquet", "hfp")).ok());
  ASSERT_TRUE(TokenizeFiles(Spec({Path("hf.jsonl")}, "jsonl", "hfj")).ok());
  EXPECT_EQ(Documents("hfp"), (std::vector<std::string>{"erste", "zweite", "dritte"}));
  EXPECT_EQ(Documents("hfj"), Documents("hfp"));
  // Errors name the file and the columns there are.
  r = TokenizeFiles(Spec({Path("pa.parquet")}, "parquet", "bad1"));
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "no column 'text' (columns: id, content)");
  r = TokenizeFiles([&] {
    auto s = Spec({Path("pa.parquet")}, "parquet", "bad2");
    s.set_field("id");
    return s;
  }());
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "column 'id' is int64, not a string column");
  r = TokenizeFiles(Spec({Write("fake.parquet", "not parquet at all")}, "parquet", "bad3"));
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "fake.parquet: not a Parquet file");
}

}  // namespace
}  // namespace stemma::engine::data
