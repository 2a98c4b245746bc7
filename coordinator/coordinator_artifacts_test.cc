// The coordinator core driven directly (coordinator_test_fixture.h): checkpoints registered
// with lineage, verification, garbage collection; artifact files.
#include "coordinator/coordinator_test_fixture.h"

namespace stemma::coordinator {
namespace {

TEST_F(CoordinatorTest, SucceededJobsRegisterTheirCheckpointsWithLineageMetricsAndConsumers) {
  Worker w = Connect("w0", 0, /*allow_exec=*/true);
  const std::string base = (dir_ / "base").string();
  auto cpt = MakeCheckpoint("cpt-uk", "weights-1", {base});
  std::string j1 =
      RunToSuccess(w, Spec("cpt", "fam", "cpt"), 1, {{"loss", 10, 2.5}, {"loss", 20, 2.0}}, {cpt});
  auto soup = MakeCheckpoint("soup", "weights-2", {cpt.path(), base}, "soup");
  std::string j2 = RunToSuccess(w, Spec("soup", "fam", "soup"), 2, {}, {soup});

  auto list = coord_->ListArtifacts({});
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->artifacts_size(), 3);  // newest first: soup, cpt, the external base
  const v1::Artifact& s = list->artifacts(0);
  const v1::Artifact& c = list->artifacts(1);
  const v1::Artifact& b = list->artifacts(2);
  EXPECT_TRUE(b.external());
  EXPECT_EQ(b.path(), base);
  EXPECT_EQ(c.job_id(), j1);
  EXPECT_EQ(c.experiment(), "fam");
  EXPECT_EQ(c.stage(), "cpt");
  EXPECT_EQ(c.manifest_sha256(), cpt.manifest_sha256());
  EXPECT_EQ(c.operation(), "cpt");
  ASSERT_EQ(c.parents_size(), 1);
  EXPECT_EQ(c.parents(0), b.id());
  EXPECT_DOUBLE_EQ(c.metrics().at("loss"), 2.0);  // the last value
  EXPECT_EQ(c.verification(), v1::UNCHECKED);     // checking is off by default
  EXPECT_EQ(std::vector<std::string>(s.parents().begin(), s.parents().end()),
            (std::vector<std::string>{c.id(), b.id()}));

  v1::LineageRequest lr;
  lr.set_id(s.id());
  auto lineage = coord_->Lineage(lr);
  ASSERT_TRUE(lineage.ok());
  ASSERT_EQ(lineage->artifacts_size(), 3);  // each ancestor once, the base reached twice
  EXPECT_EQ(lineage->artifacts(0).id(), s.id());
  lr.set_max_depth(1);
  lr.set_id("ckpt:" + c.id());
  lineage = coord_->Lineage(lr);
  ASSERT_TRUE(lineage.ok());
  EXPECT_EQ(lineage->artifacts_size(), 2);

  // An evaluation reading the soup (a file inside it) credits its metric to it.
  v1::JobSpec eval;
  eval.set_name("eval");
  eval.mutable_exec()->add_argv("/bin/eval");
  eval.mutable_exec()->add_argv(soup.path() + "/model.safetensors");
  std::string j3 = RunToSuccess(w, eval, 3, {{"heldout_loss/uk", 0, 3.25}}, {});
  auto details = coord_->GetArtifact(soup.path());
  ASSERT_TRUE(details.ok()) << details.status();
  EXPECT_EQ(details->artifact().id(), s.id());
  EXPECT_DOUBLE_EQ(details->artifact().metrics().at("heldout_loss/uk"), 3.25);
  EXPECT_EQ(details->producer().id(), j2);
  ASSERT_EQ(details->parents_size(), 2);
  ASSERT_EQ(details->consumer_jobs_size(), 1);
  EXPECT_EQ(details->consumer_jobs(0), j3);
  auto cd = coord_->GetArtifact(c.id());
  ASSERT_EQ(cd->children_size(), 1);
  EXPECT_EQ(cd->children(0).id(), s.id());
  EXPECT_EQ(coord_->GetArtifact("a-999").status().code(), absl::StatusCode::kNotFound);

