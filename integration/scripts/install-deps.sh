#!/usr/bin/env bash
# Install what hixl needs to build, test and benchmark, from Debian packages only.
# Idempotent: does nothing when every package is already installed.
set -euo pipefail
pkgs=(build-essential libtsan2 cmake pkg-config clang libclang-rt-14-dev clang-format libcunit1-dev libjson-c-dev libssl-dev
      libibverbs-dev librdmacm-dev ibverbs-providers rdma-core qemu-system-x86 busybox-static kmod cpio perftest tcpdump
      iperf3 ucx-utils iproute2 iptables procps time python3-torch python3-pytest python3-pip python3-venv
      libmicrohttpd-dev prometheus gnuplot-nox jq curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "hixl: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then echo "hixl: run as root to install packages" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
