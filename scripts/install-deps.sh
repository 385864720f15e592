#!/usr/bin/env bash
# Installs what libkvvm needs to build and test on Debian 12 (run as root). Idempotent: does
# nothing when everything is present.
set -euo pipefail
# libhiredis-dev: the shared store's Redis backend; redis-server: its tests start one;
# redis-tools (redis-cli): test_store_cluster creates a Redis Cluster with it.
# clang + its sanitizer runtimes: scripts/test.sh's clang ASan+UBSan build; clang-tidy: its
# lint of the library (.clang-tidy); python3-*: the Python package's tests; prometheus: its
# promtool (CTest metrics_promtool) and its server (CTest stress_metrics_prometheus starts
# one of its own on 127.0.0.1; the package's service is never used).
pkgs=(build-essential cmake pkg-config liburing-dev libxxhash-dev libcriterion-dev
      libhiredis-dev redis-server redis-tools
      clang libclang-rt-14-dev clang-tidy
      python3 python3-numpy python3-torch python3-pytest python3-venv python3-pip
      prometheus)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: need root (or sudo) to apt-get install: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