  // Verify reads the files; a changed weights file is found.
  auto ok = coord_->VerifyArtifact(c.id());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->ok());
  EXPECT_EQ(ok->files_checked(), 2);
  EXPECT_EQ(ok->artifact().verification(), v1::VERIFIED);
  WriteFile(cpt.path() + "/model.safetensors", "weights-X");
  auto bad = coord_->VerifyArtifact(c.id());
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->ok());
  ASSERT_EQ(bad->problems_size(), 1);
  EXPECT_NE(bad->problems(0).find("model.safetensors"), std::string::npos) << bad->problems(0);
  EXPECT_EQ(bad->artifact().verification(), v1::MISMATCH);

  // The registry is durable: a restarted coordinator has it, and new ids continue.
  coord_.reset();
  StartCoordinator();
  list = coord_->ListArtifacts({});
  ASSERT_EQ(list->artifacts_size(), 3);
  EXPECT_EQ(list->artifacts(1).verification(), v1::MISMATCH);
  Worker again = Connect("w0", 0, true);
  auto more = MakeCheckpoint("later", "weights-3", {soup.path()});
  RunToSuccess(again, Spec("later"), 4, {}, {more});
  EXPECT_EQ(coord_->ListArtifacts({})->artifacts(0).id(), "a-4");
}

TEST_F(CoordinatorTest, FailedAttemptsRegisterNothingAndReportedHashesAreCheckedWhenAsked) {
  coord_.reset();
  verify_artifacts_ = true;
  StartCoordinator();
  Worker w = Connect("w0");
  auto out = MakeCheckpoint("first", "w1");
  v1::SubmitRequest req;
  auto* spec = req.add_jobs();
  *spec = Spec("retried");
  spec->set_max_attempts(2);
  spec->mutable_backoff()->set_initial_ms(1);
  std::string id = coord_->Submit(req)->job_ids(0);
  v1::Assignment a = Assigned(w);
  v1::AttemptEvent fail;
  fail.set_attempt_id(a.attempt_id());
  fail.set_event_seq(1);
  fail.mutable_finished()->set_exit_code(3);
  *fail.mutable_finished()->add_artifacts() = out;
  coord_->Event(w.id, w.session, fail);
  EXPECT_EQ(coord_->ListArtifacts({})->artifacts_size(), 0);

  auto good = MakeCheckpoint("good", "w2");
  auto lying = MakeCheckpoint("lying", "w3");
  lying.set_manifest_sha256(std::string(64, '0'));
  auto missing = good;
  missing.set_name("results");
  missing.set_type("file");
  missing.set_path((dir_ / "not-here.json").string());
  RunToSuccess(w, Spec("checked"), 2, {}, {good, lying, missing});
  std::map<std::string, v1::Verification> by_path;
  auto list = coord_->ListArtifacts({});
  ASSERT_TRUE(list.ok());
  for (const auto& art : list->artifacts()) by_path[art.path()] = art.verification();
  EXPECT_EQ(by_path[good.path()], v1::VERIFIED);
  EXPECT_EQ(by_path[lying.path()], v1::MISMATCH);
  EXPECT_EQ(by_path[missing.path()], v1::UNREADABLE);
}

