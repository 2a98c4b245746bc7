// The engine's names for the one manifest reader (common/manifest.h): stemma.json, the
// manifest beside every checkpoint and dataset Stemma writes (docs/engine-io.md).
// `overwrite` replaces only a directory whose manifest parses (engine/io/durable.h).
#pragma once

#include "common/manifest.h"

namespace stemma::engine::io {

using ::stemma::manifest::kManifestFormat;
using ::stemma::manifest::kManifestName;
using ::stemma::manifest::kManifestTypeCheckpoint;
using ::stemma::manifest::kManifestTypeDataset;
using ::stemma::manifest::Manifest;
using ::stemma::manifest::ManifestFile;
using ::stemma::manifest::ManifestParent;
using ::stemma::manifest::ManifestProducer;
using ::stemma::manifest::ManifestToJson;
using ::stemma::manifest::ParseManifest;

}  // namespace stemma::engine::io
