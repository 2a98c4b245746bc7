#include "engine/data/loader.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace stemma::engine::data {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// SplitMix64's finalizer: a bijective mix of 64 bits.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The counter-th value of the SplitMix64 stream keyed by `key`.
uint64_t Random(uint64_t key, uint64_t counter) { return Mix64(key + (counter + 1) * kGolden); }

double UniformDouble(uint64_t r) { return static_cast<double>(r >> 11) * 0x1.0p-53; }

// Uniform in [0, n) by multiply-shift (Lemire), the same on every platform.
uint64_t UniformBelow(uint64_t r, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

uint64_t MixtureKey(uint64_t seed) { return Mix64(seed ^ 0x6d69787475726531ULL); }
uint64_t ShuffleKey(uint64_t seed, size_t dataset, int64_t epoch) {
  return Mix64(Mix64(Mix64(seed ^ 0x73687566666c6531ULL) + dataset) + static_cast<uint64_t>(epoch));
}

uint64_t HashTokens(std::span<const int32_t> tokens) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 over the little-endian bytes
  for (int32_t t : tokens) {
    uint32_t u = static_cast<uint32_t>(t);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

template <typename T>
absl::StatusOr<T> Field(const nlohmann::json& j, const std::string& name,
                        const std::string& prefix = "loader state") {
  if (!j.is_object()) return absl::InvalidArgumentError(prefix + ": not a JSON object");
  auto it = j.find(name);
  if (it == j.end()) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, ": field '", name, "' missing"));
  }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, ": field '", name, "' has the wrong type (", it->type_name(), ")"));
  }
}

}  // namespace

bool IsHeldOut(std::span<const int32_t> tokens, double fraction, uint64_t seed) {
  if (fraction <= 0) return false;
  return UniformDouble(Mix64(HashTokens(tokens) ^ seed)) < fraction;
}

absl::StatusOr<std::vector<double>> TemperatureProbabilities(const std::vector<double>& sizes,
                                                             double temperature) {
  if (!(temperature > 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be positive and finite, got ", temperature));
  }
  std::vector<double> p(sizes.size());
  double sum = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!(sizes[i] >= 0)) {
      return absl::InvalidArgumentError(absl::StrCat("dataset size ", i, " is ", sizes[i]));
    }
    p[i] = std::pow(sizes[i], 1.0 / temperature);
    sum += p[i];
  }
  if (!(sum > 0)) return absl::InvalidArgumentError("all dataset sizes are zero");
  for (double& x : p) x /= sum;
  return p;
}

int64_t FirstHeldOutByPosition(int64_t num_documents, double fraction) {
  if (fraction <= 0) return num_documents;
  const auto held =
      static_cast<int64_t>(std::ceil(fraction * static_cast<double>(num_documents) - 1e-9));
  return num_documents - std::min(held, num_documents);
}

absl::StatusOr<MixtureSpec> OpenMixture(const v1::TrainData& data) {
  MixtureSpec spec;
  if (data.datasets_size() == 0) return absl::InvalidArgumentError("data.datasets: no datasets");
  if (data.has_temperature()) spec.temperature = data.temperature();
  for (const auto& [family, weight] : data.family_weights()) spec.family_weights[family] = weight;
  bool any_weight = false;
  for (const auto& d : data.datasets()) any_weight |= d.has_weight();
  auto open = [](const std::string& path,
                 const std::string& field) -> absl::StatusOr<std::shared_ptr<const Dataset>> {
    auto ds = Dataset::Open(path);
    if (!ds.ok())
      return absl::Status(ds.status().code(), absl::StrCat(field, ": ", ds.status().message()));
    return std::shared_ptr<const Dataset>(std::move(*ds));
  };
  for (int i = 0; i < data.datasets_size(); ++i) {
    const v1::TrainDataset& d = data.datasets(i);
    const std::string prefix = absl::StrCat("data.datasets[", i, "]");
    MixtureComponent c;
    if (d.has_weight()) {
      c.weight = d.weight();
    } else if (!any_weight && !spec.temperature.has_value()) {
      c.weight = 1.0;  // no weights anywhere: equal shares
    }
    c.family = d.family();
    ASSIGN_OR_RETURN(c.dataset, open(d.path(), prefix + ".path"));
    if (!d.heldout_path().empty()) {
      ASSIGN_OR_RETURN(c.heldout, open(d.heldout_path(), prefix + ".heldout_path"));
    }
    spec.components.push_back(std::move(c));
  }
  return spec;
}

