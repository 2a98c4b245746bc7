#include "cli/metrics_view.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/output.h"

namespace stemma::cli {
namespace {

std::string LabelsText(const v1::MetricPoint& p) {
  std::map<std::string, std::string> sorted(p.labels().begin(), p.labels().end());
  return absl::StrJoin(sorted, ";", absl::PairFormatter("="));
}

// RFC 4180: quote a field holding a comma, quote or newline.
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

bool LooksLikeJobId(const std::string& s) {
  uint64_t seq;
  return s.size() > 2 && s.rfind("j-", 0) == 0 && absl::SimpleAtoi(s.substr(2), &seq);
}

std::string FormatValue(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string HumanBytes(int64_t bytes) {
  if (bytes <= 0) return "-";
  const char* units = "BKMGTP";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%lldB", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f%c", v, units[u]);
  }
  return buf;
}

nlohmann::json MetricPointsToJson(const std::vector<v1::MetricPoint>& points) {
  nlohmann::json array = nlohmann::json::array();
  for (const auto& p : points) {
    nlohmann::json j = {
        {"job", p.job_id()},      {"cell", p.job_name()},   {"revision", p.revision()},
        {"attempt", p.attempt()}, {"name", p.name()},       {"step", p.step()},
        {"value", p.value()},     {"time_ms", p.time_ms()}, {"labels", nlohmann::json::object()}};
    for (const auto& [k, v] : p.labels()) j["labels"][k] = v;
    array.push_back(std::move(j));
  }
  return array;
}

std::string RenderMetricsCsv(const std::vector<v1::MetricPoint>& points) {
  std::string out = "job,attempt,name,step,value,time_ms,labels,cell,revision\n";
  for (const auto& p : points) {
    absl::StrAppend(&out, CsvField(p.job_id()), ",", p.attempt(), ",", CsvField(p.name()), ",",
                    p.step(), ",", FormatValue(p.value()), ",", p.time_ms(), ",",
                    CsvField(LabelsText(p)), ",", CsvField(p.job_name()), ",", p.revision(), "\n");
  }
  return out;
}

std::string RenderMetricsTable(const std::vector<v1::MetricPoint>& points, bool wide) {
  std::vector<std::string> header = {"JOB", "CELL", "STEP", "NAME", "VALUE"};
  if (wide) header.insert(header.end(), {"REVISION", "ATTEMPT", "LABELS", "TIME"});
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : points) {
    std::vector<std::string> row = {p.job_id(), p.job_name().empty() ? "-" : p.job_name(),
                                    absl::StrCat(p.step()), p.name(), FormatValue(p.value())};
    if (wide) {
      row.push_back(p.revision() > 0 ? absl::StrCat(p.revision()) : "-");
      row.push_back(absl::StrCat(p.attempt()));
      row.push_back(LabelsText(p).empty() ? "-" : LabelsText(p));
      row.push_back(FormatTimestamp(p.time_ms()));
    }
    rows.push_back(std::move(row));
  }
  return RenderTable(header, rows);
}

std::string RenderLastValues(const std::vector<v1::MetricPoint>& points) {
  std::vector<std::string> parts;
  for (const auto& p : points) {
    parts.push_back(absl::StrCat(p.name(), " ", FormatValue(p.value()), " @ step ", p.step()));
  }
  return TerminalSafe(absl::StrJoin(parts, ", "));
}

