#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then a program on the public API (tests/api/embed_example.cpp) built
# against the installed headers and library through pkg-config alone, and run on the bundled model. Exit 77 (CTest
# SKIP_RETURN_CODE) without pkg-config or a C++ compiler.
# Usage: tests/cli/install_prefix.sh BUILD_DIR
set -u
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$root/tests/cli/lib.sh"
cxx=${CXX:-c++}
command -v pkg-config >/dev/null && command -v "$cxx" >/dev/null || { echo "SKIP: pkg-config or $cxx missing"; exit 77; }

if cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1; then
  ok "cmake --install $build --prefix <tmp>"
else
  bad "cmake --install: $(tail -n 5 "$tmp/install.log")"
  finish install_prefix
fi
pc=$(find "$tmp/prefix" -name plumb.pc | head -n 1)
if [ -x "$tmp/prefix/bin/plumb" ] && [ -f "$tmp/prefix/include/plumb/engine.h" ] && [ -n "$pc" ]; then
  ok "installed: bin/plumb, include/plumb/, ${pc#"$tmp/prefix/"}"
else
  bad "installed files: $(cd "$tmp/prefix" && find . -maxdepth 3 | head -n 20 | tr '\n' ' ')"
  finish install_prefix
fi
# The program sees only what the prefix holds: no source tree on its include path.
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs plumb)
if "$cxx" "$root/tests/api/embed_example.cpp" $flags -o "$tmp/example" 2>"$tmp/cxx.log"; then
  ok "built against the installed plumb: $cxx embed_example.cpp \$(pkg-config --cflags --libs plumb)"
else
  bad "building against the installed plumb ($flags): $(tail -n 5 "$tmp/cxx.log")"
  finish install_prefix
fi
"$tmp/example" "$root/models/tiny" >"$tmp/run.out" 2>&1 && grep -q '\[cancelled after 5 tokens\]' "$tmp/run.out" &&
  ok "it runs: $(head -n 1 "$tmp/run.out")" || bad "the installed example: $(cat "$tmp/run.out")"
finish install_prefix
