// CLI11, as every file of the command includes it.
//
// g++ 12 reports a false "potential null pointer dereference" inside
// std::string as inlined into CLI11's detail::split (CLI/StringTools.hpp).
// The warning is tied to that header's lines, so it is turned off for them
// here rather than per source file: a file with options of its own would
// leave the command's unity build (cli/CMakeLists.txt).
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop
