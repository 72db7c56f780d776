#!/usr/bin/env bash
# Builds the README's Rust client example as a user would: a new crate whose
# Cargo.toml holds the README's dependency line (the path placeholder
# /path/to/ringlock replaced by this checkout) and whose src/main.rs is the
# README's example. A dependency line that does not resolve (ringlock is not
# on crates.io) or an example that does not compile fails it.
# Offline: the crate's few dependencies come from the local cargo cache (a
# build of this workspace fills it). CARGO_TARGET_DIR is honoured.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
readme="$root/README.md"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The first `ringlock = ...` line of a ```toml block.
dep="$(awk '/^```toml/{t=1; next} /^```/{t=0} t && /^ringlock = /{print; exit}' "$readme")"
if [ -z "$dep" ]; then
    echo "check-readme-client: no 'ringlock = ...' line in a toml block of README.md" >&2
    exit 1
fi
# The Rust block that follows "Rust (`src/main.rs`".
awk '/^Rust \(`src\/main.rs`/{f=1} f && /^```rust/{r=1; next} r && /^```/{exit} r{print}' "$readme" > "$tmp/main.rs"
if [ ! -s "$tmp/main.rs" ]; then
    echo "check-readme-client: no Rust example (src/main.rs) in README.md" >&2
    exit 1
fi
mkdir -p "$tmp/app/src"
mv "$tmp/main.rs" "$tmp/app/src/main.rs"
cat > "$tmp/app/Cargo.toml" <<EOF
[package]
name = "readme-client"
version = "0.0.0"
edition = "2021"

[workspace]

[dependencies]
${dep//\/path\/to\/ringlock/$root}
EOF
echo "check-readme-client: $dep"
# The lock file of this workspace pins the versions the crate resolves to.
cp "$root/Cargo.lock" "$tmp/app/Cargo.lock"
(cd "$tmp/app" && cargo build --offline --quiet)
echo "check-readme-client: ok (the README's dependency line and Rust example build)"
