// src/eval/sweep.h — sweeps of policy knobs for the frontier harness (`crisp eval pareto`).
//
// A sweep is a preset and, per knob, a list of values; its points are the cartesian product, each
// a Config (the preset with Config::set applied per knob, so any knob Config::set accepts can be
// swept without code here knowing it):
//
//   "crisp:alpha=0.5,1,2;rho=1.5,2.2"   6 points: crisp with alpha x rho
//   "flexprefill:gamma=0.9,0.95"        2 points
//   "dense"                             1 point (the preset itself)
//
// A sweep file is JSON: a list whose entries are such strings or objects
// {"policy": "crisp", "knobs": {"alpha": [0.5, 1, 2], "rho": [1.5, 2.2]}}.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "crisp/config.h"

namespace crisp {
namespace eval {

struct Sweep {
  std::string policy;  // a preset name
  std::vector<std::pair<std::string, std::vector<std::string>>> knobs;  // in the order given
};

struct FrontierPoint {
  std::string name;    // "crisp:alpha=0.5:rho=1.5" (a policy spec of --policies), or the preset
  std::string policy;  // the preset
  std::vector<std::pair<std::string, std::string>> knobs;
  Config config;       // validated
};

// Parses one --sweep value. Errors throw crisp::Error naming `argument` and quoting the bad part
// (an unknown preset, a knob without '=', an empty value list, a repeated knob, a value
// Config::set rejects).
Sweep parse_sweep(const std::string& text, const std::string& argument = "--sweep");

// Reads a sweep file (see above); errors name `argument` and the entry.
std::vector<Sweep> load_sweep_file(const std::string& path, const std::string& argument = "--sweep-file");

// Every point of every sweep, in order (sweeps in order, the last knob varying fastest), each
// once: a point that repeats an earlier one's name is dropped. Errors (a combination
// Config::validate rejects) name `argument`.
std::vector<FrontierPoint> expand_sweeps(const std::vector<Sweep>& sweeps, const std::string& argument = "--sweep");

}  // namespace eval
}  // namespace crisp
