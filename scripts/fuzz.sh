#!/usr/bin/env bash
# fuzz.sh: run every `go test -fuzz` target of the repository, one after
# another (go test fuzzes one target at a time), each for FUZZTIME
# (default 2m). Stops at the first failure; prints a summary either way.
#   FUZZTIME=30s scripts/fuzz.sh          shorter runs
#   FUZZ_ONLY='FuzzLoad|FuzzParse' ...    only targets matching this regexp
#   FUZZ_RACE=0 ...                        without the race detector
# A failing input is saved by go test under PKG/testdata/fuzz/TARGET/ and
# becomes a seed of every later `go test`: commit it with the fix.
set -uo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -Wno-deprecated-declarations}"
FUZZTIME="${FUZZTIME:-2m}"
FUZZ_ONLY="${FUZZ_ONLY:-.*}"
GO="${GO:-go}"
# The race detector is on (issue 8: everything runs under -race); FUZZ_RACE=0
# fuzzes faster without it.
race=(-race)
[ "${FUZZ_RACE:-1}" = 0 ] && race=()

# "pkgdir target" for every func FuzzXxx in a _test.go file.
mapfile -t targets < <(grep -rhoP --include='*_test.go' -H '^func \KFuzz\w+(?=\(f \*testing\.F\))' . \
	| sed -E 's#^\./##; s#/[^/]+_test\.go:# #' | sort -u | grep -E " ($FUZZ_ONLY)$" || true)
if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz.sh: no fuzz targets match FUZZ_ONLY=$FUZZ_ONLY" >&2
	exit 2
fi

echo "fuzz.sh: ${#targets[@]} targets, $FUZZTIME each"
results=()
status=0
for entry in "${targets[@]}"; do
	pkg="./${entry% *}"
	name="${entry#* }"
	# A package of a nested module (test/k8s/cluster) is tested from its
	# module's folder.
	mod=${entry% *}
	while [ "$mod" != . ] && [ ! -f "$mod/go.mod" ]; do mod=$(dirname "$mod"); done
	rel=${entry% *}; rel=${rel#"$mod"}; rel=${rel#/}
	echo "=== $pkg $name"
	start=$(date +%s)
	if (cd "$mod" && "$GO" test "${race[@]}" -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "./$rel"); then
		results+=("PASS  $(($(date +%s) - start))s  $pkg $name")
	else
		results+=("FAIL  $(($(date +%s) - start))s  $pkg $name")
		status=1
		break
	fi
done

echo
echo "fuzz.sh summary (fuzztime $FUZZTIME):"
printf '  %s\n' "${results[@]}"
if [ $status -ne 0 ]; then
	echo "fuzz.sh: FAILED: the failing input is under the package's testdata/fuzz/; rerun it with go test -run '${name}/'" >&2
else
	echo "fuzz.sh: all ${#results[@]} targets passed"
fi
exit $status
