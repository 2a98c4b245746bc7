// ForEachParquetString (engine/data/text_input.h) through Apache Arrow's Parquet reader, built
// when CMake found the pyarrow wheel's headers and libraries (STEMMA_HAVE_PARQUET); without
// them the function says how to get a build that reads Parquet.
#include "absl/strings/str_cat.h"
#include "engine/data/text_input.h"

#if STEMMA_HAVE_PARQUET
#include <arrow/array.h>
#include <arrow/io/file.h>
#include <arrow/table.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#endif

namespace stemma::engine::data {

#if STEMMA_HAVE_PARQUET
namespace {

absl::Status FromArrow(const arrow::Status& s, const std::string& path) {
  if (s.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", s.ToString()));
}

std::string ColumnNames(const arrow::Schema& schema) {
  std::string names;
  for (const auto& f : schema.fields())
    absl::StrAppend(&names, names.empty() ? "" : ", ", f->name());
  return names;
}

// Every value of one chunk of the column; `row` counts rows across chunks and row groups.
template <typename Array>
absl::Status EachValue(const Array& array, int64_t* row,
                       const std::function<absl::Status(std::string_view, int64_t)>& fn) {
  for (int64_t i = 0; i < array.length(); ++i) {
    ++*row;
    if (array.IsNull(i)) continue;
    const auto view = array.GetView(i);
    absl::Status s = fn(std::string_view(view.data(), view.size()), *row);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

bool ParquetSupported() { return true; }

absl::Status ForEachParquetString(
    const std::string& path, const std::string& column,
    const std::function<absl::Status(std::string_view, int64_t)>& fn) {
  auto file = arrow::io::ReadableFile::Open(path);
  if (!file.ok()) return absl::NotFoundError(absl::StrCat(path, ": ", file.status().ToString()));
  std::unique_ptr<parquet::arrow::FileReader> reader;
  try {
    auto opened = parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
    if (!opened.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a Parquet file (", opened.status().ToString(), ")"));
    }
    reader = std::move(*opened);
  } catch (const parquet::ParquetException& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a Parquet file (", e.what(), ")"));
  }
  std::shared_ptr<arrow::Schema> schema;
  if (absl::Status s = FromArrow(reader->GetSchema(&schema), path); !s.ok()) return s;
  const int index = schema->GetFieldIndex(column);
  if (index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no column '", column, "' (columns: ", ColumnNames(*schema), ")"));
  }
  const arrow::Type::type type = schema->field(index)->type()->id();
  if (type != arrow::Type::STRING && type != arrow::Type::LARGE_STRING &&
      type != arrow::Type::STRING_VIEW) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": column '", column, "' is ",
                                                   schema->field(index)->type()->ToString(),
                                                   ", not a string column"));
  }
  int64_t row = 0;
  for (int g = 0; g < reader->num_row_groups(); ++g) {
    auto table = reader->ReadRowGroup(g, std::vector<int>{index});
    if (!table.ok()) return FromArrow(table.status(), path);
    for (const std::shared_ptr<arrow::Array>& chunk : (*table)->column(0)->chunks()) {
      absl::Status s;
      if (type == arrow::Type::STRING) {
        s = EachValue(static_cast<const arrow::StringArray&>(*chunk), &row, fn);
      } else if (type == arrow::Type::LARGE_STRING) {
        s = EachValue(static_cast<const arrow::LargeStringArray&>(*chunk), &row, fn);
      } else {
        s = EachValue(static_cast<const arrow::StringViewArray&>(*chunk), &row, fn);
      }
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

#else

bool ParquetSupported() { return false; }

absl::Status ForEachParquetString(const std::string& path, const std::string&,
                                  const std::function<absl::Status(std::string_view, int64_t)>&) {
  return absl::UnimplementedError(absl::StrCat(
      path,
      ": this stemma-engine was built without the Parquet reader (pyarrow was not found in "
      "the build's Python venv; `scripts/setup --engine` installs it, then rebuild)"));
}

#endif

}  // namespace stemma::engine::data
