// Entry points of the data subcommands of stemma-engine; engine/main.cc dispatches to them.
// Each returns the process exit code and prints a one-line error naming the file, line or
// field on failure.
#pragma once

namespace stemma::engine {

// stemma-engine tokenize --tokenizer DIR --input FILE... --format text|jsonl [--field text]
//   [--line-docs] --language L --out DIR [--shard-tokens N] [--eos] [--overwrite]
//   (or --spec FILE: stemma.v1.TokenizeSpec, docs/engine/tokenize.md)
// Writes a token dataset (docs/data-format.md) and prints start, output and done events.
int RunTokenize(int argc, char** argv);

// stemma-engine prepare --spec FILE (stemma.v1.PrepareSpec, docs/engine/prepare.md): a prepared
// corpus directory (docs/corpus.md); prints start, progress, output and done events.
int RunPrepare(int argc, char** argv);

}  // namespace stemma::engine