TEST_F(CoordinatorTest, GcDryRunChangesNothingAndApplyDeletesOnlyUnprotectedCheckpoints) {
  Worker w = Connect("w0");
  std::vector<v1::OutputArtifact> outs;
  for (int i = 0; i < 4; ++i) {
    outs.push_back(MakeCheckpoint(absl::StrCat("trial", i), absl::StrCat("weights", i)));
    RunToSuccess(w, Spec(absl::StrCat("trial", i), "sweep"), i + 1, {{"heldout_loss", 0, 4.0 - i}},
                 {outs.back()});
  }
  // trial3 (loss 1) is the best; trial0 is pinned; a queued job will read trial1.
  ASSERT_TRUE(coord_->PinArtifact("a-1", false).ok());
  v1::SubmitRequest reader;
  auto* spec = reader.add_jobs();
  spec->set_name("reader");
  spec->mutable_exec()->add_argv(outs[1].path());
  spec->mutable_resources()->set_gpus(8);  // never placed: stays QUEUED
  Worker exec = Connect("w1", 0, true);
  ASSERT_TRUE(coord_->Submit(reader).ok());

  v1::GcRequest gc;
  gc.mutable_policy()->set_keep_best(1);
  gc.mutable_policy()->set_metric("heldout_loss");
  auto dry = coord_->CollectGarbage(gc);
  ASSERT_TRUE(dry.ok()) << dry.status();
  std::map<std::string, bool> doomed;
  for (const auto& d : dry->decisions()) doomed[d.artifact().id()] = d.deleted();
  EXPECT_EQ(doomed, (std::map<std::string, bool>{
                        {"a-1", false}, {"a-2", false}, {"a-3", true}, {"a-4", false}}));
  EXPECT_FALSE(dry->applied());
  EXPECT_TRUE(std::filesystem::exists(outs[2].path()));

  gc.set_apply(true);
  auto applied = coord_->CollectGarbage(gc);
  ASSERT_TRUE(applied.ok());
  EXPECT_TRUE(applied->applied());
  EXPECT_EQ(applied->bytes_freed(), outs[2].bytes());
  EXPECT_FALSE(std::filesystem::exists(outs[2].path()));
  for (int i : {0, 1, 3}) EXPECT_TRUE(std::filesystem::exists(outs[i].path())) << i;
  auto deleted = coord_->GetArtifact("a-3");
  EXPECT_EQ(deleted->artifact().state(), v1::ARTIFACT_DELETED);
  EXPECT_NE(deleted->artifact().deleted_by().find("not among the best 1 by heldout_loss"),
            std::string::npos)
      << deleted->artifact().deleted_by();
  EXPECT_EQ(coord_->ListArtifacts({})->artifacts_size(), 3);  // deleted ones need --all
  v1::GcRequest bad;
  bad.mutable_policy()->set_keep_best(2);
  EXPECT_EQ(coord_->CollectGarbage(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A job that has not ended keeps what its dependencies registered, by artifact id, whatever
// its spec spells yet: a fan-in still waiting for one upstream job holds a wiring token, not
// the path, for the upstream jobs that are done (gc matched path text only before).
TEST_F(CoordinatorTest, GcKeepsTheOutputsOfAWaitingJobsDependencies) {
  Worker w = Connect("w0", 0, /*allow_exec=*/true);
  std::vector<v1::OutputArtifact> outs;
  std::vector<std::string> trials;
  for (int i = 0; i < 2; ++i) {
    outs.push_back(MakeCheckpoint(absl::StrCat("expert", i), absl::StrCat("weights", i)));
    trials.push_back(
        RunToSuccess(w, Spec(absl::StrCat("expert", i), "family"), i + 1, {}, {outs.back()}));
  }
  v1::SubmitRequest req;
  auto* slow = req.add_jobs();
  slow->set_name("slow");
  slow->mutable_noop();
  slow->mutable_resources()->set_gpus(8);  // never placed: the fan-in keeps waiting
  auto* soup = req.add_jobs();
  soup->set_name("soup");
  soup->mutable_exec()->add_argv("/bin/soup");
  soup->mutable_exec()->add_argv("${{ expert0.outputs.model }}");
  soup->add_depends_on(trials[0]);
  soup->add_depends_on("slow");
  auto submitted = coord_->Submit(req);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_EQ(Get(submitted->job_ids(1)).state(), v1::PENDING);

  v1::GcRequest gc;
  gc.mutable_policy()->set_keep_latest(1);
  auto applied = coord_->CollectGarbage(gc);  // a plan: files outside every root stay anyway
  ASSERT_TRUE(applied.ok()) << applied.status();
  ASSERT_EQ(applied->decisions_size(), 2);
  for (const auto& d : applied->decisions()) {
    if (d.artifact().id() != "a-1") continue;
    EXPECT_FALSE(d.deleted()) << d.reason();
    EXPECT_EQ(d.reason(), "a job that has not ended reads it");
  }
  EXPECT_EQ(coord_->GetArtifact("a-1")->artifact().state(), v1::ARTIFACT_PRESENT);
  auto details = coord_->GetArtifact("a-1");
  ASSERT_EQ(details->consumer_jobs_size(), 1);
  EXPECT_EQ(details->consumer_jobs(0), submitted->job_ids(1));
}

// Memoization's file checks are made before a submit takes the coordinator's lock, and count
// under it only for a record still as checked: a hit is served from an unchanged checkpoint,
// not from one changed in place (same size: only the hash tells).
TEST_F(CoordinatorTest, CacheHitsServeOnlyUnchangedFilesCheckedBeforeTheLock) {
  Worker w = Connect("w0");
  const v1::OutputArtifact ckpt = MakeCheckpoint("s5", "weights-5");
  v1::JobSpec init;
  init.set_name("s5");
  init.mutable_init()->set_seed(5);
  init.mutable_init()->set_out(ckpt.path());
  v1::SubmitRequest req;
  *req.add_jobs() = init;
  auto first = coord_->Submit(req);
  ASSERT_TRUE(first.ok()) << first.status();
  const v1::Assignment a = Assigned(w);
  v1::AttemptEvent started;
  started.set_attempt_id(a.attempt_id());
  started.mutable_started()->set_pid(7);
  coord_->Event(w.id, w.session, started);
  v1::AttemptEvent fin;
  fin.set_attempt_id(a.attempt_id());
  fin.set_event_seq(1);
  fin.mutable_finished()->set_exit_code(0);
  *fin.mutable_finished()->add_artifacts() = ckpt;
  (*fin.mutable_finished()->mutable_outputs())["model"] = ckpt.path();
  coord_->Event(w.id, w.session, fin);
  ASSERT_EQ(Get(first->job_ids(0)).state(), v1::SUCCEEDED);

  auto hit = coord_->Submit(req);
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(Get(hit->job_ids(0)).reason(), "memoized from " + first->job_ids(0));
  WriteFile(ckpt.path() + "/model.safetensors", "weights-6");
  auto changed = coord_->Submit(req);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_NE(Get(changed->job_ids(0)).state(), v1::SUCCEEDED) << Get(changed->job_ids(0)).reason();
}

// A file check made before the lock holds only for the record it was made for.
TEST(ArtifactRegistryVerdicts, AVerdictHoldsOnlyForTheRecordItWasMadeFor) {
  v1::Artifact a;
  a.set_id("a-1");
  a.set_state(v1::ARTIFACT_PRESENT);
  a.set_path("/store/m");
  a.set_manifest_sha256("h1");
  v1::FileStamp* f = a.add_files();
  f->set_path("model.safetensors");
  f->set_bytes(9);
  f->set_mtime_ns(1);
  EXPECT_TRUE(ArtifactRegistry::VerdictHolds(a, a));
  v1::Artifact deleted = a;
  deleted.set_state(v1::ARTIFACT_DELETED);
  v1::Artifact restamped = a;
  restamped.mutable_files(0)->set_mtime_ns(2);
  v1::Artifact replaced = a;
  replaced.set_manifest_sha256("h2");
  for (const v1::Artifact* now : {&deleted, &restamped, &replaced}) {
    EXPECT_FALSE(ArtifactRegistry::VerdictHolds(*now, a)) << now->ShortDebugString();
  }
  // And the check itself, without the lock: files gone are a problem.
  auto verdicts = ArtifactRegistry::CheckFiles({a});
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_NE(verdicts[0].problem, "");
  EXPECT_EQ(verdicts[0].checked.id(), "a-1");
}

// A token dataset (`stemma-engine tokenize`) has index.json, not stemma.json: it is its
// manifest (every shard and index.bin with their sha256). The dataset's parents are the
// tokenizer's model and the corpus its input lies in; a model trained on it has it as a parent.
TEST_F(CoordinatorTest, TokenDatasetsVerifyByTheirIndexAndAreParentsOfWhatTrainsOnThem) {
  Worker w = Connect("w0", 0, /*allow_exec=*/true);
  const v1::OutputArtifact base = MakeCheckpoint("base", "weights-0");
  RunToSuccess(w, Spec("base"), 1, {}, {base});

  const std::string corpus = (dir_ / "corpus").string();
  std::filesystem::create_directories(corpus + "/train");
  WriteFile(corpus + "/train/uk.txt", "один\n");
  const std::string text_sha = *Sha256File(corpus + "/train/uk.txt");
  WriteFile(corpus + "/listing", absl::StrCat(text_sha, "  train/uk.txt\n"));
  const std::string content_hash = *Sha256File(corpus + "/listing");
  std::filesystem::remove(corpus + "/listing");
  WriteFile(corpus + "/manifest.json",
            absl::StrCat(R"({"format": "stemma.corpus/1", "content_hash": ")", content_hash,
                         R"(", "files": [{"path": "train/uk.txt", "bytes": 9, "sha256": ")",
                         text_sha, R"("}]})"));
  v1::OutputArtifact corpus_out;
  corpus_out.set_name("corpus");
  corpus_out.set_type("corpus");
  corpus_out.set_path(corpus);
  corpus_out.set_manifest_sha256(*Sha256File(corpus + "/manifest.json"));
  corpus_out.set_operation("prepare");
  RunToSuccess(w, Spec("prepare"), 2, {}, {corpus_out});

  // Three tokens in one shard (uint32), two documents (three uint64 offsets).
  const std::string ds = (dir_ / "tokens-uk").string();
  std::filesystem::create_directories(ds);
  WriteFile(ds + "/shard-00000.bin",
            std::string("\x01\x01\x01\x01\x02\x02\x02\x02\x03\x03\x03\x03"));
  WriteFile(ds + "/index.bin", std::string(24, '\x05'));
  WriteFile(ds + "/index.json",
            absl::StrCat(R"({"format": "stemma-tokens-v1", "dtype": "uint32", "num_tokens": 3,)",
                         R"( "num_documents": 2, "shard_tokens": 67108864,)",
                         R"( "documents": {"file": "index.bin", "dtype": "uint64", "sha256": ")",
                         *Sha256File(ds + "/index.bin"), R"("},)",
                         R"( "shards": [{"file": "shard-00000.bin", "num_tokens": 3, "sha256": ")",
                         *Sha256File(ds + "/shard-00000.bin"), R"("}]})"));
  EXPECT_EQ(ManifestFile(ds), ds + "/index.json");
  v1::OutputArtifact ds_out;
  ds_out.set_name("dataset");
  ds_out.set_type("dataset");
  ds_out.set_path(ds);
  ds_out.set_manifest_sha256(*Sha256File(ds + "/index.json"));
  ds_out.set_operation("tokenize");
  v1::JobSpec tokenize;
  tokenize.set_name("tokenize");
  tokenize.mutable_tokenize()->set_tokenizer(base.path());
  tokenize.mutable_tokenize()->add_input(corpus + "/train/uk.txt");
  tokenize.mutable_tokenize()->set_format("text");
  tokenize.mutable_tokenize()->set_language("uk");
  tokenize.mutable_tokenize()->set_out(ds);
  RunToSuccess(w, tokenize, 3, {}, {ds_out});

  const v1::OutputArtifact cpt = MakeCheckpoint("cpt-uk", "weights-1", {base.path()});
  v1::JobSpec train;
  train.set_name("cpt");
  train.mutable_train()->set_model(base.path());
  train.mutable_train()->set_out(cpt.path());
  train.mutable_train()->mutable_data()->add_datasets()->set_path(ds);
  train.mutable_train()->mutable_data()->set_seq_len(2);
  train.mutable_train()->set_steps(1);
  RunToSuccess(w, train, 4, {}, {cpt});

  auto find = [&](const std::string& path) {
    auto d = coord_->GetArtifact(path);
    EXPECT_TRUE(d.ok()) << path << ": " << d.status();
    return d.ok() ? d->artifact() : v1::Artifact();
  };
  const v1::Artifact b = find(base.path()), c = find(corpus), d = find(ds), m = find(cpt.path());
  EXPECT_EQ(d.type(), "dataset");
  EXPECT_EQ(std::vector<std::string>(d.parents().begin(), d.parents().end()),
            (std::vector<std::string>{b.id(), c.id()}));
  EXPECT_EQ(std::vector<std::string>(m.parents().begin(), m.parents().end()),
            (std::vector<std::string>{b.id(), d.id()}));
  v1::LineageRequest lr;
  lr.set_id(m.id());
  auto lineage = coord_->Lineage(lr);
  ASSERT_TRUE(lineage.ok()) << lineage.status();
  std::vector<std::string> ids;
  for (const v1::Artifact& a : lineage->artifacts()) ids.push_back(a.id());
  EXPECT_EQ(ids, (std::vector<std::string>{m.id(), b.id(), d.id(), c.id()}));

  auto ok = coord_->VerifyArtifact(d.id());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->ok()) << (ok->problems().empty() ? "" : ok->problems(0));
  EXPECT_EQ(ok->files_checked(), 3);  // index.json, the shard, index.bin
  EXPECT_EQ(ok->artifact().verification(), v1::VERIFIED);
  auto corpus_ok = coord_->VerifyArtifact(c.id());
  ASSERT_TRUE(corpus_ok.ok()) << corpus_ok.status();
  EXPECT_TRUE(corpus_ok->ok()) << (corpus_ok->problems().empty() ? "" : corpus_ok->problems(0));

  // A shard of the same size with other bytes, then a truncated one.
  WriteFile(ds + "/shard-00000.bin",
            std::string("\x01\x01\x01\x01\x02\x02\x02\x02\x09\x09\x09\x09"));
  auto changed = coord_->VerifyArtifact(d.id());
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_FALSE(changed->ok());
  ASSERT_EQ(changed->problems_size(), 1);
  EXPECT_NE(changed->problems(0).find("shard-00000.bin: sha256 differs"), std::string::npos)
      << changed->problems(0);
  EXPECT_EQ(changed->artifact().verification(), v1::MISMATCH);
  WriteFile(ds + "/shard-00000.bin", std::string("\x01\x01\x01\x01"));
  auto truncated = coord_->VerifyArtifact(d.id());
  ASSERT_TRUE(truncated.ok()) << truncated.status();
  ASSERT_EQ(truncated->problems_size(), 1);
  EXPECT_NE(truncated->problems(0).find("shard-00000.bin: 4 bytes, manifest says 12"),
            std::string::npos)
      << truncated->problems(0);
}

