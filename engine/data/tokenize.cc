#include "engine/data/tokenize.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/json_line.h"
#include "common/manifest.h"
#include "common/status.h"
#include "engine/data/dataset_writer.h"
#include "engine/data/text_input.h"
#include "engine/io/fs.h"
#include "engine/io/sha256.h"
#include "nlohmann/json.hpp"

namespace stemma::engine::data {

using io::Sha256;
using io::Sha256File;
using io::Sha256Hex;
namespace {

namespace fs = std::filesystem;

bool IsBlank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string::npos;
}

// The tokenizer file Tokenizer::Load chose for `kind`, to hash for index.json.
absl::StatusOr<TokenizerInfo> DescribeTokenizer(const std::string& dir,
                                                const tokenizer::Tokenizer& tok) {
  TokenizerInfo info;
  info.kind = std::string(tok.kind());
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  info.name = p.filename().string();
  std::vector<std::string> candidates;
  if (info.kind == "hf_bpe") {
    candidates = {"tokenizer.json"};
  } else if (info.kind == "sentencepiece") {
    candidates = {"tokenizer.model"};
  } else {
    candidates = {"stemma_tokenizer.json", "config.json"};
  }
  for (const std::string& c : candidates) {
    std::error_code ec;
    if (fs::exists(dir + "/" + c, ec)) {
      info.file = c;
      ASSIGN_OR_RETURN(info.sha256, Sha256File(dir + "/" + c));
      break;
    }
  }
  if (info.file.empty()) {
    return absl::NotFoundError(absl::StrCat("--tokenizer ", dir, ": no tokenizer file to hash"));
  }
  info.vocab_size = tok.vocab_size();
  info.bos_id = tok.bos_id();
  info.eos_id = tok.eos_id();
  return info;
}

class DocumentSink {
 public:
  DocumentSink(const tokenizer::Tokenizer& tok, DatasetWriter& writer, bool append_eos,
               TokenizeSummary& summary)
      : tok_(tok), writer_(writer), append_eos_(append_eos), summary_(summary) {}
  absl::Status Add(std::string_view text, const std::string& where, int64_t lines = 1) {
    if (static_cast<int64_t>(text.size()) > summary_.largest_document_bytes) {
      summary_.largest_document_bytes = static_cast<int64_t>(text.size());
      summary_.largest_document_lines = lines;
      summary_.largest_document_where = where;
    }
    std::vector<int32_t> ids = tok_.Encode(text);
    if (ids.empty()) return absl::OkStatus();
    if (append_eos_) ids.push_back(*tok_.eos_id());
    absl::Status s = writer_.AddDocument(ids);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
    return absl::OkStatus();
  }

 private:
  const tokenizer::Tokenizer& tok_;
  DatasetWriter& writer_;
  bool append_eos_;
  TokenizeSummary& summary_;
};

absl::Status ReadText(const std::string& path, LineReader& in, bool line_docs, DocumentSink& sink) {
  std::string line, doc;
  int64_t line_no = 0, doc_line = 0;
  auto flush = [&]() -> absl::Status {
    if (doc.empty()) return absl::OkStatus();
    absl::Status s = sink.Add(doc, absl::StrCat(path, ":", doc_line),
                              1 + static_cast<int64_t>(std::count(doc.begin(), doc.end(), '\n')));
    doc.clear();
    return s;
  };
  while (in.Next(&line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (IsBlank(line)) {
      RETURN_IF_ERROR(flush());
      continue;
    }
    if (line_docs) {
      RETURN_IF_ERROR(sink.Add(line, absl::StrCat(path, ":", line_no)));
      continue;
    }
    if (doc.empty()) {
      doc_line = line_no;
    } else {
      doc.push_back('\n');
    }
    doc += line;
  }
  RETURN_IF_ERROR(in.status());
  return flush();
}

absl::Status ReadJsonl(const std::string& path, LineReader& in, const std::string& field,
                       DocumentSink& sink) {
  std::string line;
  int64_t line_no = 0;
  while (in.Next(&line)) {
    ++line_no;
    if (IsBlank(line)) continue;
    std::string where = absl::StrCat(path, ":", line_no);
    ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(line, where));
    auto it = j.find(field);
    if (it == j.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": field '", field, "' missing"));
    }
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": field '", field, "' is ", it->type_name(), ", not a string"));
    }
    RETURN_IF_ERROR(sink.Add(it->get_ref<const std::string&>(), where));
  }
  return in.status();
}

