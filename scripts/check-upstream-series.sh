#!/usr/bin/env bash
# Check the upstream patch series in docs/upstream/series/ against cotainr's
# release named in docs/upstream/series/BASE, as cotainr's own CI would, for
# stock cotainr, for every patch that stands alone ("small:" in BASE) applied
# alone to the release, and for the prefixes of the series that end with the
# last small patch and with each hook patch ("hook:" in BASE):
#  (a) the patches apply (git apply: exact context, no fuzz; every patch of
#      the series applies in order, every small patch alone),
#  (b) cotainr's unit suite (its testpaths, without the singularity, conda
#      and end-to-end markers) fails no test that stock cotainr passes (the
#      failures are re-run alone, up to 3 times: a test that passes then, or
#      is listed in docs/upstream/cotainr-ci/flaky-tests.txt, is counted as
#      flaky),
#  (c) cotainr's pre-commit hooks pass, with its pinned ruff and hooks
#      (docs/upstream/cotainr-ci/),
#  (d) cotainr's Sphinx docs build (apidoc, relnotes, html) with no more
#      warnings than stock (intersphinx left out: it needs the network),
#  (e) cotainr-lumi's tests pass with that cotainr installed: its whole unit
#      suite and the seam guard (tests/e2e/test_seam_guard.py: a real layered
#      build uses no private cotainr name) on the whole series, and on each
#      small patch alone the tests of
#      how it meets cotainr ($seam_tests below: the start-up hook and the
#      shim, the layering, future cotainr releases, the plugin module, stock
#      use); the fallback path on each stock release is
#      scripts/test-cotainr-releases.sh's,
# then prints a table and exits non-zero on any failure. It also prints the
# lines each patch adds to cotainr's source (cotainr/ without cotainr/tests/),
# to its tests and to its docs (doc/), and the source lines of the hook
# patches and of the whole series.
#
# A patch that needs other patches of the series says so in BASE, e.g.
# "0010-needs: 0001 0002"; its row "alone" shows whether it applies alone,
# for information, and the prefix ending with it is checked.
#
# Usage: scripts/check-upstream-series.sh
# Env:   PYTHON              python to make the venvs with (default python3)
#        SERIES_CHECK_LUMI   1 (default): run (e) and count its failures;
#                            report: run (e) without counting; 0: skip (e)
#        SERIES_CHECK_JOBS   cotainr-lumi suites run at once (default 2); the
#                            checks (b)-(d) run on two trees at once
#        KEEP_WORKDIR=1      keep the scratch directory
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)
series=$root/docs/upstream/series
vendored=$root/docs/upstream/cotainr-ci
python=${PYTHON:-python3}
lumi_mode=${SERIES_CHECK_LUMI:-1}
lumi_jobs=${SERIES_CHECK_JOBS:-2}
# cotainr-lumi's tests of how it meets cotainr, run on each small patch alone
seam_tests=(tests/_cotainr tests/test_plugin.py tests/test_stock_users.py)
case $lumi_mode in 0 | 1 | report) ;; *)
    echo "SERIES_CHECK_LUMI must be 0, 1 or report" >&2
    exit 2
    ;;
esac
version=$(sed -n 's/^base-release: *//p' "$series/BASE")
small=" $(sed -n 's/^small: *//p' "$series/BASE") "
read -ra hooks <<<"$(sed -n 's/^hook: *//p' "$series/BASE")"
patches=("$series"/[0-9][0-9][0-9][0-9]-*.patch)
unit_marks="not singularity_integration and not conda_integration and not endtoend"

work=$(mktemp -d "${TMPDIR:-/tmp}/cotainr-series.XXXXXX")
if [ "${KEEP_WORKDIR:-0}" = 1 ]; then
    echo "scratch directory: $work"
else
    trap 'rm -rf "$work"' EXIT
