#!/usr/bin/env bash
# Installs what rdmalock needs to build, test and run on Debian 12, from Debian's archive only.
# Idempotent: installs only what is missing. Needs root (or sudo).
set -euo pipefail

packages=(
  # build
  build-essential cmake pkg-config clang-format
  # the fuzzers (libFuzzer comes with clang's runtime)
  clang libclang-rt-14-dev
  # the protocol model checker
  spin
  # libraries
  libibverbs-dev librdmacm-dev libspdlog-dev libcli11-dev libyaml-cpp-dev catch2 libxxhash-dev libsodium-dev
  libsystemd-dev libcpp-httplib-dev libssl-dev nlohmann-json3-dev
  # cluster mode: etcd (the tests and the main job start their own, and the service the package
  # starts is stopped below; see docs/operations.md), and
  # openssl to make the certificates of the etcd-over-TLS test
  etcd-server openssl
  # the demo and the docs read lockd's metrics with curl
  curl
  # RDMA runtime and tools (providers include rdma_rxe's userspace part; perftest for baselines)
  systemd
  rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest iproute2
  # the Python module's tests (tests/python, run by ctest and tests/sdk/run.sh), and its offline
  # pip install into a venv (tests/python/pip-install.sh: Debian's setuptools and wheel)
  python3 python3-pytest python3-venv python3-setuptools python3-wheel
  # the alert rules' tests (deploy/monitoring, run by ctest): promtool, which Debian ships only in
  # the prometheus package. Its server is not wanted: when this script installs the package, it
  # stops and disables the service the package starts (an existing Prometheus is left alone)
  prometheus
  # the Soft-RoCE VM (deploy/softroce/rxe-run)
  qemu-system-x86 busybox-static cpio kmod
  # Debian packages (cpack: dpkg-shlibdeps, file) and their test in a clean tree (tests/pkg/run.sh)
  dpkg-dev file debootstrap systemd-container
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Installed here only for promtool: no Prometheus server left running on :9090. The same for etcd,
# which Debian's etcd-server starts on 127.0.0.1:2379 with no authentication: the tests and the
# main job start their own, so none is left running for anyone on this machine to write to. Only
# when this script installed the package (an existing etcd or Prometheus is left alone).
for service in prometheus:prometheus etcd-server:etcd; do
  if printf '%s\n' "${missing[@]}" | grep -qx "${service%%:*}" && [ -d /run/systemd/system ]; then
    $sudo systemctl disable --now "${service##*:}" >/dev/null 2>&1 || true
  fi
done
