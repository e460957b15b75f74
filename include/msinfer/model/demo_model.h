// The demo model: a small Mixtral (4 layers, hidden 128, 4 experts top-2, 2.7 M
// parameters) with a 2048-token byte-level BPE tokenizer, both trained on the
// King James Bible by scripts/train-demo-model, committed under
// data/demo-model/ and embedded in the binary when it is built (library
// msinfer_demo_model: only what links it carries the 5.4 MB). It writes
// recognisable English, unlike the random presets, so a newcomer can tell a
// working deployment from a broken one (docs/ENGINE.md, "The demo model").
#pragma once

#include <string>
#include <vector>

#include "msinfer/core/embedded_file.h"
#include "msinfer/core/status.h"

namespace msinfer::model {

// make-model's name for it.
inline constexpr char kDemoPreset[] = "demo";

// The files of data/demo-model as built into this binary: config.json,
// generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json.
std::vector<embedded::File> demo_model_files();

// Writes those files into `out_dir` (created if missing; files of the same
// names are replaced). NOT_FOUND naming the directory or file when it cannot.
Status write_demo_model(const std::string& out_dir);

}  // namespace msinfer::model
