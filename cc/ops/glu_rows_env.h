// The gated-activation row kernel's environment knobs (glu_rows.cuh), read by its launcher on
// every call: each accepts unset, "on" or "off" and rejects anything else, so a misspelt
// benchmark setting fails instead of timing the default.
#pragma once

#include <cstdlib>
#include <string>

#include "cc/common.h"

namespace prism {

// PRISM_GLU_CACHE=off makes every row recompute a (tests compare both paths bitwise on short
// rows; benchmarks time them); unset or "on" caches rows that fit. Anything else is an error.
inline ffi::Error GluCacheAllowed(const std::string& op, bool* allowed) {
  const char* env = std::getenv("PRISM_GLU_CACHE");
  const std::string v = env != nullptr ? env : "";
  PRISM_REQUIRE(v.empty() || v == "on" || v == "off",
                op + ": PRISM_GLU_CACHE must be unset, on or off; got " + v);
  *allowed = v != "off";
  return ffi::Error::Success();
}

// PRISM_GLU_PREFETCH=on turns on pass 1's L2 prefetch (GluRowsKernel); unset or "off" leaves
// it off. Opt-in until an H200 has timed it: it compiles for sm_90a but has not run on a GPU
// (session 35). Anything else is an error.
inline ffi::Error GluPrefetchAllowed(const std::string& op, bool* allowed) {
  const char* env = std::getenv("PRISM_GLU_PREFETCH");
  const std::string v = env != nullptr ? env : "";
  PRISM_REQUIRE(v.empty() || v == "on" || v == "off",
                op + ": PRISM_GLU_PREFETCH must be unset, on or off; got " + v);
  *allowed = v == "on";
  return ffi::Error::Success();
}

// PRISM_GLU_CLUSTER=on splits each row over a cluster of blocks (GluRowsKernel's parts) when
// the rows are too few to give every SM one: the 4K follow-up's 32-token steps run 32 rows
// of F = 21504 on 32 of the H200's 132 SMs (0.66 TB/s, results/e2e_h200_session31/). Unset or
// "off": one block a row. Opt-in until an H200 has run it (session 35: compiled for sm_90a,
// not yet run on a GPU). Anything else is an error.
inline ffi::Error GluClusterAllowed(const std::string& op, bool* allowed) {
  const char* env = std::getenv("PRISM_GLU_CLUSTER");
  const std::string v = env != nullptr ? env : "";
  PRISM_REQUIRE(v.empty() || v == "on" || v == "off",
                op + ": PRISM_GLU_CLUSTER must be unset, on or off; got " + v);
  *allowed = v == "on";
  return ffi::Error::Success();
}

}  // namespace prism
