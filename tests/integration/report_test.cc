// `stemma report` through real processes and a real browser (docs/report.md):
// - ReportBrowser: the HTML page of a report with every kind of plot, loaded by headless
//   Chromium from a file URL: it renders (the screenshot has many colours and ink), every
//   plot's <svg> is in the DOM Chromium built, the page names no URL, and Chromium's own
//   network log shows no request made for the page; with every host name unresolvable the
//   page renders all the same. Controls show the checks can fail: a page with an external
//   image is caught by the network-log check, and the same image under the report's
//   Content-Security-Policy is not fetched.
// - ReportEndToEnd: a small study of real stemma-engine jobs (prepare, init, tokenize, train,
//   analyze, eval)
//   on a real coordinator and worker; the report is taken while the study runs (cells
//   pending) and when it has finished, and its numbers are those the engine reported.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cli/report/report_model.h"
#include "cli/report/report_writers.h"
#include "tests/integration/cluster.h"

namespace stemma::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
namespace report = ::stemma::cli::report;

// --- A small PNG reader: enough for Chromium's screenshots (8-bit RGB/RGBA, no interlace) --

struct Image {
  int width = 0, height = 0;
  std::vector<uint32_t> pixels;  // 0xRRGGBB
  std::string error;
};

uint32_t Be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (p[1] << 16) | (p[2] << 8) | p[3];
}

Image ReadPng(const std::string& path) {
  Image img;
  const std::string data = Cluster::ReadFile(path);
  const auto* d = reinterpret_cast<const unsigned char*>(data.data());
  if (data.size() < 8 || data.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    img.error = "not a PNG";
    return img;
  }
  int depth = 0, color = 0, interlace = 0;
  std::string idat;
  for (size_t at = 8; at + 12 <= data.size();) {
    const uint32_t len = Be32(d + at);
    const std::string type = data.substr(at + 4, 4);
    if (at + 12 + len > data.size()) break;
    const unsigned char* body = d + at + 8;
    if (type == "IHDR") {
      img.width = static_cast<int>(Be32(body));
      img.height = static_cast<int>(Be32(body + 4));
      depth = body[8];
      color = body[9];
      interlace = body[12];
    } else if (type == "IDAT") {
      idat.append(reinterpret_cast<const char*>(body), len);
    }
    at += 12 + len;
  }
  const int channels = color == 2 ? 3 : color == 6 ? 4 : 0;
  if (depth != 8 || channels == 0 || interlace != 0 || img.width <= 0 || img.height <= 0) {
    img.error = "unsupported PNG (depth " + std::to_string(depth) + ", colour type " +
                std::to_string(color) + ")";
    return img;
  }
  const size_t stride = static_cast<size_t>(img.width) * channels;
  std::vector<unsigned char> raw((stride + 1) * img.height);
  uLongf raw_size = raw.size();
  if (uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      raw_size != raw.size()) {
    img.error = "IDAT does not inflate to the image size";
    return img;
  }
  std::vector<unsigned char> prev(stride, 0), cur(stride);
  for (int y = 0; y < img.height; ++y) {
    const unsigned char filter = raw[y * (stride + 1)];
    const unsigned char* in = &raw[y * (stride + 1) + 1];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= static_cast<size_t>(channels) ? cur[x - channels] : 0;
      const int b = prev[x];
      const int c = x >= static_cast<size_t>(channels) ? prev[x - channels] : 0;
      int pred = 0;
      switch (filter) {
        case 0:
          pred = 0;
          break;
        case 1:
          pred = a;
          break;
        case 2:
          pred = b;
          break;
        case 3:
          pred = (a + b) / 2;
          break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default:
          img.error = "bad filter";
          return img;
      }
      cur[x] = static_cast<unsigned char>(in[x] + pred);
    }
    for (int x = 0; x < img.width; ++x) {
      const unsigned char* px = &cur[x * channels];
      img.pixels.push_back((uint32_t{px[0]} << 16) | (px[1] << 8) | px[2]);
    }
    std::swap(prev, cur);
  }
  return img;
}

// --- Chromium ------------------------------------------------------------------------------

