#!/usr/bin/env bash
# Build the Debian package: target/debian/ironraid_VERSION-1_ARCH.deb.
# Needs cargo-deb (`cargo install --locked cargo-deb`). Extra arguments go to `cargo deb`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ironraid
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
rm -rf "$target_dir/release/generated"
"$target_dir/release/ironraid" generate "$target_dir/release/generated"
cargo deb -p ironraid --no-build "$@"
