#include "coordinator/wiring.h"

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status.h"

namespace stemma::coordinator {
namespace {

namespace pb = google::protobuf;

absl::Status WireMessage(
    pb::Message* m,
    const std::function<const pb::Map<std::string, std::string>*(const std::string&)>& outputs_of,
    const std::string& self_id) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  auto wire = [&](const std::string& value, std::string* out) -> absl::Status {
    *out = value;
    size_t pos = 0;
    while ((pos = out->find("${{ ", pos)) != std::string::npos) {
      const size_t close = out->find(" }}", pos);
      if (close == std::string::npos) return absl::OkStatus();
      const std::string inner = out->substr(pos + 4, close - pos - 4);
      if (inner == "self.id" && !self_id.empty()) {
        out->replace(pos, close + 3 - pos, self_id);
        pos += self_id.size();
        continue;
      }
      const size_t dot = inner.rfind(".outputs.");
      if (dot == std::string::npos) {
        pos = close + 3;
        continue;
      }
      const std::string job = inner.substr(0, dot), name = inner.substr(dot + 9);
      const pb::Map<std::string, std::string>* outputs = outputs_of(job);
      if (outputs == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("reads an output of ", job, ", which is not one of its dependencies"));
      }
      auto it = outputs->find(name);
      if (it == outputs->end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(job, " succeeded without reporting its '", name, "' output"));
      }
      out->replace(pos, close + 3 - pos, it->second);
      pos += it->second.size();
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_map()) continue;
      if (f->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, f); ++k)
          RETURN_IF_ERROR(WireMessage(r->MutableRepeatedMessage(m, f, k), outputs_of, self_id));
      } else if (r->HasField(*m, f)) {
        RETURN_IF_ERROR(WireMessage(r->MutableMessage(m, f), outputs_of, self_id));
      }
      continue;
    }
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING) continue;
    std::string wired;
    if (f->is_repeated()) {
      for (int k = 0; k < r->FieldSize(*m, f); ++k) {
        const std::string v = r->GetRepeatedString(*m, f, k);
        if (v.find("${{ ") == std::string::npos) continue;
        RETURN_IF_ERROR(wire(v, &wired));
        r->SetRepeatedString(m, f, k, wired);
      }
    } else {
      const std::string v = r->GetString(*m, f);
      if (v.find("${{ ") == std::string::npos) continue;
      RETURN_IF_ERROR(wire(v, &wired));
      r->SetString(m, f, wired);
    }
  }
  return absl::OkStatus();
}

// The job of the first wiring token in `value` that names a job in `pruned`, or "".
std::string PrunedTokenIn(const std::string& value, const std::set<std::string>& pruned) {
  size_t pos = 0;
  while ((pos = value.find("${{ ", pos)) != std::string::npos) {
    const size_t close = value.find(" }}", pos);
    if (close == std::string::npos) return "";
    const std::string inner = value.substr(pos + 4, close - pos - 4);
    const size_t dot = inner.rfind(".outputs.");
    if (dot != std::string::npos && pruned.count(inner.substr(0, dot)) > 0)
      return inner.substr(0, dot);
    pos = close + 3;
  }
  return "";
}

// kItem: `m` reads a pruned job outside any list of its own (so `m`, as a list item, goes);
// kEmptied: a list lost every item.
enum class PruneResult { kKeep, kItem, kEmptied };

PruneResult PruneMessage(pb::Message* m, const std::set<std::string>& pruned, std::string* which) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  PruneResult result = PruneResult::kKeep;
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_map()) continue;
    if (f->is_repeated()) {
      const int n = r->FieldSize(*m, f);
      if (n == 0 || (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE &&
                     f->cpp_type() != pb::FieldDescriptor::CPPTYPE_STRING)) {
        continue;
      }
      // Keep the items that read no pruned job, in order.
      int kept = 0;
      for (int k = 0; k < n; ++k) {
        bool drop = false;
        if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
          PruneResult sub = PruneMessage(r->MutableRepeatedMessage(m, f, k), pruned, which);
          if (sub == PruneResult::kEmptied) return sub;
          drop = sub == PruneResult::kItem;
        } else {
          const std::string job = PrunedTokenIn(r->GetRepeatedString(*m, f, k), pruned);
          if (!job.empty()) {
            drop = true;
            if (which->empty()) *which = job;
          }
        }
        if (drop) continue;
        if (kept != k) r->SwapElements(m, f, kept, k);
        ++kept;
      }
      while (r->FieldSize(*m, f) > kept) r->RemoveLast(m, f);
      if (kept == 0) return PruneResult::kEmptied;
      continue;
    }
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!r->HasField(*m, f)) continue;
      PruneResult sub = PruneMessage(r->MutableMessage(m, f), pruned, which);
      if (sub == PruneResult::kEmptied) return sub;
      if (sub == PruneResult::kItem) result = sub;
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
      const std::string job = PrunedTokenIn(r->GetString(*m, f), pruned);
      if (!job.empty()) {
        if (which->empty()) *which = job;
        result = PruneResult::kItem;
      }
    }
  }
  return result;
}

}  // namespace

// The message whose strings are wired: the engine spec, or an exec job's argv, inputs, code
// and output paths (issue 23); null for noop.
static pb::Message* WiredMessageOf(v1::JobSpec* spec) {
  if (spec->has_exec()) return spec->mutable_exec();
  return MutableEngineSpecOf(spec);
}

bool DropReadsOf(v1::JobSpec* spec, const std::set<std::string>& pruned, std::string* pruned_read) {
  pb::Message* engine = WiredMessageOf(spec);
  if (engine == nullptr) return true;  // noop: order only
  std::string which;
  const PruneResult r = PruneMessage(engine, pruned, &which);
  if (r == PruneResult::kKeep) return true;
  *pruned_read = which.empty() ? *pruned.begin() : which;
  return false;
}

absl::Status WireInputs(
    v1::JobSpec* spec,
    const std::function<const pb::Map<std::string, std::string>*(const std::string&)>& outputs_of,
    const std::string& self_id) {
  pb::Message* engine = WiredMessageOf(spec);
  if (engine == nullptr) return absl::OkStatus();
  return WireMessage(engine, outputs_of, self_id);
}

}  // namespace stemma::coordinator
