#include "worker/event_scanner.h"

#include <algorithm>
#include <charconv>
#include <string>
#include <utility>
#include <vector>

#include "common/engine_events.h"

namespace stemma::worker {
namespace {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

// A scanner over one line. Each Read* advances `i` past what it read and returns false on
// anything it does not take.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}

  void SkipSpace() {
    while (i_ < text_.size() && (text_[i_] == ' ' || text_[i_] == '\t' || text_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (i_ >= text_.size() || text_[i_] != c) return false;
    ++i_;
    return true;
  }
  bool AtEnd() {
    SkipSpace();
    return i_ == text_.size();
  }
  char Peek() {
    SkipSpace();
    return i_ < text_.size() ? text_[i_] : '\0';
  }
  // A string without escapes, control characters or bytes outside ASCII (the JSON reader
  // checks those, UTF-8 included).
  bool ReadString(std::string_view* out) {
    if (!Eat('"')) return false;
    const size_t from = i_;
    while (i_ < text_.size() && text_[i_] != '"') {
      const auto c = static_cast<unsigned char>(text_[i_]);
      if (c == '\\' || c < 0x20 || c >= 0x80) return false;
      ++i_;
    }
    if (i_ >= text_.size()) return false;
    *out = text_.substr(from, i_ - from);
    ++i_;
    return true;
  }
  bool ReadNumber(double* out) {
    SkipSpace();
    const size_t from = i_;
    while (i_ < text_.size() &&
           ((text_[i_] >= '0' && text_[i_] <= '9') || text_[i_] == '-' || text_[i_] == '+' ||
            text_[i_] == '.' || text_[i_] == 'e' || text_[i_] == 'E')) {
      ++i_;
    }
    const char* b = text_.data() + from;
    const char* e = text_.data() + i_;
    auto r = std::from_chars(b, e, *out);
    return b != e && r.ec == std::errc() && r.ptr == e;
  }
  // true, false or null: 1, 0 or -1 in `*out`.
  bool ReadLiteral(int* out) {
    SkipSpace();
    for (auto [word, value] :
         {std::pair{"true", 1}, std::pair{"false", 0}, std::pair{"null", -1}}) {
      const std::string_view w(word);
      if (text_.substr(i_, w.size()) == w) {
        i_ += w.size();
        *out = value;
        return true;
      }
    }
    return false;
  }

 private:
  std::string_view text_;
  size_t i_ = 0;
};

const FD* SchemaField(std::string_view key) {
  if (IsFlattenedEventField(key)) return nullptr;
  return v1::EngineEvent::descriptor()->FindFieldByName(std::string(key));
}

// A detail, unless the key is already one (a duplicate key: the JSON reader decides).
bool AddDetail(v1::EngineEvent* event, std::string_view key, pb::Value value) {
  auto* fields = event->mutable_details()->mutable_fields();
  return fields->try_emplace(std::string(key), std::move(value)).second;
}

// One "key": value pair.
bool ReadMember(Scanner& s, v1::EngineEvent* event,
                std::vector<std::pair<std::string_view, double>>* numbers) {
  std::string_view key;
  if (!s.ReadString(&key) || !s.Eat(':')) return false;
  const FD* f = SchemaField(key);
  const pb::Reflection* r = event->GetReflection();
  const char c = s.Peek();
  if (c == '"') {
    std::string_view text;
    if (!s.ReadString(&text)) return false;
    if (f == nullptr) {
      pb::Value v;
      v.set_string_value(std::string(text));
      return AddDetail(event, key, std::move(v));
    }
    if (f->is_repeated() || f->cpp_type() != FD::CPPTYPE_STRING) return false;
    if (!r->GetString(*event, f).empty()) return false;  // a duplicate key
    r->SetString(event, f, std::string(text));
    return true;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    double number = 0;
    if (!s.ReadNumber(&number)) return false;
    if (f == nullptr) {
      numbers->emplace_back(key, number);  // a series or a detail, once the event is known
      return true;
    }
    if (f->is_repeated() || f->cpp_type() != FD::CPPTYPE_DOUBLE || r->HasField(*event, f)) {
      return false;
    }
    r->SetDouble(event, f, number);
    return true;
  }
  int literal = 0;
  if (f != nullptr || !s.ReadLiteral(&literal)) return false;  // objects, arrays: the DOM's
  pb::Value v;
  if (literal < 0) {
    v.set_null_value(pb::NULL_VALUE);
  } else {
    v.set_bool_value(literal == 1);
  }
  return AddDetail(event, key, std::move(v));
}

}  // namespace

bool ScanEngineEvent(std::string_view text, v1::EngineEvent* event) {
  event->Clear();
  Scanner s(text);
  std::vector<std::pair<std::string_view, double>> numbers;
  if (!s.Eat('{')) return false;
  if (s.Peek() == '}') {
    s.Eat('}');
  } else {
    do {
      if (!ReadMember(s, event, &numbers)) return false;
    } while (s.Eat(','));
    if (!s.Eat('}')) return false;
  }
  if (!s.AtEnd()) return false;
  // The numbers the schema does not name: a step event's series (sorted by name, as the
  // reader sorts them), any other event's details.
  std::sort(numbers.begin(), numbers.end());
  for (size_t k = 0; k < numbers.size(); ++k) {
    const auto& [key, value] = numbers[k];
    if (k > 0 && numbers[k - 1].first == key) return false;  // a duplicate key
    if (event->event() == "step") {
      if (event->has_details() && event->details().fields().contains(std::string(key))) {
        return false;
      }
      v1::EngineEvent::Series* series = event->add_series();
      series->set_name(std::string(key));
      series->set_value(value);
    } else {
      pb::Value v;
      v.set_number_value(value);
      if (!AddDetail(event, key, std::move(v))) return false;
    }
  }
  return true;
}

}  // namespace stemma::worker
