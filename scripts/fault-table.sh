#!/usr/bin/env bash
# Prints the fault suite's report (one TSV row per scenario) as one table.
report="${1:-target/fault-suite.tsv}"
[ -s "$report" ] || { echo "no fault-suite report at $report" >&2; exit 0; }
{
    printf 'scenario\twritten\tok\tdup\tlost\tphantom\treordered\tverdict\tnote\n'
    sort -t$'\t' -k1,1V "$report"
} | column -t -s$'\t'
