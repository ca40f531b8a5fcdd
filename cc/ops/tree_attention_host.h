// The CPU handlers' shared host piece of tree attention (prism_tree_attention and
// prism_tree_attention_digits): cutting the step's queries into per-chain blocks. Semantics in
// tree_attention.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cc/ops/tree_attention.h"

namespace prism {

// Blocks of up to block_size non-padding queries of one chain, in step order: (chain, tokens).
inline std::vector<std::pair<int64_t, std::vector<int32_t>>> ChainQueryBlocks(
    const Dims& dm, const Tables& tb, size_t block_size) {
  std::vector<std::vector<int32_t>> per_chain(dm.c);
  for (int64_t t = 0; t < dm.t; ++t) {
    const int64_t c = tb.chain_of[t];
    if (c >= 0 && c < dm.c && tb.positions[t] >= 0) per_chain[c].push_back(static_cast<int32_t>(t));
  }
  std::vector<std::pair<int64_t, std::vector<int32_t>>> blocks;
  for (int64_t c = 0; c < dm.c; ++c) {
    const auto& ts = per_chain[c];
    for (size_t i = 0; i < ts.size(); i += block_size) {
      const size_t e = std::min(ts.size(), i + block_size);
      blocks.push_back({c, std::vector<int32_t>(ts.begin() + i, ts.begin() + e)});
    }
  }
  return blocks;
}

}  // namespace prism