fi
logs=$work/logs
mkdir -p "$work/trees" "$logs" "$work/wheels"
export PIP_DISABLE_PIP_VERSION_CHECK=1
quiet_pip() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
make_venv() { # VENV PIP-INSTALL-ARGS...
    local venv=$1
    shift
    "$python" -m venv "$venv"
    quiet_pip "$venv/bin/python" -m pip install --quiet "$@"
}
pin_of() { # the rev: of REPO in cotainr's pre-commit config, without the "v"
    awk -v repo="$1" '$0 ~ "repo: .*" repo "$" {found = 1}
        found && /rev:/ {sub(/.*rev: *v?/, ""); print; exit}' \
        "$vendored/pre-commit-config.yaml"
}
running() { # how many of the given pids still run
    local pid n=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && n=$((n + 1)); done
    echo "$n"
}
patch_num() { basename "$1" | cut -c1-4; }
patch_file() { echo "$series/$1"-*.patch; }
markdown_table() { # tab-separated rows on stdin ("---": a rule) as a table
    awk -F'\t' '
    { for (i = 1; i <= NF; i++) { cell[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) } }
    END {
        for (r = 1; r <= NR; r++) {
            line = "|"
            for (i = 1; i <= NF; i++) {
                text = cell[r, i]
                if (text == "---") { text = ""; while (length(text) < w[i]) text = text "-" }
                line = line sprintf(" %-" w[i] "s |", text)
            }
            print line
        }
    }'
}

echo "== cotainr $version (sdist) and the tools cotainr's CI pins"
quiet_pip "$python" -m pip download --quiet --no-deps --no-binary :all: \
    -d "$work/dl" "cotainr==$version"
mkdir "$work/stock"
tar -xzf "$work"/dl/cotainr-*.tar.gz -C "$work/stock" --strip-components=1
# A git repository (pre-commit runs on the files git knows), without the
# sdist's PKG-INFO, which is no file of cotainr's repository.
git -C "$work/stock" init --quiet
echo PKG-INFO >>"$work/stock/.git/info/exclude"
git -C "$work/stock" add --all
git -C "$work/stock" -c user.name=check -c user.email=check@localhost \
    commit --quiet --message "cotainr $version (sdist)"

# The venvs, made at the same time: one for cotainr's suite (cotainr itself
# is imported from the tree under test), one for pre-commit, one for Sphinx,
# and one to build wheels: cotainr-lumi's and those of its dependencies (a
# wheelhouse without cotainr, which comes from the tree under test).
setup_pids=()
make_venv "$work/venv-tests" -r "$vendored/requirements-tests.txt" &
setup_pids+=($!)
make_venv "$work/venv-lint" -r "$vendored/requirements-lint.txt" \
    "ruff==$(pin_of astral-sh/ruff-pre-commit)" \
    "pre-commit-hooks==$(pin_of pre-commit/pre-commit-hooks)" &
setup_pids+=($!)
make_venv "$work/venv-docs" -r "$vendored/requirements-docs.txt" &
setup_pids+=($!)
if [ "$lumi_mode" != 0 ]; then
    (
        make_venv "$work/venv-build" hatchling hatch-vcs
        quiet_pip "$work/venv-build/bin/python" -m pip wheel --quiet --no-deps \
            --no-build-isolation -w "$work/wheels" "$root"
        quiet_pip "$work/venv-build/bin/python" -m pip wheel --quiet \
            -w "$work/wheelhouse" "$(echo "$work"/wheels/cotainr_lumi-*.whl)[test]"
        rm -f "$work"/wheelhouse/cotainr-*.whl
    ) &
    setup_pids+=($!)
fi
for pid in "${setup_pids[@]}"; do wait "$pid"; done
lumi_wheel=$(echo "$work"/wheels/cotainr_lumi-*.whl)

# The rows of the table: a name, the patches applied (one a line), whether
# they must apply, whether cotainr's checks (b)-(d) run on it, and which of
# cotainr-lumi's tests run on it (none, "seam" or "all").
rows=(stock)
declare -A row_patches=([stock]="") row_required=([stock]=1) row_checked=([stock]=1)
declare -A row_lumi=([stock]=none)
for patch in "${patches[@]}"; do
    num=$(patch_num "$patch")
    rows+=("$num alone")
    row_patches["$num alone"]=$patch
    row_required["$num alone"]=0
    row_checked["$num alone"]=0
    row_lumi["$num alone"]=none
    if [[ $small == *" $num "* ]]; then
        row_required["$num alone"]=1
        row_checked["$num alone"]=1
        row_lumi["$num alone"]=seam
    fi