absl::Status ReadDocuments(const v1::TokenizeSpec& spec, const std::string& path,
                           DocumentSink& sink) {
  if (spec.format() == "parquet") {
    return ForEachParquetString(path, spec.field(), [&](std::string_view text, int64_t row) {
      return sink.Add(text, absl::StrCat(path, ": row ", row));
    });
  }
  auto in = LineReader::Open(path);
  if (!in.ok()) return absl::NotFoundError(absl::StrCat("--input ", path, ": cannot open"));
  if (spec.format() == "jsonl") return ReadJsonl(path, **in, spec.field(), sink);
  return ReadText(path, **in, spec.line_docs(), sink);
}

// A path as a parent names it: lexically normal, without a trailing slash.
std::string ParentPath(const std::string& path) {
  std::string p = fs::path(path).lexically_normal().string();
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// The dataset's parents: the tokenizer's directory, then each Stemma corpus (a directory
// with a manifest.json of format stemma.corpus/*) that an input lies in, once, in input order.
std::vector<DatasetParent> Parents(const std::string& tokenizer,
                                   const std::vector<std::string>& inputs) {
  std::vector<DatasetParent> parents = {{ParentPath(tokenizer), "tokenizer", ""}};
  for (const std::string& input : inputs) {
    for (fs::path dir = fs::path(ParentPath(input)).parent_path(); !dir.empty();
         dir = dir.parent_path()) {
      absl::StatusOr<std::string> text =
          io::ReadFile((dir / manifest::kCorpusManifestName).string());
      if (text.ok()) {
        const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
        if (manifest::IsCorpusManifest(j)) {
          const std::string path = ParentPath(dir.string());
          if (std::none_of(parents.begin(), parents.end(),
                           [&](const DatasetParent& p) { return p.path == path; })) {
            parents.push_back({path, "corpus", Sha256Hex(*text)});
          }
          break;
        }
      }
      if (dir == dir.root_path()) break;
    }
  }
  return parents;
}

}  // namespace

absl::StatusOr<TokenizeSummary> TokenizeFiles(const v1::TokenizeSpec& spec) {
  if (spec.input().empty()) return absl::InvalidArgumentError("--input: no files given");
  ASSIGN_OR_RETURN(std::unique_ptr<tokenizer::Tokenizer> tok,
                   tokenizer::Tokenizer::Load(spec.tokenizer()));
  ASSIGN_OR_RETURN(TokenizerInfo info, DescribeTokenizer(spec.tokenizer(), *tok));
  // Globs expanded and missing inputs refused before any work.
  ASSIGN_OR_RETURN(const std::vector<std::string> inputs,
                   ExpandInputs({spec.input().begin(), spec.input().end()}, "--input"));
  std::vector<SourceFile> sources;
  for (const std::string& path : inputs) {
    SourceFile s;
    s.path = path;
    ASSIGN_OR_RETURN(s.sha256, Sha256File(path, &s.bytes));
    sources.push_back(std::move(s));
  }
  DatasetWriterOptions wopts;
  wopts.out_dir = spec.out();
  wopts.language = spec.language();
  wopts.tokenizer = info;
  wopts.shard_tokens = spec.shard_tokens();
  wopts.eos_appended = spec.eos();
  wopts.overwrite = spec.overwrite();
  wopts.parents = Parents(spec.tokenizer(), inputs);
  ASSIGN_OR_RETURN(std::unique_ptr<DatasetWriter> writer, DatasetWriter::Create(wopts));
  TokenizeSummary summary;
  DocumentSink sink(*tok, *writer, spec.eos(), summary);
  for (const std::string& path : inputs) RETURN_IF_ERROR(ReadDocuments(spec, path, sink));
  if (writer->num_tokens() == 0) {
    std::string files;
    for (const std::string& p : inputs) absl::StrAppend(&files, files.empty() ? "" : ", ", p);
    const bool field = spec.format() != "text";
    return absl::InvalidArgumentError(
        absl::StrCat("empty dataset: no documents in ", files,
                     field ? absl::StrCat(" (field '", spec.field(), "')") : std::string()));
  }
  summary.num_documents = writer->num_documents();
  summary.num_tokens = writer->num_tokens();
  summary.num_shards = (summary.num_tokens + wopts.shard_tokens - 1) / wopts.shard_tokens;
  RETURN_IF_ERROR(writer->Finish(sources));
  return summary;
}

std::string LineDocsHint(const v1::TokenizeSpec& spec, const TokenizeSummary& summary) {
  if (spec.format() != "text" || spec.line_docs()) return "";
  if (summary.largest_document_bytes < kLineDocsHintBytes ||
      summary.largest_document_lines < kLineDocsHintLines) {
    return "";
  }
  return absl::StrCat("the document at ", summary.largest_document_where, " is ONE paragraph of ",
                      summary.largest_document_lines, " lines (", summary.largest_document_bytes,
                      " bytes): text documents end at blank lines; for one document per line use "
                      "--line-docs (line_docs: true)");
}

}  // namespace stemma::engine::data