// A prepared corpus (`stemma-engine prepare`) has manifest.json, not stemma.json: its hash is
// the manifest's, and the deep check covers every listed file and the content_hash.
TEST(ArtifactFilesTest, ACorpusVerifiesByItsManifestJsonAndEveryFile) {
  const std::string dir = ::testing::TempDir() + "/corpus_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/train");
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  };
  write(dir + "/train/uk.txt", "один\nдва\n");
  write(dir + "/suites.json", "{}\n");
  const std::string a = *Sha256File(dir + "/suites.json"), b = *Sha256File(dir + "/train/uk.txt");
  write(dir + "/listing", absl::StrCat(a, "  suites.json\n", b, "  train/uk.txt\n"));
  const std::string content_hash = *Sha256File(dir + "/listing");
  std::filesystem::remove(dir + "/listing");
  auto manifest = [&](const std::string& hash) {
    return absl::StrCat(
        R"({"format": "stemma.corpus/1", "content_hash": ")", hash, R"(", "files": [)",
        R"({"path": "train/uk.txt", "bytes": 16, "lines": 2, "sha256": ")", b, R"("},)",
        R"({"path": "suites.json", "bytes": 3, "lines": 1, "sha256": ")", a, R"("}]})");
  };
  write(dir + "/manifest.json", manifest(content_hash));
  EXPECT_EQ(ManifestFile(dir), dir + "/manifest.json");
  const std::string sha = *Sha256File(dir + "/manifest.json");
  DeepCheck ok = VerifyArtifactFiles(dir, sha);
  EXPECT_TRUE(ok.problems.empty()) << ok.problems.front();
  EXPECT_EQ(ok.files_checked, 3);
  EXPECT_EQ(CheckManifest(dir, "0000").result, v1::MISMATCH);

  write(dir + "/train/uk.txt", "один\nтри\n");  // same size, other bytes
  DeepCheck changed = VerifyArtifactFiles(dir, sha);
  ASSERT_EQ(changed.problems.size(), 1u);
  EXPECT_NE(changed.problems[0].find("train/uk.txt: sha256 differs"), std::string::npos)
      << changed.problems[0];

  write(dir + "/train/uk.txt", "один\nдва\n");
  write(dir + "/manifest.json", manifest(std::string(64, '0')));
  DeepCheck listing = VerifyArtifactFiles(dir, *Sha256File(dir + "/manifest.json"));
  ASSERT_EQ(listing.problems.size(), 1u);
  EXPECT_NE(listing.problems[0].find("content_hash does not match"), std::string::npos)
      << listing.problems[0];
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace stemma::coordinator