done
# The prefixes: up to the last small patch (the fixes together), and up to
# each hook patch; cotainr-lumi's whole suite on the whole series
last_small=$(for n in $small; do echo "$n"; done | sort | tail -n 1)
first=$(patch_num "${patches[0]}")
for end in $(printf '%s\n' "$last_small" "${hooks[@]}" | sort -u); do
    name="$first..$end"
    [ "$end" != "$first" ] || continue
    rows+=("$name")
    row_patches["$name"]=$(for p in "${patches[@]}"; do
        [[ $(patch_num "$p") > $end ]] || echo "$p"
    done)
    row_required["$name"]=1
    row_checked["$name"]=1
    row_lumi["$name"]=none
done
row_lumi["$first..$(patch_num "${patches[-1]}")"]=all
declare -A row_key
for i in "${!rows[@]}"; do row_key[${rows[i]}]=$(printf 'row%02d' "$((i + 1))"); done

# cotainr's unit suite in TREE (or the given tests), results written to
# OUT.{xml,log} and the node ids of the failed and passed tests to
# OUT.{ids,passed}; prints "passed failed".
run_cotainr_suite() {
    local tree=$1 out=$2
    shift 2
    (cd "$tree" && "$work/venv-tests/bin/python" -m pytest -q -p no:cacheprovider \
        -o addopts="--import-mode=importlib" -o junit_family=xunit1 \
        --junitxml="$out.xml" -m "$unit_marks" "$@" >"$out.log" 2>&1) || true
    "$work/venv-tests/bin/python" - "$out" <<'PY'
import sys
import xml.etree.ElementTree as ET

out = sys.argv[1]
passed, failed = [], []
for case in ET.parse(f"{out}.xml").getroot().iter("testcase"):
    # The pytest node id: file::Class::name (the class from the classname)
    module = case.get("file", "").removesuffix(".py").replace("/", ".")
    cls = case.get("classname", "").removeprefix(module).strip(".")
    parts = [case.get("file", "")] + ([cls.replace(".", "::")] if cls else [])
    node = "::".join(parts + [case.get("name")])
    if case.find("failure") is not None or case.find("error") is not None:
        failed.append(node)
    elif case.find("skipped") is None:
        passed.append(node)
for suffix, nodes in (("ids", failed), ("passed", passed)):
    with open(f"{out}.{suffix}", "w") as f:  # sorted as "LC_ALL=C comm" expects
        f.write("".join(f"{node}\n" for node in sorted(set(nodes), key=str.encode)))
print(len(passed), len(failed))
PY
}

