# Shared by the CLI test scripts (sourced): the pass/fail counters, one line per check, and the closing summary.
# ok MSG / bad MSG count and print a check; finish NAME prints "NAME: P passed, F failed" and exits 1 on a failure.
fails=0 passes=0
ok() { echo "ok   $1"; passes=$((passes + 1)); }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
finish() {
  echo "$1: $passes passed, $fails failed"
  exit $((fails > 0))
}