nlohmann::json LoaderState::ToJson() const {
  nlohmann::json cs = nlohmann::json::array();
  for (const Cursor& c : cursors) {
    cs.push_back(
        {{"dir", c.dir}, {"epoch", c.epoch}, {"position", c.position}, {"offset", c.offset}});
  }
  return {{"seed", seed}, {"seq_len", seq_len}, {"draws", draws}, {"rows", rows}, {"cursors", cs}};
}

absl::StatusOr<LoaderState> LoaderState::FromJson(const nlohmann::json& j) {
  LoaderState s;
  ASSIGN_OR_RETURN(s.seed, Field<uint64_t>(j, "seed"));
  ASSIGN_OR_RETURN(s.seq_len, Field<int64_t>(j, "seq_len"));
  ASSIGN_OR_RETURN(s.draws, Field<uint64_t>(j, "draws"));
  ASSIGN_OR_RETURN(s.rows, Field<int64_t>(j, "rows"));
  ASSIGN_OR_RETURN(nlohmann::json cs, Field<nlohmann::json>(j, "cursors"));
  if (!cs.is_array()) return absl::InvalidArgumentError("loader state: 'cursors' is not an array");
  for (size_t i = 0; i < cs.size(); ++i) {
    std::string prefix = absl::StrCat("loader state: cursors[", i, "]");
    Cursor c;
    ASSIGN_OR_RETURN(c.dir, Field<std::string>(cs[i], "dir", prefix));
    ASSIGN_OR_RETURN(c.epoch, Field<int64_t>(cs[i], "epoch", prefix));
    ASSIGN_OR_RETURN(c.position, Field<int64_t>(cs[i], "position", prefix));
    ASSIGN_OR_RETURN(c.offset, Field<int64_t>(cs[i], "offset", prefix));
    s.cursors.push_back(std::move(c));
  }
  return s;
}