# Checks (b)-(d) of the prepared tree KEY, results written to $logs/KEY.*
check_tree() {
    local key=$1 tree=$work/trees/$1 passed failed attempt failed_ids
    # (b) cotainr's unit suite; the failures re-run alone until they pass,
    # at most 3 times, to tell failing tests (KEY.failing) from flaky ones
    read -r passed failed < <(run_cotainr_suite "$tree" "$logs/$key-suite")
    cp "$logs/$key-suite.ids" "$logs/$key.failing"
    for attempt in 1 2 3; do
        [ -s "$logs/$key.failing" ] || break
        mapfile -t failed_ids <"$logs/$key.failing"
        run_cotainr_suite "$tree" "$logs/$key-rerun$attempt" "${failed_ids[@]}" >/dev/null
        LC_ALL=C comm -23 "$logs/$key.failing" "$logs/$key-rerun$attempt.passed" \
            >"$logs/$key.failing.new"
        mv "$logs/$key.failing.new" "$logs/$key.failing"
    done
    grep -vFf <(grep -v '^#' "$vendored/flaky-tests.txt") "$logs/$key.failing" \
        >"$logs/$key.failing.new" || true
    mv "$logs/$key.failing.new" "$logs/$key.failing"
    echo "$passed $failed" >"$logs/$key.suite"

    # (d) the docs, built as "make apidoc relnotes html" does, without
    # intersphinx (it fetches the Python inventory from the network)
    local docs_bin=$work/venv-docs/bin
    if (
        cd "$tree/doc" &&
            "$docs_bin/sphinx-apidoc" --force --separate --no-toc -o api_reference \
                ../cotainr ../cotainr/tests/* &&
            rm api_reference/cotainr.rst &&
            "$docs_bin/python" release_notes/create_release_notes_list.py &&
            extensions=$("$docs_bin/python" -c "import runpy; print(','.join(e for e \
in runpy.run_path('conf.py')['extensions'] if e != 'sphinx.ext.intersphinx'))") &&
            "$docs_bin/sphinx-build" -b html -E -q -w "$logs/$key-sphinx.warnings" \
                -D extensions="$extensions" . _build/html
    ) >"$logs/$key-sphinx.log" 2>&1; then
        grep -cE "WARNING|ERROR|CRITICAL" "$logs/$key-sphinx.warnings" >"$logs/$key.docs" || true
    else
        echo error >"$logs/$key.docs"
    fi

    # (c) cotainr's pre-commit hooks (last: its fixers may change files)
    local lint_rc=0
    (cd "$tree" && PATH="$work/venv-lint/bin:$PATH" PRE_COMMIT_HOME="$work/pre-commit-home" \
        pre-commit run --all-files --color=never \
        --config "$vendored/pre-commit-local.yaml") >"$logs/$key-lint.log" 2>&1 || lint_rc=$?
    echo "$lint_rc $(sed -n 's/^\(.*[^.]\)\.\.*Failed$/\1/p' "$logs/$key-lint.log" |
        paste -sd, -)" >"$logs/$key.lint"
}

# (e) cotainr-lumi's unit suite (WHICH: "all"), or its tests of how it meets
# cotainr ("seam"), with the cotainr wheel of the tree KEY in a venv of its
# own, from the repository root; the result in $logs/KEY.lumi
run_lumi_suite() {
    local key=$1 which=$2 venv=$work/venv-lumi-$1 log=$logs/$1-lumi.log rc=0 summary
    local tests=() marks="not e2e"
    if [ "$which" = all ]; then
        # and the seam guard: a real layered build touches no private or
        # unlisted cotainr name (tests/e2e/test_seam_guard.py, Apptainer)
        marks="not e2e or seam_guard"
    else
        tests=("${seam_tests[@]}")
    fi
    {
        make_venv "$venv" --no-index --find-links "$work/wheelhouse" \
            "$work"/wheels/"$key"/cotainr-*.whl "${lumi_wheel}[test]" &&
            (cd "$root" && CI=true "$venv/bin/python" -m pytest -m "$marks" -q \
                -p no:cacheprovider --basetemp="$work/lumi-tmp-$key" "${tests[@]}")
    } >"$log" 2>&1 || rc=$?
    summary=$(awk '/^=* *[0-9]+ (passed|failed|errors?)|no tests ran/ {last = $0}
        END {print last}' "$log" | tr -d '=' | sed 's/^ *//; s/ in [0-9.]*s.*//')
    echo "$rc ${summary:-no result}" >"$logs/$key.lumi"
}

# (a) Prepare the trees (and the cotainr wheels of those (e) runs on)
check_queue=()
lumi_queue=()
for row in "${rows[@]}"; do
    key=${row_key[$row]}
    tree=$work/trees/$key
    echo "== $row"
    cp -a "$work/stock" "$tree"
    mapfile -t row_list <<<"${row_patches[$row]}"
    for patch in "${row_list[@]}"; do
        [ -n "$patch" ] || continue
        if ! git -C "$tree" apply --whitespace=error-all "$patch" \
            >>"$logs/$key-apply.log" 2>&1; then
            patch_num "$patch" >"$logs/$key.apply-failed"
            break
        fi
    done
    [ ! -f "$logs/$key.apply-failed" ] || continue
    if [ "${row_checked[$row]}" = 0 ]; then # applies: nothing else to check
        rm -rf "$tree"
        continue
    fi
    git -C "$tree" add --all
    check_queue+=("$key")
    if [ "$lumi_mode" != 0 ] && [ "${row_lumi[$row]}" != none ]; then
        quiet_pip "$work/venv-build/bin/python" -m pip wheel --quiet --no-deps \
            --no-build-isolation -w "$work/wheels/$key" "$tree"
        lumi_queue+=("$key ${row_lumi[$row]}")
    fi
done

# (b)-(e) in the background: the cotainr-lumi suites (the longest) as soon as
# possible, $lumi_jobs at a time, and (b)-(d) on two trees at a time (stock
# first and alone: it sets up pre-commit's cache).
echo "== checking ${#check_queue[@]} trees, cotainr-lumi's tests on ${#lumi_queue[@]}"
check_tree "${check_queue[0]}" &
stock_pid=$!
check_pids=("$stock_pid")
check_queue=("${check_queue[@]:1}")
lumi_pids=()
while [ ${#check_queue[@]} -gt 0 ] || [ ${#lumi_queue[@]} -gt 0 ]; do
    if [ ${#lumi_queue[@]} -gt 0 ] && [ "$(running "${lumi_pids[@]}")" -lt "$lumi_jobs" ]; then
        # shellcheck disable=SC2086 # "KEY WHICH"
        run_lumi_suite ${lumi_queue[0]} &
        lumi_pids+=($!)
        lumi_queue=("${lumi_queue[@]:1}")
    elif [ ${#check_queue[@]} -gt 0 ] && [ "$(running "$stock_pid")" = 0 ] &&
        [ "$(running "${check_pids[@]}")" -lt 2 ]; then
        check_tree "${check_queue[0]}" &
        check_pids+=($!)
        check_queue=("${check_queue[@]:1}")
    else
        sleep 1
    fi
done
wait

# The table, each row compared with stock
declare -A res_apply res_suite res_lint res_docs res_lumi
failures=()
read -r _ stock_lint <"$logs/row01.lint"
stock_docs=$(cat "$logs/row01.docs")
lumi_failed=0
for row in "${rows[@]}"; do
    key=${row_key[$row]}
    if [ -f "$logs/$key.apply-failed" ]; then
        if [ "${row_required[$row]}" = 1 ]; then
            res_apply[$row]="NO: $(cat "$logs/$key.apply-failed")"
            failures+=("$row: does not apply:")
            failures+=("$(sed 's/^/    /' "$logs/$key-apply.log")")
        else
            res_apply[$row]="no (needs $(sed -n "s/^${row%% *}-needs: *//p" "$series/BASE"))"
        fi
        continue
    fi
    res_apply[$row]=yes
    [ "${row_checked[$row]}" = 1 ] || continue

    read -r passed failed <"$logs/$key.suite"
    failing=$(wc -l <"$logs/$key.failing")
    flaky=$((failed - failing))
    new_failures=$(LC_ALL=C comm -13 "$logs/row01.failing" "$logs/$key.failing")
    new=$(printf '%s' "$new_failures" | grep -c . || true)
    res_suite[$row]="$((passed + flaky)) passed, $failing failed ($new new)"
    [ "$flaky" = 0 ] || res_suite[$row]+=", $flaky flaky"
    if [ "$new" != 0 ]; then
        failures+=("$row: cotainr's suite fails tests that pass on stock:")
        failures+=("$(printf '%s\n' "$new_failures" | sed 's/^/    /')")
    fi

    read -r lint_rc failed_hooks <"$logs/$key.lint"
    if [ "$lint_rc" = 0 ]; then
        res_lint[$row]=ok
    elif [ "$row" = stock ] || [ "$failed_hooks" = "$stock_lint" ]; then
        res_lint[$row]="as stock: $failed_hooks"
    else
        res_lint[$row]="FAILED: $failed_hooks"
        failures+=("$row: pre-commit hooks fail (on stock: ${stock_lint:-none}):")
        failures+=("$(sed -E '/\.(Passed|Skipped)$/d; s/^/    /' "$logs/$key-lint.log")")
    fi

    docs=$(cat "$logs/$key.docs")
    if [ "$docs" = error ] || [ "$stock_docs" = error ]; then
        res_docs[$row]="BUILD FAILED"
        failures+=("$row: the Sphinx build failed:")
        failures+=("$(tail -n 20 "$logs/$key-sphinx.log" | sed 's/^/    /')")
    elif [ "$row" = stock ]; then
        res_docs[$row]="$docs"
    else
        res_docs[$row]="$docs ($((docs - stock_docs)) vs stock)"
        if [ "$docs" -gt "$stock_docs" ]; then
            failures+=("$row: $((docs - stock_docs)) more Sphinx warnings than stock:")
            failures+=("$(sed 's/^/    /' "$logs/$key-sphinx.warnings")")
        fi
    fi

    if [ "$lumi_mode" = 0 ]; then
        res_lumi[$row]="skipped"
    elif [ -f "$logs/$key.lumi" ]; then
        read -r lumi_rc summary <"$logs/$key.lumi"
        res_lumi[$row]=$summary
        if [ "$lumi_rc" != 0 ]; then
            lumi_failed=$((lumi_failed + 1))
            res_lumi[$row]="FAILED: $summary"
            if [ "$lumi_mode" = 1 ]; then
                failures+=("$row: cotainr-lumi's unit tests fail:")
                # the failed tests (at most 40), or the end of the log
                lumi_errors=$(sed -nE '/^(FAILED|ERROR) /{s/^/    /;p}' "$logs/$key-lumi.log")
                [ -n "$lumi_errors" ] || lumi_errors=$(tail -n 20 "$logs/$key-lumi.log")
                failures+=("$(printf '%s\n' "$lumi_errors" | sed -n '1,40p')")
            fi
        fi
    fi
done

printf '\ncotainr %s with the series in docs/upstream/series (%s):\n\n' "$version" \
    "$(for p in "${patches[@]}"; do patch_num "$p"; done | paste -sd' ' -)"
{
    printf '%s\t' row applies "cotainr suite" pre-commit "sphinx warnings"
    printf '%s\n' "cotainr-lumi tests"
    printf -- '---\t---\t---\t---\t---\t---\n'
    for row in "${rows[@]}"; do
        printf '%s\t' "$row" "${res_apply[$row]}" "${res_suite[$row]:--}" \
            "${res_lint[$row]:--}" "${res_docs[$row]:--}"
        printf '%s\n' "${res_lumi[$row]:--}"
    done
} | markdown_table

# The lines each patch adds (lines of its hunks starting with "+"), by where
count_added() { # PATCH: prints "SOURCE TESTS DOCS"
    awk '/^diff --git / {file = $3; sub(/^a\//, "", file); hunk = 0; next}
        /^@@ / {hunk = 1; next}
        hunk && /^\+/ {
            if (file ~ /^cotainr\/tests\//) tests++
            else if (file ~ /^cotainr\//) source++
            else if (file ~ /^doc\//) docs++
        }
        END {print source + 0, tests + 0, docs + 0}' "$1"
}
printf '\nLines added to cotainr (source: cotainr/ without cotainr/tests/):\n\n'
{
    printf 'patch\tsource\ttests\tdocs\n---\t---\t---\t---\n'
    total_source=0 total_tests=0 total_docs=0
    for patch in "${patches[@]}"; do
        read -r source tests docs < <(count_added "$patch")
        printf '%s\t%s\t%s\t%s\n' "$(patch_num "$patch")" "$source" "$tests" "$docs"
        total_source=$((total_source + source))
        total_tests=$((total_tests + tests))
        total_docs=$((total_docs + docs))
    done
    printf 'series\t%s\t%s\t%s\n' "$total_source" "$total_tests" "$total_docs"
} | markdown_table
hook_lines=()
hook_total=0
for num in "${hooks[@]}"; do
    read -r source _ < <(count_added "$(patch_file "$num")")
    hook_lines+=("$num $source")
    hook_total=$((hook_total + source))
done
if [ ${#hook_lines[@]} -gt 0 ]; then
    printf '\nSource lines added: the hook patches %s (together %s), the series %s.\n' \
        "$(printf '%s\n' "${hook_lines[@]}" | paste -sd, - | sed 's/,/, /g')" \
        "$hook_total" "$(for patch in "${patches[@]}"; do count_added "$patch"; done |
            awk '{s += $1} END {print s}')"
fi

echo
echo "Failing on stock too (not counted):"
sed 's/^/    /' "$logs/row01.failing"
if [ "$lumi_mode" = report ] && [ "$lumi_failed" != 0 ]; then
    echo "cotainr-lumi's suite fails on $lumi_failed rows (SERIES_CHECK_LUMI=report: not counted)."
fi
echo "wall time: $(($(date +%s) - start)) s"

if [ ${#failures[@]} -gt 0 ]; then
    printf '\nFAIL:\n'
    printf '%s\n' "${failures[@]}"
    exit 1
fi
echo "OK: the series applies to cotainr $version and passes as above"