std::vector<std::string> MeasuredLines(const v1::Artifact& a) {
  std::vector<std::string> lines;
  if (a.measured().empty()) {
    // Recorded before measurements were kept per job: the latest value of each name.
    std::map<std::string, double> metrics(a.metrics().begin(), a.metrics().end());
    std::vector<std::string> m;
    for (const auto& [k, v] : metrics) m.push_back(k + "=" + FormatValue(v));
    if (!m.empty()) lines.push_back("latest (no job recorded): " + absl::StrJoin(m, " "));
    return lines;
  }
  std::vector<std::string> order;  // jobs, in the order they measured
  std::map<std::string, std::vector<const v1::MeasuredMetric*>> by_job;
  for (const auto& m : a.measured()) {
    if (!by_job.count(m.job_id())) order.push_back(m.job_id());
    by_job[m.job_id()].push_back(&m);
  }
  for (const std::string& job : order) {
    const auto& ms = by_job[job];
    std::vector<std::string> parts;
    for (const auto* m : ms) parts.push_back(m->name() + "=" + FormatValue(m->value()));
    const std::string name = ms[0]->job_name();
    lines.push_back(TerminalSafe(
        absl::StrCat(job, name.empty() ? "" : " " + name, ": ", absl::StrJoin(parts, " "))));
  }
  return lines;
}

nlohmann::json ArtifactToJson(const v1::Artifact& artifact) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string text;
  (void)google::protobuf::util::MessageToJsonString(artifact, &text, options);
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string RenderArtifactsTable(const std::vector<v1::Artifact>& artifacts, bool wide,
                                 int64_t now_ms) {
  std::vector<std::string> header = {"ID",   "NAME",  "TYPE", "JOB", "EXPERIMENT",
                                     "SIZE", "CHECK", "AGE",  "PATH"};
  if (wide) header.insert(header.end(), {"SHA256", "PARENTS", "PIN"});
  std::vector<std::vector<std::string>> rows;
  for (const auto& a : artifacts) {
    std::string check = a.state() == v1::ARTIFACT_DELETED
                            ? "deleted"
                            : absl::AsciiStrToLower(v1::Verification_Name(a.verification()));
    std::vector<std::string> row = {a.id(),
                                    a.name().empty() ? "-" : a.name(),
                                    a.type(),
                                    a.job_id().empty() ? "(external)" : a.job_id(),
                                    a.experiment().empty() ? "-" : a.experiment(),
                                    HumanBytes(a.bytes()),
                                    check,
                                    HumanAge(a.created_ms(), now_ms),
                                    a.path()};
    if (wide) {
      row.push_back(a.manifest_sha256().empty() ? "-" : a.manifest_sha256().substr(0, 12));
      row.push_back(a.parents().empty() ? "-" : absl::StrJoin(a.parents(), ","));
      row.push_back(a.pinned() ? "yes" : "-");
    }
    rows.push_back(std::move(row));
  }
  return RenderTable(header, rows);
}

std::string RenderLineageTree(const v1::LineageResponse& lineage) {
  if (lineage.artifacts().empty()) return "";
  absl::flat_hash_map<std::string, const v1::Artifact*> by_id;
  for (const auto& a : lineage.artifacts()) by_id[a.id()] = &a;
  auto label = [](const v1::Artifact& a) {
    std::string what =
        a.external() ? "external"
                     : absl::StrCat(a.operation().empty() ? "?" : a.operation(), ", ", a.job_id());
    return TerminalSafe(absl::StrCat(a.id(), " ", a.name().empty() ? "" : a.name() + " ", "(", what,
                                     ") ", a.path()));
  };
  std::string out = label(lineage.artifacts(0)) + "\n";
  std::set<std::string> printed = {lineage.artifacts(0).id()};
  std::function<void(const v1::Artifact&, const std::string&)> walk =
      [&](const v1::Artifact& a, const std::string& prefix) {
        for (int i = 0; i < a.parents_size(); ++i) {
          const bool last = i + 1 == a.parents_size();
          absl::StrAppend(&out, prefix, last ? "└── " : "├── ");
          auto it = by_id.find(a.parents(i));
          if (it == by_id.end()) {
            absl::StrAppend(&out, a.parents(i), " (beyond --depth)\n");
            continue;
          }
          if (!printed.insert(it->second->id()).second) {
            absl::StrAppend(&out, it->second->id(), " (see above)\n");
            continue;
          }
          absl::StrAppend(&out, label(*it->second), "\n");
          walk(*it->second, prefix + (last ? "    " : "│   "));
        }
      };
  walk(lineage.artifacts(0), "");
  return out;
}

}  // namespace stemma::cli