namespace {

// The sampling probability of each component: by temperature over the components' split
// sizes (within families when family weights are given), or the weights normalised.
absl::StatusOr<std::vector<double>> MixtureProbabilities(const MixtureSpec& spec,
                                                         const std::vector<double>& sizes) {
  std::vector<double> p;
  if (spec.temperature.has_value()) {
    for (const MixtureComponent& c : spec.components) {
      if (c.weight.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mixture: dataset ", c.dataset->dir(), " has a weight and the mixture a temperature"));
      }
    }
    if (spec.family_weights.empty()) {
      ASSIGN_OR_RETURN(p, TemperatureProbabilities(sizes, *spec.temperature));
    } else {
      std::set<std::string> families;
      double family_sum = 0;
      for (const MixtureComponent& c : spec.components) {
        auto it = spec.family_weights.find(c.family);
        if (it == spec.family_weights.end()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mixture: family '", c.family, "' of ", c.dataset->dir(), " has no family weight"));
        }
        if (!(it->second >= 0) || !std::isfinite(it->second)) {
          return absl::InvalidArgumentError(
              absl::StrCat("mixture: family weight of '", c.family, "' is ", it->second));
        }
        if (families.insert(c.family).second) family_sum += it->second;
      }
      for (const auto& [f, w] : spec.family_weights) {
        if (!families.contains(f)) {
          return absl::InvalidArgumentError(
              absl::StrCat("mixture: family weight '", f, "' matches no dataset"));
        }
      }
      if (!(family_sum > 0)) return absl::InvalidArgumentError("mixture: family weights sum to 0");
      p.assign(sizes.size(), 0.0);
      for (const std::string& f : families) {
        std::vector<size_t> members;
        std::vector<double> member_sizes;
        for (size_t i = 0; i < sizes.size(); ++i) {
          if (spec.components[i].family == f) {
            members.push_back(i);
            member_sizes.push_back(sizes[i]);
          }
        }
        ASSIGN_OR_RETURN(std::vector<double> inner,
                         TemperatureProbabilities(member_sizes, *spec.temperature));
        for (size_t k = 0; k < members.size(); ++k) {
          p[members[k]] = spec.family_weights.at(f) / family_sum * inner[k];
        }
      }
    }
  } else {
    if (!spec.family_weights.empty()) {
      return absl::InvalidArgumentError("mixture: family weights need a temperature");
    }
    double sum = 0;
    for (const MixtureComponent& c : spec.components) {
      if (!c.weight.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "mixture: dataset ", c.dataset->dir(), " has no weight and there is no temperature"));
      }
      if (!(*c.weight >= 0) || !std::isfinite(*c.weight)) {
        return absl::InvalidArgumentError(
            absl::StrCat("mixture: weight of ", c.dataset->dir(), " is ", *c.weight));
      }
      p.push_back(*c.weight);
      sum += *c.weight;
    }
    if (!(sum > 0)) return absl::InvalidArgumentError("mixture: weights sum to 0");
    for (double& x : p) x /= sum;
  }
  return p;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(MixtureSpec spec, LoaderOptions options) {
  if (options.seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be positive, got ", options.seq_len));
  }
  if (!(options.heldout_fraction >= 0 && options.heldout_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("heldout_fraction must be in [0, 1), got ", options.heldout_fraction));
  }
  if (spec.components.empty()) return absl::InvalidArgumentError("mixture: no datasets");
  std::unique_ptr<Loader> loader(new Loader());
  loader->options_ = options;
  for (const MixtureComponent& c : spec.components) {
    if (c.dataset == nullptr) return absl::InvalidArgumentError("mixture: a dataset is null");
    const TokenizerInfo& first = spec.components[0].dataset->tokenizer();
    for (const Dataset* ds : {c.dataset.get(), c.heldout.get()}) {
      if (ds == nullptr || ds->tokenizer().sha256 == first.sha256) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "mixture: ", ds->dir(), " was tokenized with ", ds->tokenizer().name, " (sha256 ",
          ds->tokenizer().sha256, "), ", spec.components[0].dataset->dir(), " with ", first.name,
          " (sha256 ", first.sha256, ")"));
    }
  }
  std::vector<double> sizes;
  std::vector<int32_t> buf;
  for (size_t i = 0; i < spec.components.size(); ++i) {
    const MixtureComponent& c = spec.components[i];
    Stream s;
    // With a separate held-out dataset, the held-out stream reads it whole and the training
    // stream all of the component's own dataset.
    const bool separate = c.heldout != nullptr;
    s.dataset = separate && options.split == Split::kHeldOut ? c.heldout : c.dataset;
    const Dataset& ds = *s.dataset;
    s.cursor.dir = ds.dir();
    int64_t split_tokens = 0;
    const int64_t first_last = FirstHeldOutByPosition(ds.num_documents(), options.heldout_fraction);
    for (int64_t d = 0; d < ds.num_documents(); ++d) {
      bool held = false;
      if (separate) {
        held = options.split == Split::kHeldOut;
      } else if (options.heldout_last) {
        held = d >= first_last;
      } else if (options.heldout_fraction > 0) {
        buf.resize(ds.document_size(d));
        ds.Read(ds.document_begin(d), buf);
        held = IsHeldOut(buf, options.heldout_fraction, options.split_seed);
      }
      if (held == (options.split == Split::kHeldOut)) {
        s.docs.push_back(d);
        split_tokens += ds.document_size(d);
      }
    }
    if (s.docs.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("dataset ", ds.dir(), ": no documents in the ",
                       options.split == Split::kTrain ? "training" : "held-out", " split (",
                       separate ? "a separate held-out dataset"
                                : absl::StrCat(options.heldout_last ? "last " : "hash, fraction ",
                                               options.heldout_fraction),
                       ")"));
    }
    s.insert_eos = !ds.eos_appended();
    if (s.insert_eos) {
      std::optional<int32_t> eos =
          options.eos_id.has_value() ? options.eos_id : ds.tokenizer().eos_id;
      if (!eos) {
        return absl::InvalidArgumentError(
            absl::StrCat("dataset ", ds.dir(), ": its tokenizer has no EOS id and none was given"));
      }
      s.eos = *eos;
    }
    s.epoch_tokens = split_tokens + (s.insert_eos ? static_cast<int64_t>(s.docs.size()) : 0);
    sizes.push_back(static_cast<double>(split_tokens));
    loader->streams_.push_back(std::move(s));
  }

  ASSIGN_OR_RETURN(loader->probabilities_, MixtureProbabilities(spec, sizes));
  const std::vector<double>& p = loader->probabilities_;
  double acc = 0;
  for (double x : p) loader->cumulative_.push_back(acc += x);
  loader->rows_per_component_.assign(p.size(), 0);
  for (size_t i = 0; i < loader->streams_.size(); ++i) loader->BuildOrder(i);
  return loader;
}

