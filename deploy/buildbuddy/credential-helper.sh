#!/bin/sh
# A credential helper for BuildBuddy (the protocol of Bazel's --credential_helper, which
# dtlto-reapi's --credential-helper speaks): `credential-helper.sh get` reads {"uri": "..."} on
# stdin and prints the API-key header as {"headers": {...}}.
#
# The key comes from $BUILDBUDDY_API_KEY, else from the first line of
# ${XDG_CONFIG_HOME:-~/.config}/buildbuddy/api-key (mode 600). Replace that lookup with your
# secret store (pass, 1Password CLI, a cloud secret manager, ...) as needed.
set -eu
[ "${1:-}" = get ] || { echo "usage: $0 get  (request JSON on stdin)" >&2; exit 2; }
cat >/dev/null # the request: one server only, so its uri is not needed
key=${BUILDBUDDY_API_KEY:-}
file=${XDG_CONFIG_HOME:-$HOME/.config}/buildbuddy/api-key
if [ -z "$key" ] && [ -r "$file" ]; then
    key=$(head -n 1 "$file")
fi
if [ -z "$key" ]; then
    echo "no BuildBuddy API key: set BUILDBUDDY_API_KEY or write it to $file" >&2
    exit 1
fi
case $key in
*[!A-Za-z0-9_-]*) echo "the BuildBuddy API key in use has unexpected characters" >&2; exit 1 ;;
esac
printf '{"headers":{"x-buildbuddy-api-key":["%s"]}}\n' "$key"
