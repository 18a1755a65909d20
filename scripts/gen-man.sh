#!/bin/sh
# gen-man.sh PETREL_BIN OUT - writes petrel(1), a man page made from the
# help text the binary prints (`petrel --help`, then `petrel COMMAND
# --help` for each command it lists), so the page says what the flags
# tables say and cannot drift from them.  Used by the `man` build target;
# `cmake --install` puts the page in share/man/man1.
set -eu
bin=$1
out=$2
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT

# roff escapes: backslashes first, then a leading dot or quote that roff
# would read as a request
esc() { sed -e 's/\\/\\e/g' -e 's/^\([.'"'"']\)/\\\&\1/' -e 's/-/\\-/g'; }

version=$("$bin" --version | head -n 1)
commands=$("$bin" --help | sed -n '/^commands:/,/^$/p' | awk 'NF && $1 != "commands:" {print $1}')
{
    printf '.TH PETREL 1 "" "%s" "User Commands"\n' "$version"
    printf '.SH NAME\npetrel \\- LLM inference engine and OpenAI\\-compatible server\n'
    printf '.SH SYNOPSIS\n.B petrel\n.I COMMAND\n[\\fIoptions\\fR]\n'
    printf '.SH DESCRIPTION\n.nf\n'
    "$bin" --help | esc
    printf '.fi\n.SH COMMANDS\n'
    for c in $commands; do
        [ "$c" = version ] && continue
        printf '.SS petrel %s\n.nf\n' "$c"
        "$bin" "$c" --help | esc
        printf '.fi\n'
    done
    printf '.SH VERSION\n.nf\n'
    "$bin" --version | esc
    printf '.fi\n.SH SEE ALSO\nThe docs/ folder of the source tree: server.md, api.md, architecture.md.\n'
} >"$tmp"
mv "$tmp" "$out"
trap - EXIT