std::vector<int64_t> Loader::OrderFor(size_t i, int64_t epoch) const {
  std::vector<int64_t> order = streams_[i].docs;
  if (!options_.shuffle) return order;
  uint64_t key = ShuffleKey(options_.seed, i, epoch);
  for (size_t j = order.size(); j > 1; --j) {  // Fisher-Yates
    size_t k = UniformBelow(Random(key, j), j);
    std::swap(order[j - 1], order[k]);
  }
  return order;
}

void Loader::BuildOrder(size_t i) { streams_[i].order = OrderFor(i, streams_[i].cursor.epoch); }

size_t Loader::Draw() {
  double u = UniformDouble(Random(MixtureKey(options_.seed), draws_++));
  size_t i = std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin();
  // Rounding can leave the last cumulative value just under 1; fall back to the last
  // component with a positive probability.
  if (i >= cumulative_.size()) {
    i = cumulative_.size() - 1;
    while (i > 0 && probabilities_[i] == 0) --i;
  }
  return i;
}

void Loader::FillRow(size_t i, int32_t* out) {
  Stream& s = streams_[i];
  LoaderState::Cursor& c = s.cursor;
  int64_t need = options_.seq_len + 1;
  while (need > 0) {
    int64_t doc = s.order[c.position];
    int64_t size = s.dataset->document_size(doc);
    int64_t total = size + (s.insert_eos ? 1 : 0);
    if (c.offset < size) {
      int64_t take = std::min(need, size - c.offset);
      s.dataset->Read(s.dataset->document_begin(doc) + c.offset, std::span<int32_t>(out, take));
      out += take;
      need -= take;
      c.offset += take;
    } else {
      *out++ = s.eos;
      --need;
      ++c.offset;
    }
    if (c.offset == total) {
      c.offset = 0;
      if (++c.position == static_cast<int64_t>(s.order.size())) {
        c.position = 0;
        ++c.epoch;
        BuildOrder(i);
      }
    }
  }
}

std::vector<int32_t> Loader::NextBatch(int64_t batch_size) {
  const int64_t row = options_.seq_len + 1;
  std::vector<int32_t> batch(static_cast<size_t>(std::max<int64_t>(batch_size, 0) * row));
  for (int64_t b = 0; b < batch_size; ++b) {
    size_t i = Draw();
    FillRow(i, batch.data() + b * row);
    ++rows_per_component_[i];
    ++rows_;
  }
  return batch;
}

LoaderState Loader::state() const {
  LoaderState st;
  st.seed = options_.seed;
  st.seq_len = options_.seq_len;
  st.draws = draws_;
  st.rows = rows_;
  for (const Stream& s : streams_) st.cursors.push_back(s.cursor);
  return st;
}

absl::Status Loader::Restore(const LoaderState& state) {
  if (state.seed != options_.seed || state.seq_len != options_.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("loader state: seed ", state.seed, " / seq_len ",
                                                   state.seq_len, " differ from the loader's ",
                                                   options_.seed, " / ", options_.seq_len));
  }
  if (state.cursors.size() != streams_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("loader state: ", state.cursors.size(),
                                                   " cursors for ", streams_.size(), " datasets"));
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    const Stream& s = streams_[i];
    const LoaderState::Cursor& c = state.cursors[i];
    if (c.dir != s.cursor.dir) {
      return absl::InvalidArgumentError(absl::StrCat("loader state: cursors[", i, "] is for ",
                                                     c.dir, ", the loader's dataset is ",
                                                     s.cursor.dir));
    }
    if (c.epoch < 0 || c.position < 0 || c.position >= static_cast<int64_t>(s.docs.size()) ||
        c.offset < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("loader state: cursors[", i, "] is out of range"));
    }
    int64_t doc = OrderFor(i, c.epoch)[c.position];
    if (c.offset >= s.dataset->document_size(doc) + (s.insert_eos ? 1 : 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("loader state: cursors[", i, "].offset is past its document"));
    }
  }
  for (size_t i = 0; i < streams_.size(); ++i) {
    streams_[i].cursor = state.cursors[i];
    BuildOrder(i);
  }
  draws_ = state.draws;
  rows_ = state.rows;
  rows_per_component_.assign(streams_.size(), 0);
  return absl::OkStatus();
}

}  // namespace stemma::engine::data