std::string FindChromium() {
  for (const char* p :
       {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct Browser {
  std::string binary;
  std::string dir;  // profiles and outputs
  int runs = 0;

  // Runs headless Chromium on `url` with `flags`; its stdout. HOME is `dir`: Chromium writes
  // ~/.config/chromium (crash reports) whatever its --user-data-dir.
  std::string Run(const std::string& url, const std::string& flags) {
    const std::string profile = dir + "/profile-" + std::to_string(runs++);
    const std::string cmd =
        "HOME=" + Quote(dir) + " timeout 120 " + Quote(binary) +
        " --headless --disable-gpu --no-sandbox --no-first-run --disable-background-networking"
        " --disable-component-update --disable-sync --disable-extensions --user-data-dir=" +
        Quote(profile) + " " + flags + " " + Quote(url) + " 2>/dev/null";
    return RunShell(cmd);
  }
};

// URLs of requests Chromium made on behalf of a file:// page (its network log marks them
// with the page's file:// isolation key; the browser's own background requests have none).
std::vector<std::string> PageRequests(const std::string& netlog_path) {
  std::string text = Cluster::ReadFile(netlog_path);
  json log = json::parse(text, nullptr, false);
  if (log.is_discarded()) {
    // A log cut short at exit lacks its closing brackets.
    while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
    log = json::parse(text + "]}", nullptr, false);
  }
  std::vector<std::string> urls;
  if (log.is_discarded() || !log.contains("events")) {
    ADD_FAILURE() << netlog_path << ": the network log does not parse";
    return urls;
  }
  for (const json& e : log["events"]) {
    if (!e.contains("params") || !e["params"].is_object()) continue;
    const json& p = e["params"];
    if (!p.contains("url") || !p["url"].is_string() || !p.contains("network_isolation_key"))
      continue;
    const std::string key =
        p["network_isolation_key"].is_string() ? p["network_isolation_key"].get<std::string>() : "";
    const std::string url = p["url"];
    if (key.find("file://") != std::string::npos && url.rfind("file:", 0) != 0) urls.push_back(url);
  }
  return urls;
}

// Checks a screenshot is a rendered page, not a blank one: many colours and some ink.
void ExpectRendered(const std::string& png, const std::string& what) {
  ASSERT_TRUE(fs::exists(png)) << what << ": no screenshot";
  Image img = ReadPng(png);
  ASSERT_EQ(img.error, "") << what;
  ASSERT_GT(img.width, 0);
  std::set<uint32_t> colours;
  int64_t ink = 0;
  for (uint32_t p : img.pixels) {
    if (colours.size() < 4096) colours.insert(p);
    ink += p != img.pixels[0] ? 1 : 0;
  }
  EXPECT_GE(colours.size(), 16u) << what << ": the page looks blank";
  EXPECT_GT(static_cast<double>(ink) / img.pixels.size(), 0.02) << what << ": almost nothing drawn";
}

// The HTML checks of a report page (the file) in a real browser.
void CheckInBrowser(const std::string& html_path, int plots) {
  const std::string chromium = FindChromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (scripts/setup installs it)";
  const std::string html = Cluster::ReadFile(html_path);
  // The page names nothing elsewhere: outside the CSP meta there is no URL-like text at all.
  const size_t csp_end = html.find('>', html.find("Content-Security-Policy"));
  ASSERT_NE(csp_end, std::string::npos) << "no Content-Security-Policy meta";
  const std::string rest = html.substr(csp_end);
  for (const char* bad :
       {"http://", "https://", "//", "src=", "url(", "<script", "<link", "@import"}) {
    EXPECT_EQ(rest.find(bad), std::string::npos) << "the page contains " << bad;
  }
  Browser b{chromium, fs::path(html_path).parent_path().string() + "/browser"};
  fs::create_directories(b.dir);
  const std::string url = "file://" + fs::absolute(html_path).string();
  const std::string shot = b.dir + "/report.png", netlog = b.dir + "/report.netlog";
  b.Run(url,
        "--window-size=1400,2400 --screenshot=" + Quote(shot) + " --log-net-log=" + Quote(netlog));
  ExpectRendered(shot, "report.html");
  EXPECT_TRUE(PageRequests(netlog).empty())
      << "the page made a request: " << PageRequests(netlog)[0];
  // The DOM Chromium built holds every plot.
  const std::string dom = b.Run(url, "--dump-dom");
  int svgs = 0;
  for (size_t p = dom.find("<svg"); p != std::string::npos; p = dom.find("<svg", p + 1)) ++svgs;
  EXPECT_EQ(svgs, plots) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("<table class=\"results\">"), std::string::npos);
  // With every host name unresolvable the page is the same.
  const std::string offline = b.dir + "/offline.png";
  b.Run(url, "--window-size=1400,2400 --screenshot=" + Quote(offline) +
                 " --host-resolver-rules=" + Quote("MAP * ~NOTFOUND"));
  ExpectRendered(offline, "report.html with no name resolution");

  // Controls: an external image is seen by the network-log check; under the report's CSP
  // the browser does not fetch it.
  const std::string dir = b.dir;
  std::ofstream(dir + "/leaky.html") << "<!DOCTYPE html><html><body><h1>x</h1><img "
                                        "src=\"http://report-test.invalid/x.png\"></body></html>";
  std::ofstream(dir + "/guarded.html")
      << "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" content=\""
      << report::kHtmlCsp << "\"></head><body><h1>x</h1>"
      << "<img src=\"http://report-test.invalid/x.png\"></body></html>";
  b.Run("file://" + dir + "/leaky.html",
        "--dump-dom --log-net-log=" + Quote(dir + "/leaky.netlog"));
  b.Run("file://" + dir + "/guarded.html",
        "--dump-dom --log-net-log=" + Quote(dir + "/guarded.netlog"));
  const auto leaky = PageRequests(dir + "/leaky.netlog");
  EXPECT_FALSE(leaky.empty()) << "the network-log check missed an external image";
  EXPECT_TRUE(PageRequests(dir + "/guarded.netlog").empty()) << "the CSP let a fetch through";
}

int DrawnPlots(const report::Report& r) {
  int n = 0;
  for (const auto& p : r.plots) n += p.omitted.empty() ? 1 : 0;
  return n;
}

// A report with every kind of plot, from made-up numbers.
report::Report FullReport() {
  report::ReportInput in;
  in.experiment = "browser-check";
  in.revision = 1;
  int id = 1;
  auto eval = [&](const std::string& name, double ru, double en,
                  std::map<std::string, std::string> coords = {}) {
    report::Cell c;
    c.job_name = name;
    c.stage = name.substr(0, name.find('['));
    c.kind = "eval";
    c.job_id = c.metrics_job = "j-" + std::to_string(id++);
    c.state = "SUCCEEDED";
    c.coords = std::move(coords);
    in.cells.push_back(c);
    for (const auto& [n, v, l] : {std::tuple{"bpb/ru", ru, "ru"},
                                  {"bpb/en", en, "en"},
                                  {"acc/belebele_ru", 1 / ru, "ru"}}) {
      report::Point p;
      p.name = n;
      p.value = v;
      p.language = l;
      in.points[c.job_id].push_back(p);
    }
  };
  eval("eval-base", 3.0, 2.0);
  eval("eval-dense", 2.0, 2.6);
  eval("eval-freeze", 2.4, 2.2);
  for (const char* range : {"middle", "outer"}) {
    for (double a : {0.0, 0.5, 1.0}) {
      eval(std::string("eval-interp[range=") + range + ",alpha=" + std::to_string(a) + "]", 3 - a,
           2 + a * (range[0] == 'm' ? 0.1 : 0.5), {{"range", range}, {"alpha", std::to_string(a)}});
    }
  }
  report::Cell train;
  train.job_name = "cpt-dense";
  train.kind = "train";
  train.job_id = train.metrics_job = "j-99";
  train.state = "SUCCEEDED";
  in.cells.push_back(train);
  for (int s = 0; s < 20; ++s) {
    report::Point p;
    p.name = "loss";
    p.step = s;
    p.value = 5 * std::exp(-s / 8.0) + 1;
    in.points["j-99"].push_back(p);
  }
  report::Cell analyze;
  analyze.job_name = "analyze";
  analyze.kind = "analyze";
  in.cells.push_back(analyze);
  in.analyses.push_back({"analyze", "mask", "neuron_mask.json",
                         json::parse(R"({"counts": {"ru": [1, 4, 9, 3], "en": [2, 3, 5, 8]}})")});
  in.analyses.push_back({"analyze", "routing", "routing.json", json::parse(R"({"layers": [
      {"layer": 0, "mean_jsd": 0.05, "entropy": {"ru": 1.3, "en": 1.35}}, {"layer": 1, "mean_jsd": 0.2, "entropy": {"ru": 0.9, "en": 1.2}}]})")});
  in.analyses.push_back({"analyze", "drift", "drift.json", json::parse(R"({"layers": [
      {"layer": 0, "gate": 0.01, "up": 0.012, "down": 0.03, "asymmetry": 2.7}, {"layer": 1, "gate": 0.02, "up": 0.02, "down": 0.025, "asymmetry": 1.25}]})")});
  in.analyses.push_back(
      {"analyze", "alignment", "alignment.json", json::parse(R"({"languages": ["en", "ru"],
      "mean_cosine": [0.6, 0.2, -0.1, 0.05]})")});
  return report::BuildReport(in, {});
}

TEST(ReportBrowser, HtmlRendersWithEveryPlotAndFetchesNothing) {
  const report::Report r = FullReport();
  ASSERT_EQ(DrawnPlots(r), static_cast<int>(r.plots.size()))
      << "the fake report should draw every plot";
  char tmpl[] = "/tmp/stemma-report-browser.XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string path = dir + "/report.html";
  std::ofstream(path) << report::RenderHtml(r);
  CheckInBrowser(path, DrawnPlots(r));
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// --- The real thing ------------------------------------------------------------------------

std::string EngineBinary() {
  if (fs::exists(Cluster::BinDir() + "/stemma-engine")) return Cluster::BinDir() + "/stemma-engine";
  if (const char* e = std::getenv("STEMMA_ENGINE"); e != nullptr && fs::exists(e)) return e;
  return "";
}

// The languages of the real studies: the corpus entry of each, and one line of its text
// (`before` i `after`, i numbering the lines).
struct StudyLanguage {
  const char* code;
  const char* corpus;  // the prepare stage's entry, without its text
  const char* before;
  const char* after;
};
constexpr StudyLanguage kLanguages[] = {
    {"en", "code: en, family: germanic, role: base, name: English", "the quick brown fox ",
     " jumps over the lazy dog"},
    {"ru", "code: ru, family: slavic, role: held_in, name: Russian", "быстрая коричневая лиса ",
     " прыгает через ленивую собаку"},
    {"uk", "code: uk, family: slavic, role: held_out, name: Ukrainian", "швидка бура лисиця ",
     " стрибає через ледачого пса"},
    {"fr", "code: fr, family: romance, role: held_in, name: French", "le renard brun rapide ",
     " saute par-dessus le chien paresseux"},
    {"it", "code: it, family: romance, role: held_out, name: Italian", "la volpe marrone veloce ",
     " salta sopra il cane pigro"},
};

// The stages both real studies begin with: the corpus of `codes` (in that order, 30 % held
// out) prepared from <code>.txt in the storage root, and a tiny base model.
std::string StudyHead(const std::string& name, const std::vector<std::string>& codes) {
  std::string yaml = "name: " + name +
                     "\nstages:\n  corpus:\n    prepare:\n      heldout_fraction: 0.3\n"
                     "      languages:\n";
  for (const std::string& code : codes) {
    for (const StudyLanguage& l : kLanguages) {
      if (l.code == code)
        yaml += "        - {" + std::string(l.corpus) + ", text: [" + code + ".txt]}\n";
    }
  }
  return yaml + "  base:\n    init: {arch: llama, preset: tiny, seed: 3}\n";
}

// A coordinator and one 2-CPU worker running `engine` (first on PATH, where the worker looks
// after its own directory), with 150 lines of each language of `codes` in <dir>/store, the
// worker's storage root.
void StartEngineCluster(Cluster& c, const std::string& engine,
                        const std::vector<std::string>& codes) {
  const std::string path = fs::path(engine).parent_path().string() + ":" +
                           (std::getenv("PATH") ? std::getenv("PATH") : "");
  ::setenv("PATH", path.c_str(), 1);
  c.StartCoordinator();
  const std::string root = c.dir() + "/store";
  fs::create_directories(root);
  for (const StudyLanguage& l : kLanguages) {
    if (std::find(codes.begin(), codes.end(), l.code) == codes.end()) continue;
    std::ofstream text(root + "/" + l.code + ".txt");
    for (int i = 0; i < 150; ++i) text << l.before << i << l.after << "\n";
  }
  Cluster::WorkerOptions w;
  w.cpus = 2;
  w.extra = {"--storage-root", root};
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
}

// After StudyHead("report-e2e", {"en", "ru", "uk"}).
constexpr const char* kStudyStages = R"(  tok:
    needs: [base, corpus]
    matrix: {language: [ru, en, uk]}
    tokenize:
      tokenizer: "${{ needs.base.outputs.model }}"
      input: ["${{ needs.corpus.outputs.corpus }}/heldout/${{ matrix.language }}.txt"]
      format: text
      line_docs: true
      language: "${{ matrix.language }}"
  cpt:
    needs: [base, {stage: tok, where: {language: [ru, en]}}]
    train:
      model: "${{ needs.base.outputs.model }}"
      data:
        datasets: [{path: "${{ needs.tok.outputs.dataset }}"}]
        seq_len: 16
        heldout_fraction: 0.2
      batch_size: 2
      steps: 6
      log_every: 1
      optimizer: {lr: 1.0e-2}
  analyze:
    needs: [base, cpt, tok]
    analyze:
      model: "${{ needs.base.outputs.model }}"
      device: cpu   # spelled out: a sweep refuses the default (analyze.device: '' is not cpu, ...)
      seq_len: 16
      max_tokens: 512
      languages:
        - {language: "${{ needs.tok.matrix.language }}", dataset: "${{ needs.tok.outputs.dataset }}"}
      lape: {}
      drift: {base: "${{ needs.base.outputs.model }}", trained: "${{ needs.cpt.outputs.model }}"}
  eval-base:
    needs: [base, tok]
    eval:
      model: "${{ needs.base.outputs.model }}"
      tasks:
        - {type: perplexity, language: "${{ needs.tok.matrix.language }}", data: "${{ needs.tok.outputs.dataset }}", heldout_fraction: 0.2, limit: 4}
  eval-cpt:
    needs: [cpt, tok]
    labels: {report.row: "dense cpt", report.group: dense}
    eval:
      model: "${{ needs.cpt.outputs.model }}"
      tasks:
        - {type: perplexity, language: "${{ needs.tok.matrix.language }}", data: "${{ needs.tok.outputs.dataset }}", heldout_fraction: 0.2, limit: 4}
)";

// Roles and families from the prepare job's corpus manifest: ru held-in, uk held-out (both
// slavic), en the base (general); the columns in that order.
void ExpectRolesFromTheCorpus(const json& rep) {
  EXPECT_EQ(rep["roles_from_corpus"], true) << rep["notes"].dump();
  std::map<std::string, json> langs;
  for (const auto& l : rep["languages"]) langs[l["code"]] = l;
  EXPECT_EQ(langs["ru"]["role"], "held_in");
  EXPECT_EQ(langs["ru"]["family"], "slavic");
  EXPECT_EQ(langs["uk"]["role"], "held_out");
  EXPECT_EQ(langs["uk"]["name"], "Ukrainian");
  EXPECT_EQ(langs["en"]["role"], "general");
  std::vector<std::string> keys;
  for (const auto& col : rep["columns"]) keys.push_back(col["key"]);
  EXPECT_EQ(keys, (std::vector<std::string>{"bpb/ru", "bpb/uk", "bpb/en"}))
      << "held-in, held-out, general";
}

// The numbers are the engine's: the metric points the coordinator stored and the results
// files the evals wrote; deltas and the summary follow from them.
void ExpectTheEnginesNumbers(Cluster& c, const json& rep) {
  auto metrics = c.Cli({"metrics", "report-e2e", "--last", "-o", "json"});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.err;
  std::map<std::string, std::map<std::string, double>> points;  // job → name → value
  for (const auto& p : metrics.Json()) points[p["job"]][p["name"]] = p["value"];
  for (const auto& row : rep["rows"]) {
    const std::string job = row["job_id"];
    for (const char* col : {"bpb/ru", "bpb/uk", "bpb/en"}) {
      ASSERT_TRUE(row["cells"].contains(col)) << col;
      ASSERT_TRUE(points[job].count(col)) << job << " " << col;
      EXPECT_DOUBLE_EQ(row["cells"][col]["value"].get<double>(), points[job][col])
          << job << " " << col;
    }
    const json job_json = c.Get(job);
    const json results = json::parse(Cluster::ReadFile(job_json["outputs"]["results"]));
    EXPECT_EQ(row["checkpoint_sha256"], results["checkpoint"]["sha256"]);
    EXPECT_FALSE(row["checkpoint_sha256"].get<std::string>().empty());
  }
  const json& base = rep["rows"][0]["cells"];
  const json& cpt = rep["rows"][1]["cells"];
  for (const char* col : {"bpb/ru", "bpb/uk", "bpb/en"}) {
    EXPECT_DOUBLE_EQ(cpt[col]["delta"].get<double>(),
                     cpt[col]["value"].get<double>() - base[col]["value"].get<double>());
  }
  ASSERT_EQ(rep["summary"].size(), 2u);
  EXPECT_DOUBLE_EQ(rep["summary"][1]["acquisition"].get<double>(),
                   base["bpb/ru"]["value"].get<double>() - cpt["bpb/ru"]["value"].get<double>());
  EXPECT_DOUBLE_EQ(rep["summary"][1]["transfer"].get<double>(),
                   base["bpb/uk"]["value"].get<double>() - cpt["bpb/uk"]["value"].get<double>());
  EXPECT_DOUBLE_EQ(rep["summary"][1]["forgetting"].get<double>(),
                   cpt["bpb/en"]["delta"].get<double>());
}

// The loss curve has every step the train job logged; the analysis plots are the analyze
// job's files (LAPE counts and drift per layer).
void ExpectLossAndAnalysisPlots(Cluster& c, const json& rep, const std::string& out) {
  auto loss = c.Cli({"metrics", "report-e2e", "--name", "loss", "-o", "json"});
  size_t loss_points = loss.Json().size();
  for (const auto& p : rep["plots"]) {
    if (p["file"] == "loss_curves.svg") {
      EXPECT_EQ(p["drawn"], true);
      ASSERT_EQ(p["series"].size(), 1u);
      EXPECT_EQ(p["series"][0]["points"].size(), loss_points);
      EXPECT_GE(loss_points, 6u);
    }
  }
  // The analysis plots are the analyze job's files: LAPE counts and drift per layer.
  std::string analyze_id;
  const json cells = c.Cli({"exp", "get", "report-e2e", "-o", "json"}).Json()["cells"];
  for (const auto& cell : cells) {
    if (cell["job_name"] == "analyze") analyze_id = cell["job_id"];
  }
  ASSERT_FALSE(analyze_id.empty());
  const json outputs = c.Get(analyze_id)["outputs"];
  const json mask = json::parse(Cluster::ReadFile(outputs["mask"]));
  const json drift = json::parse(Cluster::ReadFile(outputs["drift"]));
  std::map<std::string, json> plots;
  for (const auto& p : rep["plots"]) plots[p["file"]] = p;
  for (const char* f : {"lape_neurons.svg", "drift.svg", "drift_asymmetry.svg"}) {
    EXPECT_EQ(plots[f]["drawn"], true) << f << ": " << plots[f].dump();
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  }
  ASSERT_EQ(plots["lape_neurons.svg"]["series"].size(), mask["counts"].size());
  for (const auto& s : plots["lape_neurons.svg"]["series"]) {
    const json& counts = mask["counts"][s["name"].get<std::string>()];
    ASSERT_EQ(s["points"].size(), counts.size());
    for (size_t l = 0; l < counts.size(); ++l)
      EXPECT_EQ(s["points"][l][1].get<double>(), counts[l].get<double>());
  }
  const json& down = plots["drift.svg"]["series"][0];
  EXPECT_EQ(down["name"], "down");
  ASSERT_EQ(down["points"].size(), drift["layers"].size());
  for (size_t l = 0; l < drift["layers"].size(); ++l) {
    EXPECT_DOUBLE_EQ(down["points"][l][1].get<double>(), drift["layers"][l]["down"].get<double>());
  }
}

TEST(ReportEndToEnd, RealEngineStudyWhileRunningAndFinished) {
  const std::string engine = EngineBinary();
  if (engine.empty()) {
    GTEST_SKIP() << "stemma-engine is not built here (STEMMA_BUILD_ENGINE=OFF); STEMMA_ENGINE=PATH "
                    "points at one";
  }
  Cluster c;
  StartEngineCluster(c, engine, {"en", "ru", "uk"});
  const std::string study = StudyHead("report-e2e", {"en", "ru", "uk"}) + kStudyStages;
  auto sweep = c.Cli({"sweep", "-f", c.WriteFile("study.yaml", study)});
  ASSERT_EQ(sweep.exit_code, 0) << sweep.out << sweep.err;

  // While it runs: the evals are there as rows, pending.
  auto early = c.Cli({"report", "report-e2e"});
  ASSERT_EQ(early.exit_code, 0) << early.err;
  EXPECT_NE(early.out.find("| dense cpt |"), std::string::npos) << early.out;
  EXPECT_NE(early.out.find("| state |"), std::string::npos) << "unfinished rows show their state\n"
                                                            << early.out;

  auto wait = c.Cli({"exp", "wait", "report-e2e", "--timeout", "400"});
  ASSERT_EQ(wait.exit_code, 0) << wait.out << wait.err;

  const std::string out = c.dir() + "/report";
  auto done = c.Cli({"report", "report-e2e", "--out", out});
  ASSERT_EQ(done.exit_code, 0) << done.err;
  for (const char* f :
       {"report.md", "report.html", "report.csv", "report.json", "acquisition_forgetting.svg",
        "loss_curves.svg", "lape_neurons.svg", "drift.svg"}) {
    EXPECT_TRUE(fs::exists(out + "/" + f)) << f << "\n" << done.out;
  }
  EXPECT_NE(done.out.find("| base (baseline) |"), std::string::npos) << done.out;
  const json rep = json::parse(Cluster::ReadFile(out + "/report.json"));
  EXPECT_EQ(rep["baseline"], "base");
  ASSERT_EQ(rep["rows"].size(), 2u);
  EXPECT_EQ(rep["rows"][0]["title"], "base");
  EXPECT_EQ(rep["rows"][1]["title"], "dense cpt");
  EXPECT_EQ(rep["rows"][1]["group"], "dense");
  ExpectRolesFromTheCorpus(rep);
  ExpectTheEnginesNumbers(c, rep);
  ExpectLossAndAnalysisPlots(c, rep, out);

  // CSV: one line per row and column.
  const std::string csv = Cluster::ReadFile(out + "/report.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'),
            1 + 2 * static_cast<long>(rep["columns"].size()));

  // A results file that cannot be read here: said, and the table still has the metrics.
  const json& base = rep["rows"][0]["cells"];
  const std::string results = c.Get(rep["rows"][0]["job_id"])["outputs"]["results"];
  fs::rename(results, results + ".away");
  auto partial = c.Cli({"report", "report-e2e", "--format", "json"});
  ASSERT_EQ(partial.exit_code, 0) << partial.err;
  const json pj = partial.Json();
  bool said = false;
  for (const auto& n : pj["notes"])
    said |= n.get<std::string>().find("not readable from here") != std::string::npos;
  EXPECT_TRUE(said) << pj["notes"].dump();
  EXPECT_DOUBLE_EQ(pj["rows"][0]["cells"]["bpb/ru"]["value"].get<double>(),
                   base["bpb/ru"]["value"].get<double>());
  fs::rename(results + ".away", results);

  // The page of a real study in a real browser.
  int drawn = 0;
  for (const auto& p : rep["plots"]) drawn += p["drawn"].get<bool>() ? 1 : 0;
  if (!FindChromium().empty()) {
    CheckInBrowser(out + "/report.html", drawn);
  } else {
    std::fprintf(stderr,
                 "chromium is not installed: the browser check of the real report was skipped\n");
  }
}

// Two family experts of real engine jobs: each is measured on its own family (held-in and
// held-out relative), forgetting on English; its CPT loss curve is named by its row.
// After StudyHead("report-families", {"en", "ru", "uk", "fr", "it"}).
constexpr const char* kFamilyStudyStages = R"YAML(  tok:
    needs: [base, corpus]
    matrix:
      include:
        - {language: ru, family: slavic}
        - {language: fr, family: romance}
    tokenize:
      tokenizer: "${{ needs.base.outputs.model }}"
      input: ["${{ needs.corpus.outputs.corpus }}/train/${{ matrix.language }}.txt"]
      format: text
      line_docs: true
      language: "${{ matrix.language }}"
  ev:
    needs: [base, corpus]
    matrix: {language: [ru, uk, fr, it, en]}
    tokenize:
      tokenizer: "${{ needs.base.outputs.model }}"
      input: ["${{ needs.corpus.outputs.corpus }}/heldout/${{ matrix.language }}.txt"]
      format: text
      line_docs: true
      language: "${{ matrix.language }}"
  cpt-expert:
    needs: [base, tok]
    matrix: {family: [slavic, romance]}
    labels: {report.target: "${{ matrix.family }}"}
    train:
      model: "${{ needs.base.outputs.model }}"
      data:
        datasets: [{path: "${{ needs.tok.outputs.dataset }}"}]
        seq_len: 16
        heldout_fraction: 0.2
      batch_size: 2
      steps: 8
      log_every: 1
      optimizer: {lr: 1.0e-2}
  eval-base:
    needs: [base, ev]
    labels: {report.row: base, report.baseline: "true"}
    eval:
      model: "${{ needs.base.outputs.model }}"
      tasks:
        - {type: perplexity, language: "${{ needs.ev.matrix.language }}", data: "${{ needs.ev.outputs.dataset }}", split: all, limit: 4}
  eval-expert:
    needs: [cpt-expert, {stage: ev, all: true}]
    matrix: {family: [slavic, romance]}
    labels: {report.row: "expert (${{ matrix.family }})", report.group: experts}
    eval:
      model: "${{ needs.cpt-expert.outputs.model }}"
      tasks:
        - {type: perplexity, language: "${{ needs.ev.matrix.language }}", data: "${{ needs.ev.outputs.dataset }}", split: all, limit: 4}
)YAML";

TEST(ReportEndToEnd, EachFamilyExpertIsMeasuredOnItsOwnFamily) {
  const std::string engine = EngineBinary();
  if (engine.empty())
    GTEST_SKIP() << "stemma-engine is not built here; STEMMA_ENGINE=PATH names one";
  const std::vector<std::string> codes = {"en", "ru", "uk", "fr", "it"};
  Cluster c;
  StartEngineCluster(c, engine, codes);
  const std::string study = StudyHead("report-families", codes) + kFamilyStudyStages;
  ASSERT_EQ(c.Cli({"sweep", "-f", c.WriteFile("families.yaml", study)}).exit_code, 0);
  auto wait = c.Cli({"exp", "wait", "report-families", "--timeout", "500"});
  ASSERT_EQ(wait.exit_code, 0) << wait.out << wait.err;
  const std::string out = c.dir() + "/report";
  auto done = c.Cli({"report", "report-families", "--out", out});
  ASSERT_EQ(done.exit_code, 0) << done.err;
  const json rep = json::parse(Cluster::ReadFile(out + "/report.json"));

  // The values the engine reported, by row title and column.
  std::map<std::string, std::map<std::string, double>> v;
  for (const auto& row : rep["rows"]) {
    for (const auto& [key, cell] : row["cells"].items()) {
      if (cell["value"].is_number()) v[row["title"]][key] = cell["value"];
    }
  }
  std::map<std::string, json> summary;
  for (const auto& s : rep["summary"]) summary[s["row"]] = s;
  const json& romance = summary["expert (romance)"];
  EXPECT_EQ(romance["target"], "romance");
  EXPECT_EQ(romance["held_in"], json::array({"fr"})) << "Romance languages only";
  EXPECT_EQ(romance["held_out"], json::array({"it"}));
  EXPECT_DOUBLE_EQ(romance["acquisition"].get<double>(),
                   v["base"]["bpb/fr"] - v["expert (romance)"]["bpb/fr"]);
  EXPECT_DOUBLE_EQ(romance["transfer"].get<double>(),
                   v["base"]["bpb/it"] - v["expert (romance)"]["bpb/it"]);
  EXPECT_DOUBLE_EQ(romance["forgetting"].get<double>(),
                   v["expert (romance)"]["bpb/en"] - v["base"]["bpb/en"]);
  // Its Russian is in the Slavic column group, not in its acquisition.
  EXPECT_DOUBLE_EQ(romance["families"]["slavic"]["acquisition"].get<double>(),
                   v["base"]["bpb/ru"] - v["expert (romance)"]["bpb/ru"]);
  const json& slavic = summary["expert (slavic)"];
  EXPECT_EQ(slavic["held_in"], json::array({"ru"}));
  EXPECT_DOUBLE_EQ(slavic["acquisition"].get<double>(),
                   v["base"]["bpb/ru"] - v["expert (slavic)"]["bpb/ru"]);
  EXPECT_NE(done.out.find("| expert (romance) | romance |"), std::string::npos) << done.out;
  // Columns grouped by family; the loss curves named by row; only the plots it has.
  std::vector<std::string> keys;
  for (const auto& col : rep["columns"]) keys.push_back(col["key"]);
  EXPECT_EQ(keys, (std::vector<std::string>{"bpb/ru", "bpb/uk", "bpb/fr", "bpb/it", "bpb/en"}));
  std::map<std::string, json> plots;
  for (const auto& p : rep["plots"]) plots[p["file"]] = p;
  EXPECT_EQ(plots.size(), 2u) << "acquisition_forgetting.svg and loss_curves.svg only";
  std::set<std::string> curves;
  for (const auto& s : plots["loss_curves.svg"]["series"]) curves.insert(s["name"]);
  EXPECT_EQ(curves, (std::set<std::string>{"expert (slavic)", "expert (romance)"}));
  EXPECT_EQ(done.out.find("not drawn"), std::string::npos) << done.out;
  if (!FindChromium().empty()) {
    CheckInBrowser(out + "/report.html", 2);
    if (const char* keep = std::getenv("STEMMA_REPORT_KEEP"); keep != nullptr)
      fs::copy(out, keep, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
}

TEST(ReportEndToEnd, UnknownExperimentAndBadFlags) {
  Cluster c;
  c.StartCoordinator();
  auto missing = c.Cli({"report", "no-such-study"});
  EXPECT_EQ(missing.exit_code, 3);  // the coordinator knows no such study
  EXPECT_NE(missing.err.find("no-such-study"), std::string::npos) << missing.err;
  auto bad = c.Cli({"report", "x", "--format", "pdf"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--format: 'pdf'"), std::string::npos) << bad.err;
  auto help = c.Cli({"report", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("report.baseline"), std::string::npos) << help.out;
}

// --- stemma metrics by cell and revision; checkpoint metrics by the eval that measured them --

// An engine stand-in: train writes its learning rate into the model it outputs, eval reports
// bpb/<language> = that learning rate for each task language.
constexpr const char* kMetricsEngine = R"SH(#!/bin/bash
cmd=$1; spec=$3
out=$(grep -o '"out": *"[^"]*"' "$spec" | head -1 | sed 's/.*: *"\(.*\)"/\1/')
case "$out" in /*) ;; *) out="$STEMMA_STORAGE_ROOT/$out" ;; esac
mkdir -p "$(dirname "$out")"
if [ "$cmd" = train ]; then
  lr=$(grep -o '"lr": *[0-9.e+-]*' "$spec" | head -1 | sed 's/.*: *//')
  for s in 1 2; do echo "{\"event\":\"step\",\"step\":$s,\"total_steps\":2,\"loss\":$lr}"; done
  mkdir -p "$out"
  echo "$lr" > "$out/lr.txt"
  echo "{\"producer\": {\"command\": \"train\", \"params\": {\"lr\": $lr}}}" > "$out/stemma.json"
  echo "{\"event\":\"output\",\"name\":\"model\",\"type\":\"checkpoint\",\"path\":\"$out\"}"
  exit 0
fi
model=$(grep -o '"model": *"[^"]*"' "$spec" | head -1 | sed 's/.*: *"\(.*\)"/\1/')
case "$model" in /*) ;; *) model="$STEMMA_STORAGE_ROOT/$model" ;; esac
lr=$(cat "$model/lr.txt")
for lang in $(grep -o '"language": *"[^"]*"' "$spec" | sed 's/.*: *"\(.*\)"/\1/'); do
  echo "{\"event\":\"metric\",\"name\":\"bpb/$lang\",\"value\":$lr,\"step\":0,\"labels\":{\"language\":\"$lang\"}}"
done
echo '{"tasks": []}' > "$out"
echo "{\"event\":\"output\",\"name\":\"results\",\"path\":\"$out\"}"
)SH";

std::string MetricsStudy(const std::string& languages) {
  std::string tasks;
  for (const std::string& l : {std::string("ru"), std::string("fr")}) {
    if (languages.find(l) == std::string::npos) continue;
    tasks += "{type: perplexity, language: " + l + ", data: data, split: all}, ";
  }
  return R"(name: metrics-rev
stages:
  cpt:
    matrix: {lr: [1, 2]}
    train:
      model: base
      data: {datasets: [{path: data}], seq_len: 8}
      steps: 2
      optimizer: {lr: "${{ matrix.lr }}"}
  eval:
    needs: [cpt]
    matrix: {lr: [1, 2]}
    eval: {model: "${{ needs.cpt.outputs.model }}", tasks: [)" +
         tasks + "]}\n";
}

// (cell, name) → value of the points of `stemma metrics ARGS -o json`, and the revisions seen.
std::map<std::pair<std::string, std::string>, double> PointsByCell(
    const Cluster& c, std::vector<std::string> args, std::set<int>* revisions = nullptr) {
  args.insert(args.begin(), "metrics");
  args.insert(args.end(), {"-o", "json"});
  const CliResult r = c.Cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::map<std::pair<std::string, std::string>, double> out;
  if (r.exit_code != 0) return out;
  const json points = r.Json();
  for (const auto& p : points) {
    out[{p.value("cell", std::string()), p["name"]}] = p["value"];
    if (revisions != nullptr) revisions->insert(p.value("revision", 0));
  }
  return out;
}

TEST(MetricsByCell, RevisionAndCellSelectPointsNamedByTheirCell) {
  Cluster c;
  c.StartCoordinator();
  const std::string root = c.dir() + "/store";
  fs::create_directories(root);
  const std::string engine = c.WriteFile("fake-engine", kMetricsEngine);
  ::chmod(engine.c_str(), 0755);
  Cluster::WorkerOptions w;
  w.extra = {"--storage-root", root, "--engine", engine};
  c.StartWorker("w1", w);
  c.WaitForWorkers(1);
  // Revision 1 evaluates ru; revision 2 adds fr: the evals run again, the CPT cells are served
  // from the cache.
  ASSERT_EQ(c.Cli({"sweep", "-f", c.WriteFile("m.yaml", MetricsStudy("ru"))}).exit_code, 0);
  ASSERT_EQ(c.Cli({"exp", "wait", "metrics-rev", "--timeout", "120"}).exit_code, 0);
  ASSERT_EQ(c.Cli({"sweep", "-f", c.WriteFile("m.yaml", MetricsStudy("ru fr"))}).exit_code, 0);
  ASSERT_EQ(c.Cli({"exp", "wait", "metrics-rev", "--timeout", "120"}).exit_code, 0);

  std::set<int> revisions;
  auto latest = PointsByCell(c, {"metrics-rev", "--last"}, &revisions);
  EXPECT_EQ(revisions, (std::set<int>{2}));
  EXPECT_EQ(latest.at({"eval[lr=1]", "bpb/fr"}), 1);
  EXPECT_EQ(latest.at({"eval[lr=2]", "bpb/ru"}), 2);
  EXPECT_EQ(latest.at({"cpt[lr=2]", "loss"}), 2) << "a cached cell shows the points of the run";
  EXPECT_EQ(latest.size(), 6u) << "2 losses, 2 x (ru, fr)";

  revisions.clear();
  auto first = PointsByCell(c, {"metrics-rev", "--last", "--revision", "1"}, &revisions);
  EXPECT_EQ(revisions, (std::set<int>{1}));
  EXPECT_EQ(first.count({"eval[lr=1]", "bpb/fr"}), 0u) << "revision 1 evaluated ru only";
  EXPECT_EQ(first.at({"eval[lr=1]", "bpb/ru"}), 1);

  revisions.clear();
  PointsByCell(c, {"metrics-rev", "--last", "--revision", "all"}, &revisions);
  EXPECT_EQ(revisions, (std::set<int>{1, 2}));

  // A cell by its exact name (brackets and all) or by a glob.
  auto one = PointsByCell(c, {"metrics-rev", "--cell", "eval[lr=1]"});
  EXPECT_EQ(one.size(), 2u);
  EXPECT_EQ(one.at({"eval[lr=1]", "bpb/ru"}), 1);
  auto evals = PointsByCell(c, {"metrics-rev", "--cell", "eval*", "--last"});
  EXPECT_EQ(evals.size(), 4u);
  const CliResult table = c.Cli({"metrics", "metrics-rev", "--cell", "eval*"});
  EXPECT_NE(table.out.find("CELL"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("eval[lr=2]"), std::string::npos) << table.out;
  const CliResult none = c.Cli({"metrics", "metrics-rev", "--cell", "nothing*"});
  EXPECT_EQ(none.exit_code, 3);  // refused by the coordinator (docs/cli.md § Exit codes)
  EXPECT_NE(none.err.find("matching nothing*"), std::string::npos) << none.err;
  EXPECT_EQ(c.Cli({"metrics", "metrics-rev", "--revision", "x"}).exit_code, 2);

  // The checkpoint of cpt[lr=1] was measured by two evals (ru; then ru and fr): ckpt show
  // keeps them apart, each with its job.
  std::string ckpt;
  for (const auto& a : c.Cli({"ckpt", "ls", "--experiment", "metrics-rev", "-o", "json"}).Json()) {
    if (a.value("name", "") == "model" &&
        a["path"].get<std::string>().find("lr=1") != std::string::npos)
      ckpt = a["id"];
  }
  ASSERT_FALSE(ckpt.empty());
  const json shown = c.Cli({"ckpt", "show", ckpt, "-o", "json"}).Json();
  std::map<std::string, std::set<std::string>> by_job;  // job name + id → metric names
  for (const auto& m : shown["measured"]) {
    by_job[m["job_id"].get<std::string>() + " " + m["job_name"].get<std::string>()].insert(
        m["name"].get<std::string>());
  }
  std::vector<std::set<std::string>> evals_seen;
  for (const auto& [job, names] : by_job) {
    if (job.find("eval[lr=1]") != std::string::npos) evals_seen.push_back(names);
  }
  ASSERT_EQ(evals_seen.size(), 2u) << shown.dump();
  EXPECT_NE(evals_seen[0], evals_seen[1]);
  const CliResult text = c.Cli({"ckpt", "show", ckpt});
  EXPECT_NE(text.out.find("eval[lr=1]: bpb/ru=1\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("eval[lr=1]: bpb/fr=1 bpb/ru=1\n"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace stemma::testing
