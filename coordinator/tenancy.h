// Who may do what to whose work (docs/tenancy.md). Every job, experiment and artifact has an
// owner: the subject of the token that submitted it ("" when the coordinator runs without
// authentication, where none of these rules apply). An admin may group subjects into
// projects (`stemma-coordinator --projects FILE`), whose members share:
//
//   # project   members (token subjects)
//   vision      bob carol
//   speech      carol dave
//
// - Namespaces: an experiment's name lives in its owner's namespace, the first project the
//   owner belongs to (in file order), else the owner's own subject. The same name from two
//   namespaces is two experiments.
// - Storage: a subject writes only below its prefixes of a storage root, `<subject>/` and
//   `projects/<project>/` for each of its projects. Default experiment outputs go below
//   `<subject>/`. Reading others' artifacts is allowed (read-only).
// - Management (pin, unpin, gc, overwrite): the owner, a member of a project the owner is in,
//   and admins.
//
// Thread-safety: immutable after construction; any thread may read it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stemma/v1/job.pb.h"

namespace stemma::coordinator {

class Tenancy {
 public:
  Tenancy() = default;
  // INVALID_ARGUMENT naming `source` and the line: a project or member that is not a plain
  // name ([A-Za-z0-9._-], not "." or ".."), a project without members, one listed twice.
  static absl::StatusOr<Tenancy> Parse(absl::string_view text, absl::string_view source);
  // Parse of the file at `path` (NOT_FOUND / PERMISSION_DENIED naming it).
  static absl::StatusOr<Tenancy> Load(const std::string& path);

  // The projects `subject` belongs to, in file order.
  std::vector<std::string> ProjectsOf(const std::string& subject) const;
  // The members of `project` in file order, or null for a project the file does not list.
  // The projects file is the one list of projects and members: the quota file's
  // `projects.NAME` entries set limits on these (coordinator/quotas.h).
  const std::vector<std::string>* MembersOf(const std::string& project) const;
  // The file it was read from ("" when none was given), for messages.
  const std::string& source() const { return source_; }
  // The namespace experiments of `subject` are named in: its first project, else itself.
  // "" for "".
  std::string Namespace(const std::string& subject) const;
  // True when `subject` may manage what `owner` owns: the same subject, or both in one
  // project. An empty owner (made without authentication) is everyone's.
  bool Shares(const std::string& subject, const std::string& owner) const;
  // The prefixes below a storage root that `subject` may write: "<subject>" and
  // "projects/<p>" for each project.
  std::vector<std::string> WritablePrefixes(const std::string& subject) const;
  // Where `subject`'s default experiment outputs go, below the storage root: "<subject>".
  static std::string DefaultPrefix(const std::string& subject) { return subject; }

  // OK when `relative` (a path relative to a storage root, normalised lexically here) lies
  // strictly below one of `owner`'s writable prefixes. PERMISSION_DENIED starting with
  // `field` and naming the prefixes otherwise. An empty owner may write anywhere.
  absl::Status CheckWritable(absl::string_view field, const std::string& relative,
                             const std::string& owner) const;
  // CheckWritable for every output path of a job's engine spec (relative paths; an
  // absolute output path is refused for an owned job: the coordinator cannot tell which
  // storage root it means). Jobs without an engine spec: OK.
  absl::Status CheckJobOutputs(const v1::JobSpec& spec, const std::string& owner) const;

 private:
  std::map<std::string, std::vector<std::string>> projects_of_;  // subject -> projects
  std::map<std::string, std::vector<std::string>> members_;      // project -> subjects
  std::string source_;
};

// True for a name usable as one path component and a subject: [A-Za-z0-9._@-]+, not "."
// or "..".
bool IsPlainName(absl::string_view name);

}  // namespace stemma::coordinator
