// Entry points of the stemma-engine subcommands. engine/main.cc dispatches
// `stemma-engine <command> ...` to these; each returns the process exit code and prints a
// clear one-line error (naming the file or field) on failure.
#pragma once

namespace stemma::engine {

// stemma-engine init --arch llama|qwen2|gemma3|olmoe --preset tiny --seed S --out DIR
int RunInit(int argc, char** argv);
// stemma-engine logits --model DIR --tokens 1,2,3 [--out FILE]: forward pass, writes the
// logits (f32 safetensors, tensor "logits" [1, T, V]) for numerics tests and debugging.
int RunLogits(int argc, char** argv);

}  // namespace stemma::engine
